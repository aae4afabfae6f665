"""A new SQLite store file: private to its owner, and set to give space back.

SQLite creates the ``-wal`` and ``-shm`` files with the permissions of the store file itself, so creating
the store file with mode 0600 before SQLite opens it makes all three private, whatever the umask.
``auto_vacuum`` must be chosen before the file's first page is written (the store's own connection writes
it at once, turning on WAL), so a new file gets its header here too (see :mod:`sift.dcache.space`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3

from ...files import create_private

__all__ = ["create_store_file"]


def create_store_file(path: str) -> bool:
    """Create the store file ``path`` if it does not exist: mode 0600, incremental auto-vacuum, WAL.
    Return whether this call created it; an existing file is not touched.

    The header is written to a temporary file that is then hard-linked to ``path``, so the store file
    appears complete: another process opening the same new path at the same moment (web workers starting
    together) finds either no file or this one, never an empty file it would give a header of its own.
    """
    if os.path.lexists(path):
        return False
    folder, name = os.path.split(os.path.abspath(path))
    temp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.sift-new")
    if not create_private(temp):
        return create_private(path)  # the folder refuses the name: let SQLite report why, if it must
    try:
        try:
            conn = sqlite3.connect(temp, isolation_level=None)
            try:
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute("PRAGMA journal_mode = WAL").fetchall()  # writes the header
            finally:
                conn.close()
        except sqlite3.Error:
            return create_private(path)  # a full disk, say: SQLite meets it next and reports it
        try:
            os.link(temp, path)
        except FileExistsError:
            return False  # another process was first: its file is the store
        except OSError:  # a file system without hard links
            return create_private(path)
        return True
    finally:
        for leftover in (temp, temp + "-wal", temp + "-shm", temp + "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
