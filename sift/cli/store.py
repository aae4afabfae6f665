"""Which store file a command uses, and opening it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sift import dcache
from sift.dcache.backends import BUSY_TIMEOUT_S
from sift.dcache.backends import missing_schema as missing_schema_parts

__all__ = [
    "DEFAULT_DB",
    "OPEN_TIMEOUT_S",
    "CommandError",
    "default_db_path",
    "file_sizes",
    "is_postgres",
    "missing_schema",
    "opened",
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
