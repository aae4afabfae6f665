"""Online backup: a consistent copy of the open store, taken while other threads and processes write.

SQLite's backup API copies the file page by page on a connection of its own, inside one read transaction:
in WAL mode that transaction sees the store as of its start, so the copy is that snapshot, and writers go
on meanwhile (their commits wait in the -wal file until the copy ends). The copy goes to a temporary file
beside the destination and is renamed over it only once complete and on disk, so a backup that is killed
leaves no file at the destination's name, only a ``.<name>.<pid>.sift-backup`` file beside it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import sqlite3
import stat
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from . import files
from .database import db
from .driver_errors import store_error
from .errors import InvalidBatchInput, StoreFull, StoreNotOpen, StoreReadOnly, StoreUnavailable
from .sqlite import SerializedSqliteDatabase

__all__ = ["PAGES_PER_STEP", "TEMP_SUFFIX", "BackupReport", "backup_store"]

#: Pages copied per step of the backup (4 MiB of 4 KiB pages); progress is reported after each.
PAGES_PER_STEP = 1024

#: How the temporary file of a backup under way ends; one left behind by a killed backup can be deleted.
TEMP_SUFFIX = ".sift-backup"


@dataclass(frozen=True)
class BackupReport:
    """What :func:`backup_store` wrote."""

    dest: str
    pages: int
    page_size: int

    @property
    def nbytes(self) -> int:
        return self.pages * self.page_size


def backup_store(
    dest: str | os.PathLike[str],
    *,
    progress: Callable[[int, int], None] | None = None,
    pages_per_step: int = PAGES_PER_STEP,
) -> BackupReport:
    """Copy the open store to ``dest``: the store as it was when the copy started, while other threads
    and processes go on writing. ``dest`` is replaced only once the copy is complete and on disk; a new
    ``dest`` gets mode 0600, an existing one keeps its mode. ``progress(done, total)`` is called with
    pages after each step of ``pages_per_step`` pages.

    Raises ``InvalidBatchInput`` (field ``dest``) for a destination that cannot be a backup, and
    ``StoreUnavailable`` or a subclass (``StoreFull``, ...) when the copy cannot be made; nothing is
    then left at ``dest`` or beside it.
    """
    source = _source_path()
    target = _dest_path(dest, source)
    folder, name = os.path.split(target)
    temp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    if not isinstance(pages_per_step, int) or isinstance(pages_per_step, bool) or pages_per_step < 1:
        raise InvalidBatchInput("pages_per_step", f"must be an int >= 1, got {pages_per_step!r}")
    try:
        _create(temp, target)
        try:
            pages, page_size = _copy(source, temp, progress, pages_per_step)
            _settle(temp, target)
        except BaseException:
            _remove(temp)
            raise
    except sqlite3.Error as exc:
        # Damage is the store's; anything else (a full disk, an I/O error) most likely the copy's.
        error = store_error(exc, path=f"{source} -> {target}", timeout=db.timeout or 0)
        raise error or StoreUnavailable(f"dest: {exc}") from exc
    except OSError as exc:
        raise _os_error(exc, target) from exc
    return BackupReport(dest=target, pages=pages, page_size=page_size)


def _source_path() -> str:
    if db.deferred:
        raise StoreNotOpen("no database is open: call sift.dcache.open_db(path) first")
    if not isinstance(db.backend, SerializedSqliteDatabase):
        raise StoreUnavailable("database: backup_store copies SQLite files; back PostgreSQL up with pg_dump")
    path = str(db.path)  # as given to open_db (db.database is a URI when read-only)
    if path == ":memory:":
        raise StoreUnavailable("database: an in-memory store has no file to back up")
    return os.path.abspath(path)


def _dest_path(dest: str | os.PathLike[str], source: str) -> str:
    try:
        shown = os.fspath(dest)
    except TypeError:
        shown = None
    if not isinstance(shown, str) or not shown:
        raise InvalidBatchInput("dest", f"must be a non-empty str or os.PathLike of str, got {dest!r}")
    target = os.path.abspath(shown)
    if os.path.isdir(target):
        raise InvalidBatchInput("dest", f"{shown!r} is a directory; name the backup file")
    if not os.path.isdir(os.path.dirname(target)):
        raise InvalidBatchInput("dest", f"the directory of {shown!r} does not exist")
    store_files = {source + suffix for suffix in ("", "-wal", "-shm", "-journal", "-lock")}
    if target in store_files or (os.path.exists(target) and os.path.samefile(target, source)):
        raise InvalidBatchInput("dest", f"{shown!r} is the store itself; back it up to another file")
    return target


def _create(temp: str, target: str) -> None:
    """The empty temporary file: 0600, or the mode of the backup it replaces."""
    if not files.create_private(temp):
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, files.PRIVATE_MODE)  # to raise why
        os.close(fd)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        return
    os.chmod(temp, mode)


def _copy(
    source: str, temp: str, progress: Callable[[int, int], None] | None, pages_per_step: int
) -> tuple[int, int]:
    """Copy the store's pages into ``temp`` in steps, all inside one read transaction of the source."""
    uri = f"file:{urllib.parse.quote(source)}?mode=ro"
    src = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=db.timeout or 0)
    try:
        dst = sqlite3.connect(temp, isolation_level=None)
        try:
            dst.execute("PRAGMA journal_mode = OFF")  # the copy is not the store until it is renamed
            dst.execute("PRAGMA synchronous = OFF")  # _settle fsyncs the finished file
            # Without this transaction each step would read the store as it is then, and the backup
            # would start over whenever another connection wrote between two steps.
            src.execute("BEGIN")
            src.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()  # the snapshot starts here
            pages = src.execute("PRAGMA page_count").fetchone()[0]
            page_size = src.execute("PRAGMA page_size").fetchone()[0]

            def report(status: int, remaining: int, total: int) -> None:
                if progress is not None:
                    progress(total - remaining, total)

            src.backup(dst, pages=pages_per_step, progress=report)
            src.execute("COMMIT")
        finally:
            dst.close()
    finally:
        src.close()
    return int(pages), int(page_size)


def _settle(temp: str, target: str) -> None:
    """Put the finished copy on disk, then at ``target``'s name, then make the rename durable."""
    fd = os.open(temp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, target)
    files.fsync_directory(os.path.dirname(target))


def _remove(temp: str) -> None:
    for path in (temp, temp + "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _os_error(exc: OSError, target: str) -> StoreUnavailable:
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFull(f"dest: the disk holding {target!r} is full ({why}): free space and retry")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return StoreReadOnly(f"dest: cannot write {target!r} ({why})")
    return StoreUnavailable(f"dest: cannot write {target!r} ({why})")
