"""What a database driver's exception means to a caller, decided by its error code, never its message text.

SQLite gives every error an extended result code (``sqlite3.Error.sqlite_errorcode``, e.g.
``SQLITE_IOERR_WRITE``); its low byte is the primary code (``SQLITE_IOERR``), which picks the package error
in :data:`SQLITE_ERRORS`. Peewee re-raises sqlite3's errors as its own classes, keeping the original as
``__context__`` and first argument; :func:`sqlite_error` finds it there.

A PostgreSQL backend would add a table beside :data:`SQLITE_ERRORS`, keyed by SQLSTATE (``53100`` disk full,
``XX001`` data corrupted, class ``08`` connection lost, ``57P01`` admin shutdown), and name constraints by
``diag.constraint_name`` in :func:`violated`'s place.
"""

from __future__ import annotations

import sqlite3

from .errors import BatchError, StoreCorrupt, StoreFull, StoreReadOnly, StoreUnavailable

__all__ = ["NOT_NULL", "PRIMARY_KEY", "SQLITE_ERRORS", "is_busy", "sqlite_error", "store_error", "violated"]

#: What a constraint violation broke, as :func:`violated` names it.
PRIMARY_KEY = "primary key"
NOT_NULL = "not null"

_LOCKED = "locked by another process for over {timeout:g} s"

#: Primary result code -> the package error and its message: what happened, then what to do.
#: ``{path}``, ``{timeout}`` and ``{sqlite}`` (SQLite's own message) are filled in.
SQLITE_ERRORS: dict[int, tuple[type[StoreUnavailable], str]] = {
    sqlite3.SQLITE_FULL: (
        StoreFull,
        "the disk holding {path} is full ({sqlite}): free space on that file system and retry",
    ),
    sqlite3.SQLITE_IOERR: (
        StoreUnavailable,
        "I/O error on {path} ({sqlite}): check the disk and its file system, then retry",
    ),
    sqlite3.SQLITE_CORRUPT: (
        StoreCorrupt,
        "{path} is damaged ({sqlite}): run `sift check --db {path}` to see the damage, "
        "and restore it from a backup",
    ),
    sqlite3.SQLITE_NOTADB: (
        StoreCorrupt,
        "{path} is not a SQLite database, or its header is damaged ({sqlite})",
    ),
    sqlite3.SQLITE_READONLY: (
        StoreReadOnly,
        "{path} can only be read ({sqlite}): writing needs write permission on the file, "
        "its directory and its file system",
    ),
    sqlite3.SQLITE_BUSY: (StoreUnavailable, _LOCKED),
    sqlite3.SQLITE_LOCKED: (StoreUnavailable, _LOCKED),
    sqlite3.SQLITE_CANTOPEN: (StoreUnavailable, "cannot open {path} or its -wal or -shm file ({sqlite})"),
    sqlite3.SQLITE_PERM: (StoreUnavailable, "access to {path} denied ({sqlite})"),
    sqlite3.SQLITE_NOMEM: (StoreUnavailable, "SQLite ran out of memory ({sqlite})"),
}

#: Any other driver error: a file changed by another program, or a bug.
_OTHER = (StoreUnavailable, "unexpected SQLite error on {path} ({sqlite})")

_VIOLATIONS = {
    sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY: PRIMARY_KEY,
    sqlite3.SQLITE_CONSTRAINT_NOTNULL: NOT_NULL,
}


def sqlite_error(exc: BaseException) -> sqlite3.Error | None:
    """The ``sqlite3.Error`` that ``exc`` is or wraps (Peewee's error classes wrap one), else None."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain is short; a cycle must not hang
        if seen is None or isinstance(seen, BatchError):
            return None
        if isinstance(seen, sqlite3.Error):
            return seen
        if seen.args and isinstance(seen.args[0], sqlite3.Error):
            return seen.args[0]
        seen = seen.__cause__ or seen.__context__
    return None


def _code(exc: BaseException) -> int | None:
    """The extended result code of the sqlite3 error ``exc`` is or wraps."""
    code = getattr(sqlite_error(exc), "sqlite_errorcode", None)
    return code if isinstance(code, int) else None


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` means another connection held a lock SQLite needed (past the busy timeout)."""
    code = _code(exc)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def violated(exc: BaseException) -> str | None:
    """What constraint violation ``exc`` is (:data:`PRIMARY_KEY`, :data:`NOT_NULL`, or SQLite's name of
    another one), or None when it is not a constraint violation."""
    code = _code(exc)
    if code is None or code & 0xFF != sqlite3.SQLITE_CONSTRAINT:
        return None
    return _VIOLATIONS.get(code) or str(getattr(sqlite_error(exc), "sqlite_errorname", "SQLITE_CONSTRAINT"))


def store_error(
    exc: BaseException, *, path: str, timeout: float, constraints: bool = True
) -> StoreUnavailable | None:
    """The package error for a driver exception, with the ``sqlite3.Error`` as its ``__cause__``; None
    when ``exc`` is no driver exception (or is a constraint violation and ``constraints`` is false: the
    rule that ran the statement names the field at fault)."""
    error = sqlite_error(exc)
    if error is None or (not constraints and violated(error) is not None):
        return None
    code = _code(error)
    cls, message = SQLITE_ERRORS.get(-1 if code is None else code & 0xFF, _OTHER)
    sqlite = " ".join(str(error).split()) or type(error).__name__
    name = getattr(error, "sqlite_errorname", None)
    if name and name not in sqlite:
        sqlite = f"{name}: {sqlite}"
    store = cls("database: " + message.format(path=repr(path), timeout=timeout, sqlite=sqlite))
    store.__cause__ = error
    return store
