"""Which store file a command uses, and opening it."""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from sift import dcache
from sift.dcache.backends import missing_schema as missing_schema_parts

__all__ = [
    "DEFAULT_DB",
    "OPEN_TIMEOUT_S",
    "CommandError",
    "default_db_path",
    "file_sizes",
    "is_postgres",
    "new_simulation_store",
    "opened",
    "refuse_store_with_jobs",
]

#: The store used when neither ``--db`` nor ``$SIFT_DB`` names one.
DEFAULT_DB = "sift.db"

#: How long a command waits for another process's write lock before giving up (seconds).
OPEN_TIMEOUT_S = 10.0


class CommandError(Exception):
    """Something the user asked for cannot be done (an unknown job id, say): one line, exit status 1."""


def is_postgres(target: str) -> bool:
    """Whether ``target`` names a PostgreSQL store (``postgresql://`` or ``postgres://``)."""
    return target.startswith(("postgresql://", "postgres://"))


def default_db_path() -> str:
    """``$SIFT_DB`` if set and not empty, else ``./sift.db``."""
    return os.environ.get("SIFT_DB") or DEFAULT_DB


def new_simulation_store() -> str:
    """A path no store has used: ``sim.db`` in a new directory ``sift-simulate-*`` under the system's
    temporary directory (``$TMPDIR``, else ``/tmp``). The file stays after the run, for inspection."""
    return str(Path(tempfile.mkdtemp(prefix="sift-simulate-")) / "sim.db")


#: The tables of a store: a file with any other table is someone else's database.
STORE_TABLES = frozenset({"batch_job", "batch_target", "batch_totals"})


def refuse_store_with_jobs(path: str, source: str) -> None:
    """Raise CommandError if the file at ``path`` (named by ``source``: ``--db`` or ``$SIFT_DB``) holds any
    job, or any table that is not the store's, deciding without writing to it.

    The file is read with a read-only SQLite connection, which sees the jobs committed to its -wal file
    too. A path that is not an existing file (a new store, ``:memory:``) passes.
    """
    if path == ":memory:" or not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    try:
        with closing(sqlite3.connect(uri, uri=True, timeout=OPEN_TIMEOUT_S)) as conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
            tables = {row[0] for row in rows}
            holds_jobs = (
                "batch_job" in tables
                and conn.execute("SELECT EXISTS (SELECT 1 FROM batch_job)").fetchone()[0]
            )
    except sqlite3.DatabaseError as exc:
        raise CommandError(f"path: cannot open {path!r} as a batch store: {exc}") from exc
    if holds_jobs:
        raise CommandError(
            f"{source}: {path} already holds jobs; simulate runs only on a new or empty store, so it never "
            "changes real data (without --db and $SIFT_DB it makes a new file of its own)"
        )
    if foreign := sorted(tables - STORE_TABLES):
        raise CommandError(
            f"{source}: {path} is a database with other tables ({', '.join(foreign)}), not an empty store; "
            "simulate never writes into it (without --db and $SIFT_DB it makes a new file of its own)"
        )


def missing_schema(path: str) -> list[str]:
    """The parts of the store's schema (tables, indexes, triggers) the existing file at ``path`` lacks,
    read without writing to it; ``open_db`` would add them."""
    return missing_schema_parts(path, timeout=OPEN_TIMEOUT_S)


@contextmanager
def opened(path: str, *, readonly: bool = False) -> Iterator[dcache.StoreDatabase]:
    """The store at ``path``, open for the duration of the block: read-only (never created, never written
    to, so a file the user may not write works too), or for writing (created if missing)."""
    database = dcache.open_db(path, timeout=OPEN_TIMEOUT_S, readonly=readonly)
    try:
        yield database
    finally:
        dcache.close_db()


def file_sizes(path: str) -> tuple[int | None, int | None]:
    """The size of the store file and of its write-ahead log (None when there is no such file; both None
    for a PostgreSQL store, whose files are the server's)."""
    if path == ":memory:" or path.startswith("file:") or is_postgres(path):
        return None, None
    sizes: list[int | None] = []
    for candidate in (Path(path), Path(path + "-wal")):
        try:
            sizes.append(candidate.stat().st_size)
        except OSError:
            sizes.append(None)
    return sizes[0], sizes[1]
