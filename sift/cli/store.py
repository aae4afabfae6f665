"""Which store file a command uses, and opening it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sift import dcache

__all__ = ["DEFAULT_DB", "CommandError", "OPEN_TIMEOUT_S", "default_db_path", "file_sizes", "opened"]

#: The store used when neither ``--db`` nor ``$SIFT_DB`` names one.
DEFAULT_DB = "sift.db"

#: How long a command waits for another process's write lock before giving up (seconds).
OPEN_TIMEOUT_S = 10.0


class CommandError(Exception):
    """Something the user asked for cannot be done (an unknown job id, say): one line, exit status 1."""


def default_db_path() -> str:
    """``$SIFT_DB`` if set and not empty, else ``./sift.db``."""
    return os.environ.get("SIFT_DB") or DEFAULT_DB


@contextmanager
def opened(path: str) -> Iterator[dcache.SerializedSqliteDatabase]:
    """The store at ``path`` (created if missing), open for the duration of the block."""
    database = dcache.open_db(path, timeout=OPEN_TIMEOUT_S)
    try:
        yield database
    finally:
        dcache.close_db()


def file_sizes(path: str) -> tuple[int | None, int | None]:
    """The size of the store file and of its write-ahead log (None when there is no such file)."""
    if path == ":memory:" or path.startswith("file:"):
        return None, None
    sizes: list[int | None] = []
    for candidate in (Path(path), Path(path + "-wal")):
        try:
            sizes.append(candidate.stat().st_size)
        except OSError:
            sizes.append(None)
    return sizes[0], sizes[1]
