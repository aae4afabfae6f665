"""Which store file a command uses, and opening it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from sift import dcache
from sift.dcache.backends import BUSY_TIMEOUT_S, parse_target, shown_url, sqlite_path
from sift.dcache.backends import missing_schema as missing_schema_parts

__all__ = [
    "DEFAULT_DB",
    "OPEN_TIMEOUT_S",
    "CommandError",
    "default_db_path",
    "file_sizes",
    "is_postgres",
    "missing_schema",
    "new_store_remover",
    "no_store",
    "opened",
    "shown_target",
]

#: The store used when neither ``--db`` nor ``$SIFT_DB`` names one.
DEFAULT_DB = "sift.db"

#: How long a command waits for another process's write lock before giving up (seconds): as long as the
#: library itself waits.
OPEN_TIMEOUT_S = BUSY_TIMEOUT_S


class CommandError(Exception):
    """Something the user asked for cannot be done (an unknown job id, say): one line, exit status 1."""


def is_postgres(target: str) -> bool:
    """Whether ``target`` names a PostgreSQL store (``postgresql://`` or ``postgres://``)."""
    return target.startswith(("postgresql://", "postgres://"))


def default_db_path() -> str:
    """``$SIFT_DB`` if set and not empty, else ``./sift.db``."""
    return os.environ.get("SIFT_DB") or DEFAULT_DB


def missing_schema(path: str) -> list[str]:
    """The parts of the store's schema (tables, indexes, triggers) the existing file at ``path`` lacks,
    read without writing to it; ``open_db`` would add them."""
    return missing_schema_parts(path, timeout=OPEN_TIMEOUT_S)


def shown_target(target: str) -> str:
    """The store as messages name it: a PostgreSQL URL without its password."""
    return shown_url(target) if is_postgres(target) else target


def no_store(target: str) -> CommandError:
    """The one-line error for a store that does not exist, and how to make one."""
    return CommandError(f"path: no store at {shown_target(target)!r}; `sift init` creates one")


@contextmanager
def opened(path: str, *, readonly: bool = False, create: bool = False) -> Iterator[dcache.StoreDatabase]:
    """The store at ``path``, open for the duration of the block: read-only (never written to, so a file
    the user may not write works too), or for writing. Only with ``create`` is a missing store created;
    else it is refused with :func:`no_store`'s message, and nothing is left behind."""
    try:
        database = dcache.open_db(path, timeout=OPEN_TIMEOUT_S, readonly=readonly, create=create)
    except dcache.StoreMissing:
        raise no_store(path) from None
    try:
        yield database
    finally:
        dcache.close_db()


def new_store_remover(target: str) -> Callable[[], None]:
    """What removes, once the store is closed, what opening ``target`` for writing creates that is not
    there now: a new SQLite file with its -wal, -shm and -lock files, or a new PostgreSQL schema with
    everything in it. An existing file or schema is never removed (it keeps the empty store made in it)."""
    if is_postgres(target):
        return _new_schema_remover(target)
    path = sqlite_path(target)
    if path == ":memory:" or os.path.lexists(path):
        return lambda: None
    new = [path + suffix for suffix in ("", "-wal", "-shm", "-lock") if not os.path.lexists(path + suffix)]

    def remove() -> None:
        for name in new:
            with suppress(FileNotFoundError):
                os.remove(name)

    return remove


def _new_schema_remover(target: str) -> Callable[[], None]:
    import psycopg  # only for a postgresql:// target: psycopg is sift[postgres]'s

    url, schema = parse_target(target)
    exists = "SELECT EXISTS (SELECT 1 FROM information_schema.schemata WHERE schema_name = %s)"
    try:
        with psycopg.connect(url, connect_timeout=int(OPEN_TIMEOUT_S), autocommit=True) as conn:
            row = conn.execute(exists, (schema,)).fetchone()
    except psycopg.Error:
        return lambda: None  # unreachable now: the open that follows fails too, and creates nothing
    if row is not None and row[0]:
        return lambda: None

    def remove() -> None:
        with psycopg.connect(url, connect_timeout=int(OPEN_TIMEOUT_S), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    return remove


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
