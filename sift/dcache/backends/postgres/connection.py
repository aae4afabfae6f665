"""PostgreSQL's backend: pooled connections, each held for one call or one transaction; each statement's
errors made the package's.

The byte total is 16 slot rows kept by a trigger, each connection adding to the slot of its backend pid,
so writers do not queue on one row. The class is put together from one layer per concern: connections and
statements (here), the schema (:mod:`.schema`), maintenance (:mod:`.maintenance`) and the rules'
spellings and locks (:mod:`.rules`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from playhouse.pool import MaxConnectionsExceeded
from psycopg.pq import TransactionStatus
from psycopg.types.string import TextLoader

from ...driver_errors import Translation, store_error
from ...errors import StoreNotOpen, StoreUnavailable
from .maintenance import PostgresMaintenance
from .rules import PostgresRules
from .schema import PostgresSchema
from .urls import parse_target, shown_target, url_secrets

__all__ = ["PostgresStore"]

F = TypeVar("F", bound=Callable[..., Any])
_IDLE = TransactionStatus.IDLE


class PostgresStore(PostgresRules, PostgresMaintenance, PostgresSchema):
    """A store in a PostgreSQL schema: a pooled connection for each call or transaction, statements in
    autocommit outside the store's transactions, every transaction READ COMMITTED with the locks described
    above."""

    # playhouse.pool's own state (its _in_use, _connections, _pool_lock, _max_connections, _wait_timeout):
    # the pool has no public way to drop a broken connection, to forget a forked parent's connections, or
    # to close the ones other threads hold, and its limits are shown in the error that says they were hit.
    _in_use: dict[int, Any]
    _connections: list[Any]

    def __init__(
        self, target: str, *, timeout: float, readonly: bool, max_connections: int, create: bool = True
    ) -> None:
        url, self.schema = parse_target(target)
        self.path = shown_target(url, self.schema)
        self._secrets = url_secrets(url)
        self.readonly = readonly
        self.create = create
        self.timeout = timeout
        self._pid = os.getpid()
        self._held = _Held()
        #: Idle connections that were in the pool when another one was found lost (see _is_closed).
        self._suspect: set[int] = set()
        #: Around each statement: driver errors as Peewee's classes, then as the package's.
        self.statement_errors = Translation(self.raise_store_error, peewee_classes=True)
        #: Around Peewee's own execution, BEGIN, COMMIT and ROLLBACK: driver errors as the package's.
        self.read_errors = Translation(self.raise_store_error, peewee_classes=False)
        # Connections a forked child inherited: never used, never closed (closing one would end the
        # parent's session on the shared socket).
        self._inherited: list[Any] = []
        options = f"-c search_path={self.schema} -c lock_timeout={max(1, int(timeout * 1000))}"
        if readonly:
            options += " -c default_transaction_read_only=on"
        super().__init__(
            url,
            max_connections=max_connections,
            timeout=max(1, math.ceil(timeout)),  # whole seconds: the pool reads 0 as "wait for ever"
            prefer_psycopg3=True,
            autoconnect=True,
            connect_timeout=max(1, math.ceil(timeout)),
            options=options,
        )
        this = weakref.ref(self)

        def after_fork() -> None:
            database = this()
            if database is not None:
                database._after_fork()

        os.register_at_fork(after_in_child=after_fork)

    def __repr__(self) -> str:
        state = "closed" if self.deferred else "open"
        return f"<{type(self).__name__} {self.path!r}: {state}{', read-only' if self.readonly else ''}>"

    # -- Connections ----------------------------------------------------------------------------------
    #
    # A thread has a connection of the pool only while something needs it: one statement outside a
    # transaction (its rows are on the client once it returns: psycopg's cursors fetch the whole result),
    # one transaction (atomic(), with db:, a session, the store's own), a connection_context() block, or
    # db.connect() up to db.close(). Then it goes back, so max_connections bounds the connections in use,
    # not the threads that exist; and the pool's connections live on, each keeping its prepared statements.

    def _connect(self) -> Any:  # Peewee's hook for a new connection (its only one for driver options)
        conn = super()._connect()
        conn.adapters.register_loader("json", TextLoader)  # options read back as the text stored
        return conn

    def _is_closed(self, conn: Any) -> bool:  # the pool's test of an idle connection before handing it out
        """Known closed or broken; a connection idle while another one was found lost is asked the server
        (the rest go out without a round trip: a lost one fails its call, which drops it)."""
        if conn.closed or conn.broken:
            return True
        if id(conn) in self._suspect:
            self._suspect.discard(id(conn))
            return bool(super()._is_closed(conn))
        return False

    def _take(self) -> None:
        """Check out a connection of the pool for this thread, waiting up to ``timeout`` for one."""
        if self.deferred:
            raise StoreNotOpen("no database is open: call sift.dcache.open_db(target) first")
        try:
            super().connect()
        except MaxConnectionsExceeded as exc:
            raise StoreUnavailable(
                f"database: all {self._max_connections} pooled connections to {self.path!r} stayed in use "
                f"for {self._wait_timeout:g} s, each by a call or a transaction; raise "
                f"open_db(max_connections=) above {self._max_connections} for this process's concurrent "
                "calls, or shorten its transactions"
            ) from exc
        except Exception as exc:
            self.raise_store_error(exc, connecting=True)
            raise

    def usable_connection(self) -> Any:
        """This thread's connection (checked out of the pool if it has none), replacing one that a server
        restart or a network cut broke."""
        state = self._state
        conn = state.conn
        if conn is not None:
            if not (conn.closed or conn.broken) or state.transactions:
                return conn
            self._drop(conn)
        self._take()
        return state.conn

    def give_back(self) -> None:
        """Return this thread's connection to the pool unless something still needs it: a transaction
        (Peewee's, or a BEGIN sent as SQL), a connection_context() block, or db.connect()."""
        state = self._state
        conn = state.conn
        if conn is None or state.transactions or self._held.blocks:
            return
        if conn.closed or conn.broken:
            self._drop(conn)
            return
        if conn.pgconn.transaction_status != _IDLE:
            self._held.watch(self, conn)  # a BEGIN sent as SQL: kept until its COMMIT or ROLLBACK
            return
        self._held.release()
        state.reset()
        self._close(conn)  # the pool's check-in

    def _drop(self, conn: Any) -> None:
        """Forget a lost connection; the pool's idle ones, older, are asked the server before they serve."""
        self._held.release()
        self._state.reset()
        with self._pool_lock:
            self._in_use.pop(self.conn_key(conn), None)
            self._suspect.update(id(idle) for _, _, idle in self._connections)
            self._pool_available.notify()
        with contextlib.suppress(Exception):
            conn.close()

    def connect(self, reuse_if_open: bool = False) -> bool:
        """Peewee's explicit open: this thread keeps a connection of the pool until ``db.close()`` (or
        until it ends); returns False when it already had one (never "Connection already opened")."""
        opened = self._state.conn is None
        self.usable_connection()
        if not self._held.explicit:
            self._held.explicit = True
            self._held.blocks += 1
            self._held.watch(self, self._state.conn)
        return opened

    def close(self) -> bool:
        """End ``db.connect()``'s hold: the connection goes back to the pool (not closed: a request
        hook's close costs no reconnect), at once or when the thread's transaction ends."""
        if self._held.explicit:
            self._held.explicit = False
            self._held.blocks -= 1
        had = self._state.conn is not None
        self.give_back()
        return had and self._state.conn is None

    def connection(self) -> Any:
        """The thread's connection, held as ``db.connect()`` holds it (until ``db.close()``)."""
        self.connect()
        return self._state.conn

    def cursor(self, named_cursor: Any = None) -> Any:
        if self._state.conn is None:
            self.connect()  # a cursor handed out is used after this returns: held as db.connect() holds
        return self._state.conn.cursor()

    def connection_context(self) -> _Block:
        """A block (or decorator) that keeps one connection of the pool for this thread."""
        return _Block(self)

    def hold(self) -> _Block:
        """One connection for the block's statements."""
        return _Block(self)

    def __enter__(self) -> PostgresStore:
        """``with db:``: a transaction on a connection of the pool, given back at its end."""
        ctx = self.atomic()
        ctx.__enter__()
        self._state.ctx.append(ctx)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        ctx = self._state.ctx.pop()
        try:
            ctx.__exit__(exc_type, exc, tb)
        finally:
            self.give_back()

    # Peewee's atomic(), transaction() and sessions call these three: a lost connection is StoreUnavailable
    # there too, BEGIN replaces a connection a server restart broke, and the end of the outermost
    # transaction gives the connection back.

    def begin(self, isolation_level: Any = None) -> None:
        try:
            with self.read_errors:
                conn = self.usable_connection()
                super().begin(isolation_level)
            self._held.watch(self, conn)
        except BaseException:
            self.give_back()
            raise

    def commit(self) -> None:
        try:
            with self.read_errors:
                super().commit()
        finally:
            self.give_back()

    def rollback(self) -> None:
        """ROLLBACK; nothing to send when the connection was lost: the server ended the transaction with the
        session (and the error that lost it is the one the caller sees)."""
        conn = self._state.conn
        try:
            if conn is not None and not (conn.closed or conn.broken):
                with self.read_errors:
                    super().rollback()
        finally:
            self.give_back()

    def _after_fork(self) -> None:
        """In a forked child: keep the parent's connections referenced and unusable, start an empty pool."""
        self._inherited.extend(pc.connection for pc in self._in_use.values())
        self._inherited.extend(conn for _, _, conn in self._connections)
        for conn in self._inherited:
            with contextlib.suppress(Exception):
                # The child's copy of the socket now points at /dev/null, so nothing the child does with
                # it (psycopg's own cleanup at exit included) reaches the parent's session.
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, conn.pgconn.socket)
                os.close(null)
        self._pid = os.getpid()
        self._held = _Held()
        self._suspect = set()
        self.dispose()

    def close_store(self) -> None:
        """Close every pooled connection of this process."""
        if os.getpid() == self._pid:
            with contextlib.suppress(Exception):
                self.close_all_connections()

    def close_all_connections(self) -> None:
        with self._pool_lock:
            conns = [pc.connection for pc in self._in_use.values()] + [c for _, _, c in self._connections]
            self._in_use = {}
            self._connections = []
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()
        self._held.release()
        self._state.reset()

    # -- Statements -------------------------------------------------------------------------------------

    def run_sql(self, sql: str, params: Sequence[Any]) -> Any:
        """Execute on this thread's connection (given back after it outside a transaction); rows are
        fetched by the caller, from the client's copy. A constraint violation is Peewee's IntegrityError;
        any other driver error is the package's StoreUnavailable (or subclass)."""
        try:
            with self.statement_errors:
                cursor = self.usable_connection().cursor()
                cursor.execute(sql, params or None)
                return cursor
        finally:
            self.give_back()

    def fetch_all(self, sql: str, params: Sequence[Any]) -> list[Any]:
        rows: list[Any] = self.run_sql(sql, params).fetchall()
        return rows

    def fetch_one(self, sql: str, params: Sequence[Any]) -> Any:
        return self.run_sql(sql, params).fetchone()

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        try:
            with self.statement_errors:
                cursor = self.usable_connection().cursor()
                cursor.executemany(sql, rows)
                return int(cursor.rowcount)
        finally:
            self.give_back()

    def execute_sql(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        """Peewee's execution (its queries, ``Model.select()`` iterated lazily too): outside a transaction
        the connection goes back once the statement ran, the rows staying on the cursor."""
        try:
            with self.read_errors:
                self.usable_connection()
                return super().execute_sql(sql, params)
        finally:
            self.give_back()

    def errors(self) -> Translation:
        """A block whose driver errors become the package's (see :meth:`raise_store_error`)."""
        return self.read_errors

    def raise_store_error(
        self, exc: BaseException, *, constraints: bool = False, connecting: bool = False
    ) -> None:
        """Raise the package error for the driver exception ``exc`` (see :mod:`.driver_errors`)."""
        error = store_error(
            exc,
            path=self.path or "",
            timeout=self.timeout,
            constraints=constraints,
            connecting=connecting,
            hidden=self._secrets,
        )
        if error is not None:
            raise error


class _Held(threading.local):
    """What keeps a thread's connection out of the pool between statements (per thread)."""

    #: connection_context() blocks, hold() blocks, and db.connect() (counted once) now open.
    blocks = 0
    #: Whether db.connect() holds the connection (until db.close()).
    explicit = False
    #: Gives the connection back if the thread ends while it holds it.
    at_thread_end: weakref.finalize[Any, Any] | None = None
    sentinel: object | None = None

    def watch(self, database: PostgresStore, conn: Any) -> None:
        """Give ``conn`` back to the pool if the thread ends before it does."""
        if self.at_thread_end is None:
            self.sentinel = sentinel = _Sentinel()
            self.at_thread_end = weakref.finalize(
                sentinel, _give_back, weakref.ref(database), conn, os.getpid()
            )

    def release(self) -> None:
        if self.at_thread_end is not None:
            self.at_thread_end.detach()
            self.at_thread_end = self.sentinel = None


class _Sentinel:
    """Lives in a thread's local storage; freed when the thread ends."""


def _give_back(ref: weakref.ref[PostgresStore], conn: Any, pid: int) -> None:
    database = ref()
    if database is None or os.getpid() != pid or database._pid != pid:
        return
    with contextlib.suppress(Exception):
        database._close(conn)  # the pool's: hands a connection of an ended thread back to it


class _Block:
    """``db.connection_context()``: one connection of the pool for the block (or decorated call)."""

    __slots__ = ("database",)

    def __init__(self, database: PostgresStore) -> None:
        self.database = database

    def __enter__(self) -> _Block:
        database = self.database
        conn = database.usable_connection()
        database._held.blocks += 1
        database._held.watch(database, conn)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.database._held.blocks -= 1
        self.database.give_back()

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]
