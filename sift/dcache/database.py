"""The store's database as users see it, whatever the backend: ``db``, :func:`open_db` and :func:`close_db`.

What differs per backend lives in that backend (:mod:`.backends`). This module holds only what every
backend shares: the object users bind to, and opening and closing a store.

Why ``db`` is a :class:`peewee.DatabaseProxy` subclass that forwards every entry point. The models and the
users' code (``from sift.dcache import db``, ``with db:``, ``@db.atomic()``, request hooks calling
``db.connect()``/``db.close()``) hold this one object for the life of the process, while ``open_db`` may
open a store on another backend. Peewee's own ``DatabaseProxy`` follows the open backend but builds its
``atomic()``, ``transaction()``, ``manual_commit()`` and ``connection_context()`` objects around the proxy
itself, so they would run Peewee's plain transaction code and skip the SQLite store's lock (the lock that
makes one shared connection safe for many threads). :class:`StoreDatabase` hands each of those, and
``connect``/``close``/``with``/sessions/``execute_sql``/``init``, to the open backend's own method. Binding
the models to a new database at every ``open_db`` instead would leave users' references to ``db`` behind
on the old one.

The rules (:mod:`.manager`) are written once. What they must spell per backend is asked of
:attr:`StoreDatabase.backend` (:class:`Backend`); compiled statements are cached per backend class
(:mod:`.statements`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar, cast

import peewee

from .backends import (
    BUSY_TIMEOUT_S,
    SQLITE,
    Backend,
    ConnectionBlock,
    is_postgres_target,
    open_postgres,
    sqlite_path,
)
from .counters import counters
from .errors import InvalidBatchInput, StoreConflict, StoreUnavailable

__all__ = ["StoreDatabase", "close_db", "db", "open_db", "retried", "run_retried"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class StoreDatabase(peewee.DatabaseProxy):
    """The database the models and users bind to; every call goes to the open store's backend."""

    __slots__ = ("backend",)

    #: The open store's database object (see :mod:`.backends`): ``obj`` under the name the rules use, a plain
    #: attribute so that the hot paths read it at no cost.
    backend: Backend

    def __init__(self) -> None:
        super().__init__()
        self.initialize(SQLITE)

    def initialize(self, obj: Any) -> None:
        object.__setattr__(self, "backend", obj)
        super().initialize(obj)

    def __setattr__(self, name: str, value: Any) -> None:
        # Peewee's Proxy checks the most derived class's __slots__ only, which would refuse its own.
        if name not in ("obj", "_callbacks", "_Model", "backend"):
            raise AttributeError(f"cannot set {name!r} on db; the open store's database is db.backend")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return repr(self.obj)

    def __enter__(self) -> StoreDatabase:
        self.obj.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        return self.obj.__exit__(exc_type, exc, tb)

    def init(self, database: Any, **kwargs: Any) -> None:
        """Peewee's deferred-database idiom: ``db.init(target)`` is ``open_db(target)`` (the schema
        included), and ``db.init(None)`` is ``close_db()``. Only ``timeout`` and ``readonly`` may be given."""
        if database is None:
            close_db()
            self.obj.init(None)  # forgets the store: db is deferred again
            return
        if unknown := sorted(set(kwargs) - {"timeout", "readonly"}):
            raise StoreUnavailable(
                f"{unknown[0]}: the store sets its own connection options; db.init(path) and "
                "open_db(path) take only timeout= and readonly="
            )
        open_db(database, **kwargs)

    def write(self) -> AbstractContextManager[None]:
        """The store's write transaction (see the backend's)."""
        return self.backend.write()

    def connect(self, reuse_if_open: bool = False) -> bool:
        return bool(self.obj.connect(reuse_if_open))

    def close(self) -> bool:
        return bool(self.obj.close())

    def execute_sql(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        return self.obj.execute_sql(sql, params)

    def atomic(self, *args: Any, **kwargs: Any) -> Any:
        return self.obj.atomic(*args, **kwargs)

    def transaction(self, *args: Any, **kwargs: Any) -> Any:
        return self.obj.transaction(*args, **kwargs)

    def manual_commit(self) -> Any:
        return self.obj.manual_commit()

    def savepoint(self) -> Any:
        return self.obj.savepoint()

    def connection(self) -> Any:
        return self.obj.connection()

    def connection_context(self) -> ConnectionBlock:  # type: ignore[override]
        context: ConnectionBlock = self.obj.connection_context()
        return context

    def session_start(self) -> Any:
        return self.obj.session_start()

    def session_commit(self) -> bool:
        return bool(self.obj.session_commit())

    def session_rollback(self) -> bool:
        return bool(self.obj.session_rollback())


#: The store's database. Deferred: importing the package opens nothing; ``open_db`` opens a store.
db = StoreDatabase()


def open_db(
    target: str | os.PathLike[str],
    *,
    timeout: float = BUSY_TIMEOUT_S,
    readonly: bool = False,
    max_connections: int | None = None,
    create: bool = True,
    durable: bool = False,
) -> StoreDatabase:
    """Open (creating if missing) the store at ``target``, closing any store opened before.

    ``target`` is a SQLite file's path (``":memory:"`` gives a private in-memory store), or
    ``sqlite:///path``; or ``postgresql://user@host:5432/dbname`` (also ``postgres://``), where
    ``?schema=NAME`` keeps the store in its own schema (``public`` otherwise) and ``max_connections``
    bounds the pooled connections of this process in use at once (default 20; a thread holds one for
    one call or one transaction).

    Creates what is missing of the schema (recomputing a SQLite file's byte total if it was missing),
    and resets the counters. With ``readonly=True`` the store must exist and hold the whole schema;
    nothing is ever written to it, and every write raises ``StoreReadOnly``. With ``create=False`` the
    store must exist (a SQLite file, or a PostgreSQL schema holding the store's tables; never ``:memory:``):
    a missing one raises ``StoreMissing`` and nothing is created, for a process that must not make a store
    from a mistyped target. ``durable=True`` runs a SQLite store with ``synchronous=FULL``: a commit that
    returned survives a power loss, at the cost of an fsync per commit (a PostgreSQL commit is durable
    already, with the server's ``synchronous_commit`` on). ``readonly``, ``create`` and ``durable`` must be
    bools (``InvalidBatchInput`` naming the one that is not). Raises ``StoreUnavailable``
    for a target that cannot be opened (saying why), one that is not a batch store, or one locked by
    another process past ``timeout`` seconds; ``StoreCorrupt`` for a file that is not a SQLite database
    or is damaged, and ``StoreFull`` when the disk is too full to create the schema.
    """
    for name, flag in (("readonly", readonly), ("create", create), ("durable", durable)):
        if type(flag) is not bool:  # "no" or 0 would be taken as its truth value
            raise InvalidBatchInput(name, f"must be True or False, got {flag!r:.60}")
    text = os.fspath(target) if isinstance(target, (str, os.PathLike)) else target
    if is_postgres_target(text):
        backend = open_postgres(
            text,
            timeout=timeout,
            readonly=readonly,
            max_connections=max_connections,
            release=_use_sqlite,
            create=create,
        )
        db.initialize(backend)
    else:
        if max_connections is not None:
            raise StoreUnavailable("max_connections: only a PostgreSQL store pools connections")
        text = sqlite_path(text)
        _use_sqlite()
        SQLITE.open_store(text, timeout=timeout, readonly=readonly, create=create, durable=durable)
    counters.reset()
    return db


def _use_sqlite() -> None:
    """Close a PostgreSQL store if one is open, and make SQLite's database the backend again."""
    backend = db.obj
    if backend is not SQLITE:
        backend.close_store()
        db.initialize(SQLITE)


def close_db() -> None:
    """Close the store's connection(s), after any other thread's transaction ends (on SQLite). Safe to
    call when nothing is open, and twice."""
    _use_sqlite()
    SQLITE.close_store()


def retried(fn: F) -> F:
    """A rule whose one transaction runs again after a deadlock or a serialization failure (PostgreSQL),
    a bounded number of times; past the bound, or inside a caller's transaction, StoreConflict. The whole
    call runs again: a rule that reads an iterable argument uses :func:`run_retried` instead."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return run_retried(lambda: fn(*args, **kwargs))

    return wrapper  # type: ignore[return-value]


def run_retried(run: Callable[[], T]) -> T:
    """``run()``, one transaction, run again after a deadlock or a serialization failure as :func:`retried`
    says: for a rule that reads its arguments once (an iterator is used up by its first reading), then
    runs only the transaction again."""
    try:
        return run()
    except StoreConflict as conflict:
        return cast(T, db.backend.retry(conflict, run))
