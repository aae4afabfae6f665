"""What a database driver's exception means to a caller, decided by its error code, never its message text.

SQLite gives every error an extended result code (``sqlite3.Error.sqlite_errorcode``, e.g.
``SQLITE_IOERR_WRITE``); its low byte is the primary code (``SQLITE_IOERR``), which picks the package error
in :data:`SQLITE_ERRORS`. Peewee re-raises sqlite3's errors as its own classes, keeping the original as
``__context__`` and first argument; :func:`sqlite_error` finds it there.

PostgreSQL's errors (psycopg 3, found the same way, by duck type so this module imports no driver) are
classified by SQLSTATE in :data:`POSTGRES_ERRORS`, then by its two-character class in
:data:`POSTGRES_CLASSES`; constraint violations are named by ``diag.constraint_name``.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import sqlite3
from collections.abc import Callable
from types import TracebackType
from typing import Any

import peewee

from .errors import BatchError, StoreConflict, StoreCorrupt, StoreFull, StoreReadOnly, StoreUnavailable

__all__ = [
    "NOT_NULL",
    "PEEWEE_CLASSES",
    "POSTGRES_CLASSES",
    "POSTGRES_ERRORS",
    "PRIMARY_KEY",
    "SQLITE_ERRORS",
    "Translation",
    "failing_idx",
    "is_busy",
    "postgres_error",
    "sqlite_error",
    "store_error",
    "violated",
]

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

#: SQLite's extended code for a failed write: EFBIG (a file past the process's size limit) is one.
SQLITE_IOERR_WRITE = 778
_FILE_SIZE_LIMIT = (
    StoreFull,
    "a write to {path} would pass this process's file size limit ({sqlite}; `ulimit -f`, RLIMIT_FSIZE): "
    "raise the limit, or free space in the store (evict, sweep, vacuum)",
)


def _past_file_size_limit(path: str) -> bool:
    """Whether a file-size limit is set and the store file or its WAL is within a page group of it: a
    write there fails with EFBIG, which SQLite reports as a plain write error."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return False
    for name in (path, path + "-wal"):
        with contextlib.suppress(OSError):
            if os.path.getsize(name) + 2**16 >= limit:
                return True
    return False


#: Any other driver error: a file changed by another program, or a bug.
_OTHER = (StoreUnavailable, "unexpected SQLite error on {path} ({sqlite})")

_UNREACHABLE = (
    "cannot connect to the PostgreSQL server of {path} ({pg}): check that it runs, "
    "and the URL's host, port, database, user and password"
)

#: SQLSTATE -> the package error and its message; ``{path}``, ``{timeout}`` and ``{pg}`` are filled in.
POSTGRES_ERRORS: dict[str, tuple[type[StoreUnavailable], str]] = {
    "53100": (StoreFull, "the server disk holding {path} is full ({pg}): free space and retry"),
    "40P01": (StoreConflict, "a deadlock on {path} persisted through the retries ({pg})"),
    "40001": (StoreConflict, "a serialization failure on {path} persisted through the retries ({pg})"),
    "55P03": (StoreUnavailable, "a row of {path} was locked by another session past {timeout:g} s ({pg})"),
    "25006": (StoreReadOnly, "{path} is read-only ({pg})"),
    "XX001": (StoreCorrupt, "{path} holds damaged data ({pg}): restore it from a backup"),
    "XX002": (StoreCorrupt, "an index of {path} is damaged ({pg}): REINDEX it"),
    "57P01": (StoreUnavailable, "the PostgreSQL server of {path} shut down ({pg}); the next call reconnects"),
    "57P02": (StoreUnavailable, "the PostgreSQL server of {path} crashed ({pg}); the next call reconnects"),
    "57P03": (StoreUnavailable, "the PostgreSQL server of {path} is starting or stopping ({pg}); retry"),
}

#: SQLSTATE class (its first two characters) -> the package error and its message.
POSTGRES_CLASSES: dict[str, tuple[type[StoreUnavailable], str]] = {
    "08": (StoreUnavailable, "the connection to {path} was lost ({pg}); the next call reconnects"),
    "28": (StoreUnavailable, "PostgreSQL refused the login to {path} ({pg}): check the user and password"),
    "3D": (StoreUnavailable, "no such database for {path} ({pg})"),
    "53": (StoreUnavailable, "the PostgreSQL server of {path} ran out of a resource ({pg})"),
    "57": (StoreUnavailable, "the PostgreSQL server of {path} stopped the statement ({pg})"),
    "58": (StoreUnavailable, "I/O error on the PostgreSQL server of {path} ({pg})"),
}

_OTHER_POSTGRES = (StoreUnavailable, "unexpected PostgreSQL error on {path} ({pg})")

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


def postgres_error(exc: BaseException) -> Exception | None:
    """The ``psycopg.Error`` that ``exc`` is or wraps (Peewee's error classes wrap one), else None."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None or isinstance(seen, BatchError):
            return None
        if isinstance(seen, Exception) and type(seen).__module__.partition(".")[0] == "psycopg":
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _sqlstate(error: BaseException) -> str:
    state = getattr(error, "sqlstate", None)
    return state if isinstance(state, str) else ""


def _pg_violated(error: BaseException) -> str | None:
    state = _sqlstate(error)
    if not state.startswith("23"):
        return None
    if state == "23502":
        return NOT_NULL
    name = getattr(getattr(error, "diag", None), "constraint_name", None) or ""
    if state == "23505" and name.endswith("_pkey"):
        return PRIMARY_KEY
    return name or state


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
    pg = postgres_error(exc)
    if pg is not None:
        return _pg_violated(pg)
    code = _code(exc)
    if code is None or code & 0xFF != sqlite3.SQLITE_CONSTRAINT:
        return None
    return _VIOLATIONS.get(code) or str(getattr(sqlite_error(exc), "sqlite_errorname", "SQLITE_CONSTRAINT"))


def failing_idx(exc: BaseException, job_id: str) -> int | None:
    """The idx of the target row of ``job_id`` that a PostgreSQL constraint violation names in its detail
    ("Key (job_id, idx)=(…)", "Failing row contains (…)"), else None. PostgreSQL needs this where SQLite
    does not: psycopg pipelines ``executemany``, so the failing row is not the last row sent."""
    pg = postgres_error(exc)
    detail = getattr(getattr(pg, "diag", None), "message_detail", None)
    if not isinstance(detail, str):
        return None
    for prefix in (f"Key (job_id, idx)=({job_id}, ", f"Failing row contains ({job_id}, "):
        if detail.startswith(prefix):
            digits = re.match(r"\d+", detail[len(prefix) :])
            return int(digits.group()) if digits else None
    return None


def store_error(
    exc: BaseException,
    *,
    path: str,
    timeout: float,
    constraints: bool = True,
    connecting: bool = False,
    hidden: tuple[str, ...] = (),
) -> StoreUnavailable | None:
    """The package error for a driver exception, with the ``sqlite3.Error`` as its ``__cause__``; None
    when ``exc`` is no driver exception (or is a constraint violation and ``constraints`` is false: the
    rule that ran the statement names the field at fault). ``connecting``: ``exc`` came from opening a
    PostgreSQL connection, not from using one (a driver error without SQLSTATE then means it could not
    connect, rather than that a connection was lost). ``hidden``: secrets (passwords) never to show."""
    pg = postgres_error(exc)
    if pg is not None:
        return _postgres_store_error(
            pg, path=path, timeout=timeout, constraints=constraints, connecting=connecting, hidden=hidden
        )
    error = sqlite_error(exc)
    if error is None or (not constraints and violated(error) is not None):
        return None
    code = _code(error)
    cls, message = SQLITE_ERRORS.get(-1 if code is None else code & 0xFF, _OTHER)
    if code == SQLITE_IOERR_WRITE and _past_file_size_limit(path):
        cls, message = _FILE_SIZE_LIMIT
    sqlite = " ".join(str(error).split()) or type(error).__name__
    name = getattr(error, "sqlite_errorname", None)
    if name and name not in sqlite:
        sqlite = f"{name}: {sqlite}"
    store = cls("database: " + message.format(path=repr(path), timeout=timeout, sqlite=sqlite))
    store.path = path
    store.__cause__ = error
    return store


def _postgres_store_error(
    error: Exception,
    *,
    path: str,
    timeout: float,
    constraints: bool,
    connecting: bool,
    hidden: tuple[str, ...],
) -> StoreUnavailable | None:
    if not constraints and _pg_violated(error) is not None:
        return None
    state = _sqlstate(error)
    if state:
        cls, message = POSTGRES_ERRORS.get(state) or POSTGRES_CLASSES.get(state[:2], _OTHER_POSTGRES)
    elif {"OperationalError", "InterfaceError"} & {cls.__name__ for cls in type(error).__mro__}:
        # No SQLSTATE: libpq's or psycopg's own error (a refused login, or ConnectionTimeout, included).
        cls, message = (StoreUnavailable, _UNREACHABLE) if connecting else POSTGRES_CLASSES["08"]
    else:
        cls, message = _OTHER_POSTGRES
    pg = " ".join(str(error).split()) or type(error).__name__
    shows_secret = any(secret in pg for secret in hidden)  # libpq quotes a malformed URL's token
    for secret in hidden:
        pg = pg.replace(secret, "***")
    if state and state not in pg:
        pg = f"{state}: {pg}"
    store = cls("database: " + message.format(path=repr(path), timeout=timeout, pg=pg))
    store.path = path
    if shows_secret:  # the driver's error is left out of the chain a traceback prints
        store.__suppress_context__ = True
    else:
        store.__cause__ = error
    return store


# Peewee's context manager that turns driver errors into peewee.IntegrityError, OperationalError, ...
# Peewee offers no public name for it; the backends' own statements bypass Peewee's execute_sql yet must
# raise the same classes as Peewee's queries do.
_PEEWEE_ERRORS: Any = vars(peewee)["__exception_wrapper__"]


class Translation:
    """A block whose driver errors leave as the package's errors (``raise_store_error`` decides, by code);
    with ``peewee_classes``, those it leaves as they are go out as Peewee's error classes, as Peewee's
    own queries raise them. One object serves every block of a backend: entering it costs no more than
    Peewee's own wrapper, so each statement pays for one ``with`` only."""

    __slots__ = ("_peewee_classes", "_raise_store_error")

    def __init__(self, raise_store_error: Callable[[BaseException], None], *, peewee_classes: bool) -> None:
        self._raise_store_error = raise_store_error
        self._peewee_classes = peewee_classes

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None or not isinstance(exc, Exception):
            return
        if self._peewee_classes:
            try:
                _PEEWEE_ERRORS.__exit__(exc_type, exc, tb)
            except Exception as wrapped:
                self._raise_store_error(wrapped)
                raise
        self._raise_store_error(exc)


def _as_they_are(exc: BaseException) -> None:
    """Raise nothing: the error leaves as Peewee's class for it."""


#: A block whose driver errors leave as Peewee's error classes only (the caller decides what they mean).
PEEWEE_CLASSES = Translation(_as_they_are, peewee_classes=True)
