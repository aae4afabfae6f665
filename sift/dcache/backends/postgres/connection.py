"""PostgreSQL's backend: pooled connections, each held for one call or one transaction; each statement's
errors made the package's.

The byte total is 16 slot rows kept by a trigger, each connection adding to the slot of its backend pid,
so writers do not queue on one row. The class is put together from one layer per concern: connections and
statements (here), when a thread checks a connection out and gives it back (:mod:`.pool`), the schema
(:mod:`.schema`), maintenance (:mod:`.maintenance`) and the writes' spellings and locks (:mod:`.writes`).
"""

from __future__ import annotations

import contextlib
import math
import os
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from psycopg.types.string import TextLoader

from ...driver_errors import Translation, store_error
from .listener import PostgresListener
from .maintenance import PostgresMaintenance
from .pool import PostgresPool, fresh_holds
from .schema import PostgresSchema
from .urls import parse_target, shown_target, url_secrets
from .writes import PostgresWrites

__all__ = ["PostgresStore"]


class PostgresStore(PostgresWrites, PostgresMaintenance, PostgresSchema, PostgresListener, PostgresPool):
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
        self._held = fresh_holds()
        #: The connections this pool has set up (made and given their loaders).
        self._set_up: weakref.WeakSet[Any] = weakref.WeakSet()
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

    # -- Connections (checked out and given back: see .pool) ---------------------------------------------

    def _connect(self) -> Any:  # Peewee's hook for a checkout (its only one for driver options)
        conn = super()._connect()
        if conn not in self._set_up:  # a new connection, not one of the pool's again
            conn.adapters.register_loader("json", TextLoader)  # options read back as the text stored
            self._set_up.add(conn)
        return conn

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
        self._held = fresh_holds()
        self._suspect = set()
        self.dispose()

    def close_store(self) -> None:
        """Close every pooled connection of this process, and its listening connection."""
        self.stop_waits()
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

    def run_sql(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> Any:
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
