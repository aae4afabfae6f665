"""Online backup: a consistent copy of the open store, taken while other threads and processes write.

SQLite's backup API copies the file page by page on a connection of its own, inside one read transaction:
in WAL mode that transaction sees the store as of its start, so the copy is that snapshot, and writers go
on meanwhile (their commits wait in the -wal file until the copy ends). The copy goes to a temporary file
beside the destination and is renamed over it only once complete and on disk, so a backup that is killed
leaves no file at the destination's name, only a ``.<name>.<pid>.sift-backup`` file beside it.

The destination is a regular file or nothing: a device, a FIFO, a socket or a directory is refused, as is
the store itself or any file beside it, compared by device and inode after every symlink is resolved (a
symlink to a regular file is written through, as ``cp`` does). A ``-wal``, ``-shm`` or ``-journal`` file
left beside the destination by an earlier store there is removed before the rename, so that what the
backup wrote is what the next open reads.

A PostgreSQL store is backed up to the same thing: a SQLite store file, written from one REPEATABLE READ
READ ONLY snapshot of the store's schema (so the copy is consistent while others write, and blocks no one).
Jobs are copied in insertion order (``seq``), so the copy's ``_rowid_`` keeps the newest-wins tiebreak, and
``options`` as the text stored; the copy's byte total is recomputed from its jobs. It opens with
``open_db(dest)``: that is also how a store's data moves from PostgreSQL to SQLite.

:func:`~sift.dcache.restore.restore_store` is the way back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import sqlite3
import stat
from collections.abc import Callable

from . import files
from .backends import SQLITE_FILE_SCHEMA, SQLITE_RECOMPUTE_TOTAL
from .database import db
from .driver_errors import store_error
from .errors import (
    InvalidBatchInput,
    StoreFull,
    StoreNotOpen,
    StoreReadOnly,
    StoreUnavailable,
)
from .reports import BackupReport

__all__ = [
    "COPIED_PAGES_PER_STEP",
    "ROWS_PER_STEP",
    "TEMP_SUFFIX",
    "backup_store",
]

#: Pages copied per step of the backup (4 MiB of 4 KiB pages); progress is reported after each.
COPIED_PAGES_PER_STEP = 1024

#: Rows read and written per step of a PostgreSQL store's backup; progress is reported after each.
ROWS_PER_STEP = 2000

#: How the temporary file of a backup under way ends; one left behind by a killed backup can be deleted.
TEMP_SUFFIX = ".sift-backup"


def backup_store(
    dest: str | os.PathLike[str],
    *,
    progress: Callable[[int, int], None] | None = None,
    pages_per_step: int = COPIED_PAGES_PER_STEP,
) -> BackupReport:
    """Copy the open store to ``dest``: the store as it was when the copy started, while other threads
    and processes go on writing. ``dest`` is replaced only once the copy is complete and on disk; a new
    ``dest`` gets mode 0600, an existing regular file keeps its mode. ``progress(done, total)`` is called
    with pages after each step of ``pages_per_step`` pages. A PostgreSQL store is copied to a SQLite store
    file from one snapshot; ``progress`` then counts rows (jobs and targets), :data:`ROWS_PER_STEP` a step.

    Raises ``InvalidBatchInput`` (field ``dest``) for a destination that cannot be a backup (not a regular
    file, the store or a file beside it), and ``StoreUnavailable`` or a subclass (``StoreFull``, ...) when
    the copy cannot be made; nothing is then left at ``dest`` or beside it.
    """
    source = _source_path()
    target, kept_mode = _dest_path(dest, source)
    stale = _stale_beside(dest, target, source)
    folder, name = os.path.split(target)
    temp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    if not isinstance(pages_per_step, int) or isinstance(pages_per_step, bool) or pages_per_step < 1:
        raise InvalidBatchInput("pages_per_step", f"must be an int >= 1, got {pages_per_step!r}")
    by_rows = source is None
    source = source or str(db.path)
    try:
        _create(temp, kept_mode)
        try:
            if by_rows:
                pages, page_size = _write_rows(temp, progress)
            else:
                pages, page_size = db.backend.copy_into(temp, progress, pages_per_step=pages_per_step)
            _settle(temp, target, stale)
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


def _write_rows(temp: str, progress: Callable[[int, int], None] | None) -> tuple[int, int]:
    """Make ``temp`` a new SQLite store file holding the open store's rows, as the backend copies them (a
    store that is no file); return its pages and page size."""
    dst = sqlite3.connect(temp, isolation_level=None)
    try:
        dst.execute("PRAGMA auto_vacuum = INCREMENTAL")  # as a store sift creates (before the first page)
        dst.execute("PRAGMA journal_mode = OFF")  # the copy is not the store until it is renamed
        dst.execute("PRAGMA synchronous = OFF")  # the backup fsyncs the finished file
        for statement in SQLITE_FILE_SCHEMA:
            dst.execute(statement)
        dst.execute("BEGIN")
        db.backend.copy_rows_into(dst, progress, rows_per_step=ROWS_PER_STEP)
        dst.execute(SQLITE_RECOMPUTE_TOTAL)
        dst.execute("COMMIT")
        dst.execute("PRAGMA journal_mode = WAL").fetchall()  # as the store file itself
        pages = dst.execute("PRAGMA page_count").fetchone()[0]
        page_size = dst.execute("PRAGMA page_size").fetchone()[0]
    finally:
        dst.close()
    return int(pages), int(page_size)


def _source_path() -> str | None:
    """The store file's absolute path; None for a PostgreSQL store."""
    if db.deferred:
        raise StoreNotOpen("no database is open: call sift.dcache.open_db(path) first")
    return db.backend.backup_source()


#: The files SQLite keeps beside a store file; ``-lock`` is the writers' queue's.
_COMPANIONS = ("-wal", "-shm", "-journal")
_STORE_FILES = ("", *_COMPANIONS, "-lock")


def _dest_path(dest: str | os.PathLike[str], source: str | None) -> tuple[str, int]:
    """The resolved path to write the backup to, and the mode to give it: 0600, or the mode of the
    regular file it replaces. Refuses a destination that is not a regular file (a dangling symlink
    included), or is the store ``source`` or a file beside it, by device and inode."""
    shown, given = files.path_argument("dest", dest)
    if os.path.islink(given) and not os.path.exists(given):
        raise InvalidBatchInput("dest", f"{shown!r} is a symlink to nothing ({os.readlink(given)!r})")
    target = os.path.realpath(given)
    if os.path.isdir(target):
        raise InvalidBatchInput("dest", f"{shown!r} is a directory; name the backup file")
    if not os.path.isdir(os.path.dirname(target)):
        raise InvalidBatchInput("dest", f"the directory of {shown!r} does not exist")
    found = _stat(target)
    if found is not None and not stat.S_ISREG(found.st_mode):
        raise InvalidBatchInput(
            "dest", f"{shown!r} is {_kind(found)}, not a regular file; a backup replaces only a regular file"
        )
    if source is not None and any(_same_file(target, found, source + end) for end in _STORE_FILES):
        raise InvalidBatchInput("dest", f"{shown!r} is the store itself; back it up to another file")
    # Permission bits only: a set-user-ID bit of what stood there has no meaning on a store file.
    return target, files.PRIVATE_MODE if found is None else stat.S_IMODE(found.st_mode) & 0o777


def _stale_beside(dest: str | os.PathLike[str], target: str, source: str | None) -> list[str]:
    """The ``-wal``, ``-shm`` and ``-journal`` files an earlier store at ``target`` left beside it, which
    the next open of the backup would replay onto it: to be removed just before the rename. Refuses one
    that is not a regular file or a symlink (removing a symlink leaves what it points to), or that is one
    of the store's own files."""
    stale = []
    for end in _COMPANIONS:
        path = target + end
        found = _stat(path, follow=False)
        if found is None:
            continue
        if not (stat.S_ISREG(found.st_mode) or stat.S_ISLNK(found.st_mode)):
            raise InvalidBatchInput(
                "dest", f"{path!r}, left beside {os.fspath(dest)!r}, is {_kind(found)}; remove it first"
            )
        followed = _stat(path)
        if source is not None and any(_same_file(path, followed, source + own) for own in _STORE_FILES):
            raise InvalidBatchInput(
                "dest", f"{path!r}, beside {os.fspath(dest)!r}, is one of the store's own files"
            )
        stale.append(path)
    return stale


def _stat(path: str, *, follow: bool = True) -> os.stat_result | None:
    try:
        return os.stat(path, follow_symlinks=follow)
    except OSError:  # absent, or not ours to see: what cannot be seen is compared by name, then written
        return None


def _same_file(path: str, found: os.stat_result | None, other: str) -> bool:
    """Whether ``path`` (resolved; ``found`` its stat, None if absent) is the file ``other`` or would be
    once created: the same inode, or the same name in the same directory (by inode), however reached."""
    if found is not None:
        known = _stat(other)
        if known is not None and (known.st_dev, known.st_ino) == (found.st_dev, found.st_ino):
            return True
    if os.path.basename(path) != os.path.basename(other):
        return False
    here, there = _stat(os.path.dirname(path)), _stat(os.path.dirname(os.path.realpath(other)))
    if here is None or there is None:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _kind(info: os.stat_result) -> str:
    mode = info.st_mode
    for test, name in (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _create(temp: str, mode: int) -> None:
    """The empty temporary file, with ``mode``."""
    if not files.create_private(temp):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(temp, flags, files.PRIVATE_MODE)  # to raise why
        os.close(fd)
    if mode != files.PRIVATE_MODE:
        fd = os.open(temp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


def _settle(temp: str, target: str, stale: list[str]) -> None:
    """Put the finished copy on disk, remove what an earlier store left beside ``target``, then put the
    copy at ``target``'s name, and make it durable."""
    fd = os.open(temp, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    # Removed only now, the copy complete: a backup that fails earlier leaves the old DEST whole. The -wal
    # goes first: a -shm left without it (a removal failing half-way) is rebuilt, never replayed.
    for path in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    os.replace(temp, target)
    files.fsync_directory(os.path.dirname(target))


def _remove(temp: str) -> None:
    for path in (temp, temp + "-journal", temp + "-wal", temp + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _os_error(exc: OSError, target: str) -> StoreUnavailable:
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFull(f"dest: the disk holding {target!r} is full ({why}): free space and retry")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return StoreReadOnly(f"dest: cannot write {target!r} ({why})")
    return StoreUnavailable(f"dest: cannot write {target!r} ({why})")
