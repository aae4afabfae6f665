"""Where a SQLite store is: what to hand SQLite for a path given to ``open_db``, refused with the reason
when it cannot be a store file.

The path is resolved once, every symlink followed, and every file beside the store (``-wal``, ``-shm``,
``-journal``, ``-lock``) is named from the resolved path, as SQLite names its own: a store reached through
a symlink and through its real path has one set of files, and one writers' queue.
"""

from __future__ import annotations

import os
import stat
import urllib.parse

from ...errors import StoreMissing, StoreUnavailable

__all__ = ["SQLITE_COMPANIONS", "is_wal_file", "sqlite_url_path", "store_target"]

#: The files SQLite opens beside a store file, named by appending these to its resolved path.
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def store_target(path: str | os.PathLike[str], readonly: bool, create: bool = True) -> tuple[str, str, str]:
    """What to hand SQLite for ``path`` (its resolved path, or a ``mode=ro`` URI of it when read-only), the
    path to show, and the resolved path (``:memory:`` for a private store). A path that cannot be a store
    file is refused with the reason: a dangling symlink, or a companion file SQLite would follow through a
    symlink or that is not a regular file; so is a missing file when read-only or not ``create``
    (StoreMissing)."""
    shown = os.fspath(path)
    if not isinstance(shown, str):
        raise StoreUnavailable.of_target(f"must be a str or os.PathLike of str, got {type(path).__name__}")
    if not shown:
        raise StoreUnavailable.of_target(
            "is empty; give the store file's path, or ':memory:' for a private one"
        )
    if shown == ":memory:":
        if not create and not readonly:
            raise StoreMissing.of_target("':memory:' is always a new store, which create=False refuses")
        if readonly:
            raise StoreUnavailable.of_target("a read-only store must be a file, not ':memory:'")
        return shown, shown, shown
    full = os.path.abspath(shown)
    if os.path.islink(full) and not os.path.exists(full):
        # Left to SQLite, the link's target would be created with the umask's mode, and the -lock file
        # beside the link would not be the one beside the target: two writers' queues for one store.
        raise StoreUnavailable.of_target(
            f"{shown!r} is a symlink to {os.readlink(full)!r}, which does not exist; create the store at "
            "its real path, or point the link at an existing store"
        )
    full = os.path.realpath(full)
    folder = os.path.dirname(full)
    if os.path.isdir(full):
        raise StoreUnavailable.of_target(f"{shown!r} is a directory, not a store file")
    if not os.path.isdir(folder):
        raise StoreUnavailable.of_target(f"the directory {folder!r} of {shown!r} does not exist")
    _refuse_odd_companions(full, shown)
    if not os.path.isfile(full) and (readonly or not create):
        raise StoreMissing.of_target(f"no store at {shown!r}")
    if not readonly:
        return full, shown, full  # absolute: a reconnection or side connection after a chdir finds the file
    uri = f"file:{urllib.parse.quote(full)}?mode=ro"
    if os.access(folder, os.W_OK) or os.path.exists(full + "-shm") or not is_wal_file(full):
        return uri, shown, full
    # SQLite reads a WAL file only with a -shm file beside it, which a folder we cannot write cannot get.
    # On a read-only file system nobody can write the file, so it can be read as it stands ("immutable");
    # elsewhere another user may write it while we read, and SQLite would then read torn pages.
    if not os.statvfs(folder).f_flag & os.ST_RDONLY:
        raise StoreUnavailable.of_target(
            f"{shown!r} is a WAL store in a directory this process cannot write, where SQLite cannot "
            "make the -shm file it needs to read it; read it as a user who can write there, or copy it"
        )
    if os.path.exists(full + "-wal") and os.path.getsize(full + "-wal") > 0:
        raise StoreUnavailable.of_target(
            f"{shown!r} has writes in its -wal file, and its read-only file system cannot hold the "
            "-shm file that reading them needs; copy the file and its -wal file to a writable directory"
        )
    return uri + "&immutable=1", shown, full


def _refuse_odd_companions(full: str, shown: str) -> None:
    """Refuse a ``-wal``, ``-shm`` or ``-journal`` file that is a symlink or not a regular file: SQLite
    writes these files, and gives an empty one the store file's mode, so it must not reach another file
    through them; such a file holds nothing of the store's, and removing it loses nothing."""
    for suffix in SQLITE_COMPANIONS:
        try:
            info = os.lstat(full + suffix)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            why = "a symlink; sift does not follow the store's companion files through symlinks"
        elif not stat.S_ISREG(info.st_mode):
            why = "not a regular file"
        else:
            continue
        raise StoreUnavailable.of_target(
            f"the {suffix} file {full + suffix!r} of {shown!r} is {why}; remove it, then open the store again"
        )


def is_wal_file(path: str) -> bool:
    """Whether the SQLite file at ``path`` is in WAL mode (its header's read and write versions are 2)."""
    with open(path, "rb") as file:
        header = file.read(20)
    return header[18:20] == b"\x02\x02"


def sqlite_url_path(url: str) -> str:
    """The path of a ``sqlite:///path`` URL: ``sqlite:///relative.db``, ``sqlite:////absolute.db``
    (SQLAlchemy's forms), ``sqlite://`` or ``sqlite:///:memory:`` for a private in-memory store."""
    rest = url[len("sqlite://") :]
    if rest in ("", "/:memory:"):
        return ":memory:"
    if not rest.startswith("/"):
        raise StoreUnavailable.of_target(f"{url!r} is not a sqlite:///path URL")
    return rest[1:]
