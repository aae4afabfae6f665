"""The PostgreSQL store's pool: when a thread checks a connection out and gives it back.

A thread has a connection of the pool only while something needs it: one statement outside a
transaction (its rows are on the client once it returns: psycopg's cursors fetch the whole result),
one transaction (atomic(), with db:, a session, the store's own), a connection_context() block, or
db.connect() up to db.close(). Then it goes back, so max_connections bounds the connections in use,
not the threads that exist; and the pool's connections live on, each keeping its prepared statements.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from playhouse.pool import MaxConnectionsExceeded, PoolConnection, PooledDatabase
from psycopg.pq import TransactionStatus

from ...errors import StoreNotOpen, StoreUnavailable
from .base import PostgresBase

__all__ = ["PostgresPool", "fresh_holds"]

F = TypeVar("F", bound=Callable[..., Any])
_IDLE = TransactionStatus.IDLE
_log = logging.getLogger("sift.dcache.pool")


class PostgresPool(PostgresBase):
    """Checking out and giving back the thread's connection, and Peewee's connection idioms on top."""

    # playhouse.pool's own state (its _in_use, _connections, _heap_counter, _pool_lock, _pool_available,
    # _max_connections, _wait_timeout): the pool has no public way to drop a broken connection, its
    # connect() and close() cost as much as a short statement's round trip (a checkout per call must not),
    # and its limits are shown in the error that says they were hit.
    _in_use: dict[int, Any]
    _connections: list[Any]
    _heap_counter: int
    _held: _Held
    _suspect: set[int]
    _pid: int

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
        """Check out a connection of the pool for this thread, waiting up to ``timeout`` for one while all
        ``max_connections`` are in use (logged at INFO on ``sift.dcache.pool``, naming the setting)."""
        if self.deferred:
            raise StoreNotOpen("no database is open: call sift.dcache.open_db(target) first")
        deadline = None
        while True:
            try:
                super(PooledDatabase, self).connect()  # one try: the pool's _connect, or its limit
                return
            except MaxConnectionsExceeded as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._wait_timeout
                    _log.info(
                        "all %d pooled connections to %r are in use; waiting up to %g s for one "
                        "(open_db(max_connections=) sets how many)",
                        self._max_connections, self.path, self._wait_timeout,
                    )  # fmt: skip
                if now >= deadline:
                    raise StoreUnavailable(
                        f"database: all {self._max_connections} pooled connections to {self.path!r} stayed "
                        f"in use for {self._wait_timeout:g} s, each by a call or a transaction; raise "
                        f"open_db(max_connections=) above {self._max_connections} for this process's "
                        "concurrent calls, or shorten its transactions"
                    ) from exc
                with self._pool_available:  # no wake-up lost: a connection given back since is seen here
                    if not self._connections and len(self._in_use) >= self._max_connections:
                        self._pool_available.wait(deadline - now)
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
        with self._pool_lock:  # the usual case, without Peewee's connect() around it: the oldest idle one
            if self._connections:
                ts, _, conn = self._connections[0]
                if not (conn.closed or conn.broken or id(conn) in self._suspect):
                    heapq.heappop(self._connections)
                    self._in_use[id(conn)] = PoolConnection(ts, conn, time.time())
                    state.set_connection(conn)
                    return conn
        self._take()  # a new one, one that must be checked first, or a wait
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
        with self._pool_lock:  # the pool's check-in of an idle connection (no stale timeout is set)
            checked_out = self._in_use.pop(id(conn), None)
            if checked_out is not None:
                self._heap_counter += 1
                heapq.heappush(self._connections, (checked_out.timestamp, self._heap_counter, conn))
                self._pool_available.notify()

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

    def __enter__(self) -> PostgresPool:
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


def fresh_holds() -> _Held:
    """No thread holding anything (a new store, or a forked child's)."""
    return _Held()


class _Held(threading.local):
    """What keeps a thread's connection out of the pool between statements (per thread)."""

    #: connection_context() blocks, hold() blocks, and db.connect() (counted once) now open.
    blocks = 0
    #: Whether db.connect() holds the connection (until db.close()).
    explicit = False
    #: Gives the connection back if the thread ends while it holds it.
    at_thread_end: weakref.finalize[Any, Any] | None = None
    sentinel: object | None = None

    def watch(self, database: PostgresPool, conn: Any) -> None:
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


def _give_back(ref: weakref.ref[PostgresPool], conn: Any, pid: int) -> None:
    database = ref()
    if database is None or os.getpid() != pid or database._pid != pid:
        return
    with contextlib.suppress(Exception):
        database._close(conn)  # the pool's: hands a connection of an ended thread back to it


class _Block:
    """``db.connection_context()``: one connection of the pool for the block (or decorated call)."""

    __slots__ = ("database",)

    def __init__(self, database: PostgresPool) -> None:
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
