"""The store's files on disk: a store file sift creates is private to its owner, and gives space back.

SQLite creates the ``-wal`` and ``-shm`` files with the permissions of the store file itself, so creating
the store file with mode 0600 before SQLite opens it makes all three private, whatever the umask.
``auto_vacuum`` must be chosen before the file's first page is written (the store's own connection writes
it at once, turning on WAL), so a new file gets its header here too (see :mod:`.space`).
"""

from __future__ import annotations

import os
import sqlite3

__all__ = ["PRIVATE_MODE", "create_private", "create_store_file", "fsync_directory"]

#: The mode of every file sift creates: read and write for the owner only.
PRIVATE_MODE = 0o600


def create_private(path: str) -> bool:
    """Create ``path`` empty with mode 0600 if it does not exist; return whether it was created.

    An existing file keeps its mode. A failure to create is left to SQLite, which opens the file next and
    reports why it cannot.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_MODE)
    except OSError:
        return False
    try:
        os.fchmod(fd, PRIVATE_MODE)  # the umask may have taken bits away from the owner too
    finally:
        os.close(fd)
    return True


def create_store_file(path: str) -> bool:
    """Create the store file ``path`` if it does not exist: mode 0600, incremental auto-vacuum, WAL.
    Return whether it was created; an existing file is not touched."""
    if not create_private(path):
        return False
    try:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            conn.execute("PRAGMA journal_mode = WAL").fetchall()  # writes the header, in one transaction
        finally:
            conn.close()
    except sqlite3.Error:
        pass  # the file stays empty; the store's connection opens it next and reports the failure
    return True


def fsync_directory(path: str) -> None:
    """Make a rename or a new file in the directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
