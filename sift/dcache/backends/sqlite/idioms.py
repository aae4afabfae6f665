"""Peewee's connection and transaction idioms on the SQLite store's one shared connection.

Peewee's connection idioms assume a connection per thread. Here the one connection belongs to the store
from open_db to close_db, so connect(), close(), ``with db:`` and connection_context() never open or close
it while it is open: request hooks written for Peewee work unchanged from any thread. Peewee's
transactions (atomic, transaction, sessions, ``with db:``) take the database lock, and begin and end on the
shared connection like every statement, so their errors are the package's too.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import peewee

from ...errors import StoreNotOpen, StoreUnavailable
from .base import SqliteBase
from .transactions import Locked, StoreConnection, ThreadContexts

__all__ = ["SqliteIdioms"]


class SqliteIdioms(SqliteBase):
    """Peewee's ``connect``/``close``/``with``/``atomic``/sessions, shared by every thread under the lock."""

    contexts: ThreadContexts  # each thread's own stack of ``with db:`` blocks
    _forked_in_transaction: bool

    def connect(self, reuse_if_open: bool = False) -> bool:
        """Open the connection if it is closed; while the store is open this does nothing and returns
        False (never "Connection already opened": other threads share the connection)."""
        if self.deferred:
            raise StoreNotOpen("no database is open: call sift.dcache.open_db(path) first")
        if self._forked_in_transaction:
            raise StoreUnavailable(
                "database: this process was forked inside a transaction and cannot use the store; "
                "fork outside transactions"
            )
        if self._store_open and not self._state.closed:  # the usual case: no lock, so no wait
            return False
        with self.lock:
            if not self._state.closed:
                return False
            try:
                return bool(super().connect())
            except Exception as exc:
                if self._state.conn is not None:  # opened, but a pragma failed: not kept
                    self._state.conn.close()
                    self._state.reset()
                self.raise_store_error(exc)
                raise

    def close(self) -> bool:
        """Does nothing and returns False while the store is open (other threads use the connection, and
        ``close_db()`` closes it) or inside a transaction. Otherwise (a connection opened again after
        ``close_db()``) closes it."""
        if self._store_open or self.deferred:  # no lock: a request hook never waits on another thread
            return False
        with self.lock:
            if self._store_open or self.in_transaction():
                return False
            return self.close_connection()

    def close_connection(self) -> bool:
        """Close the connection and the files beside it (the checkpoints' connection, the WAL index)."""
        self.close_wal_files()
        return bool(super().close())

    def __enter__(self) -> SqliteIdioms:
        """``with db:`` is a transaction of this thread's (``db.atomic()``); it never closes the store."""
        block = self.atomic()
        block.__enter__()
        self.contexts.stack.append(block)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        return self.contexts.stack.pop().__exit__(exc_type, exc, tb)

    def connection_context(self) -> StoreConnection:  # type: ignore[override]
        """A block (or decorator) that needs the store's connection open; it never closes it."""
        return StoreConnection(self)

    # Peewee's transactions (atomic, transaction, sessions, `with db:`) begin and end through these; they
    # run on the shared connection like every statement, so their errors are the package's too.

    def begin(self, lock_type: str | None = None) -> None:
        """BEGIN IMMEDIATE (``lock_type``: another kind), after the writers' queue; on a read-only store a
        deferred BEGIN, since its transactions only read. A deferred BEGIN does not queue."""
        if self.readonly:
            self.run_sql("BEGIN", ())
            return
        kind = (lock_type or self._lock_type).upper()
        with self.lock:
            try:
                if kind in ("IMMEDIATE", "EXCLUSIVE"):
                    self.enter_writers()
                self.run_sql(f"BEGIN {kind}", ())
            finally:
                self.settle_writers()

    def commit(self) -> None:
        self.run_sql("COMMIT", ())

    def rollback(self) -> None:
        """ROLLBACK, unless SQLite ended the transaction itself (after a full disk, say): then the error
        that ended it is what the caller sees, not "no transaction is active"."""
        with self.lock:  # as every statement's settling is: another thread's write may be ending
            conn = self._state.conn
            if conn is not None and not conn.in_transaction:
                self.settle_writers()
                return
            self.run_sql("ROLLBACK", ())

    def atomic(self, *args: Any, **kwargs: Any) -> Locked:  # type: ignore[override]
        return Locked(self, lambda: super(SqliteIdioms, self).atomic(*args, **kwargs))

    def transaction(self, *args: Any, **kwargs: Any) -> Locked:  # type: ignore[override]
        return Locked(self, lambda: super(SqliteIdioms, self).transaction(*args, **kwargs))

    # Peewee's session calls (e.g. in request hooks) open a transaction in one call and end it in another,
    # so the lock is taken in session_start and released when the session's transaction ends.
    def session_start(self) -> Any:
        self.lock.acquire()
        try:
            return peewee.SqliteDatabase.transaction(self).__enter__()
        except BaseException:
            self.lock.release()
            raise

    def session_commit(self) -> bool:
        return self._end_session(super().session_commit)

    def session_rollback(self) -> bool:
        return self._end_session(super().session_rollback)

    def _end_session(self, end: Callable[[], bool]) -> bool:
        with self.lock:
            if not self._state.transactions:
                return False
            try:
                return end()
            finally:
                self.lock.release()  # the one session_start took

    def manual_commit(self) -> Locked:  # type: ignore[override]
        return Locked(self, lambda: super(SqliteIdioms, self).manual_commit())
