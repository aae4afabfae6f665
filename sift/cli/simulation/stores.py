"""Which store a simulation may use: it never changes a store holding jobs it did not make.

Without ``--db`` or ``$SIFT_DB`` it works on a new file of its own, on PostgreSQL in a new schema of its
own; a named file or schema that holds jobs, or tables that are not the store's, is refused before it is
opened for writing.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
import urllib.parse
from contextlib import closing
from pathlib import Path
from typing import Any

from sift.dcache import tables

from ..store import OPEN_TIMEOUT_S, CommandError, is_postgres

__all__ = [
    "kept_schema_note",
    "new_simulation_store",
    "postgres_simulation_store",
    "refuse_store_with_jobs",
    "shown_store",
]

#: The tables of a store file; on PostgreSQL also its schema's version table. A file or schema with any
#: other table is someone else's database.
POSTGRES_STORE_TABLES = frozenset(tables.STORE_TABLES)
STORE_TABLES = POSTGRES_STORE_TABLES - {tables.VERSION_TABLE}


def new_simulation_store() -> str:
    """A path no store has used: ``sim.db`` in a new directory ``sift-simulate-*`` under the system's
    temporary directory (``$TMPDIR``, else ``/tmp``). The file stays after the run, for inspection."""
    return str(Path(tempfile.mkdtemp(prefix="sift-simulate-")) / "sim.db")


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


def postgres_simulation_store(target: str, source: str) -> tuple[str, str | None]:
    """The PostgreSQL store simulate may use for ``target`` (named by ``source``), and the schema it made.

    Without ``?schema=``, a new schema of its own, ``sift_sim_<UTC time>_<pid>``, created here with a
    plain ``CREATE SCHEMA`` (so it cannot be one that already existed); it is kept after the run. With
    ``?schema=NAME``, as a named SQLite file: used if missing or an empty store, refused (unchanged) if it
    holds jobs or tables that are not the store's. Nothing but that schema is ever written to.
    """
    try:
        import psycopg  # the CLI reaches here only for a postgresql:// target
    except ImportError as exc:  # the postgres extra is not installed: one line, as every other command says
        raise CommandError(
            f"{source}: a PostgreSQL store needs psycopg 3: pip install 'sift[postgres]' ({exc})"
        ) from exc

    from sift.dcache.backends import parse_target

    url, schema = parse_target(target)  # StoreUnavailable ("schema: ...") for a name sift does not use
    query = urllib.parse.parse_qsl(urllib.parse.urlsplit(target).query, keep_blank_values=True)
    named = any(key == "schema" for key, _ in query)
    try:
        with psycopg.connect(url, connect_timeout=int(OPEN_TIMEOUT_S), autocommit=True) as conn:
            if named:
                _refuse_postgres_schema(conn, schema, source)
                return target, None
            stamp = time.strftime("%Y%m%d_%H%M%S", time.gmtime())
            for attempt in range(100):
                name = f"sift_sim_{stamp}_{os.getpid()}" + (f"_{attempt}" if attempt else "")
                try:
                    conn.execute(f'CREATE SCHEMA "{name}"')
                except psycopg.errors.DuplicateSchema:
                    continue
                return f"{target}{'&' if '?' in target else '?'}schema={name}", name
            raise CommandError(f"{source}: could not make a new schema sift_sim_{stamp}_{os.getpid()}_*")
    except psycopg.Error as exc:
        raise CommandError(f"{source}: cannot reach {shown_store(target)}: {exc}") from exc


def _refuse_postgres_schema(conn: Any, schema: str, source: str) -> None:
    rows = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchall()
    tables = {row[0] for row in rows}
    if "batch_job" in tables:
        holds_jobs = conn.execute(f'SELECT EXISTS (SELECT 1 FROM "{schema}".batch_job)').fetchone()[0]
        if holds_jobs:
            raise CommandError(
                f"{source}: schema {schema} already holds jobs; simulate runs only on a new or empty store, "
                "so it never changes real data (without ?schema= it makes a new schema of its own)"
            )
    if foreign := sorted(tables - POSTGRES_STORE_TABLES):
        raise CommandError(
            f"{source}: schema {schema} holds other tables ({', '.join(foreign)}), not an empty store; "
            "simulate never writes into it (without ?schema= it makes a new schema of its own)"
        )


def shown_store(target: str) -> str:
    """The store as the summary names it: a PostgreSQL URL without its password."""
    if not is_postgres(target):
        return target
    from sift.dcache.backends import shown_url

    return shown_url(target)


def kept_schema_note(schema: str | None) -> str:
    """What the summary adds to a PostgreSQL schema simulate made: it is kept, and how to drop it."""
    return f" (kept; to drop it: DROP SCHEMA {schema} CASCADE)" if schema else ""
