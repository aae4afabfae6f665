"""Statements on the SQLite store's shared connection, each under the database lock, and what their driver
errors become (:mod:`sift.dcache.driver_errors` decides, by SQLite's result code)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from ...driver_errors import PEEWEE_CLASSES, Translation, store_error
from .base import SqliteBase
from .transactions import BufferedCursor

__all__ = ["SqliteExecution"]


class SqliteExecution(SqliteBase):
    """Running statements on the shared connection: the lock around each, errors made the package's."""

    def execute_sql(self, sql: str, params: Sequence[Any] | None = None) -> BufferedCursor:
        with self.lock:
            try:
                with self.read_errors:
                    return BufferedCursor(super().execute_sql(sql, params))
            finally:
                self.settle_writers()

    def run_sql(self, sql: str, params: Sequence[Any]) -> sqlite3.Cursor:
        """Execute on the shared connection without Peewee's query wrapping. The caller holds the lock
        while it reads rows from the cursor; one-shot statements take it here. A constraint violation
        is a ``peewee.IntegrityError``; any other driver error is the package's StoreUnavailable (or a
        subclass)."""
        with self.lock:
            conn = self._state.conn
            try:  # not `with self.statement_errors`: a try costs nothing until it catches, on every statement
                if conn is None:
                    self.connect()
                    conn = self._state.conn
                return conn.execute(sql, params)  # type: ignore[no-any-return]
            except Exception as exc:
                self.statement_errors.__exit__(type(exc), exc, exc.__traceback__)
                raise
            finally:
                # inside a transaction there is nothing to settle: its end (a COMMIT or ROLLBACK) does it
                if conn is None or not conn.in_transaction:
                    self.settle_writers()

    def fetch_all(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Every row of a query; errors as in :meth:`run_sql` (reading rows after the first steps the
        statement again, and can meet a damaged page or an I/O error too)."""
        with self.lock:
            cursor = self.run_sql(sql, params)
            try:  # not `with self.read_errors`: a try costs nothing until it catches, on every read
                return cursor.fetchall()
            except Exception as exc:
                self.raise_store_error(exc)
                raise

    def fetch_one(self, sql: str, params: Sequence[Any]) -> Any:
        """The first row of a query, or None; errors as in :meth:`fetch_all`."""
        with self.lock:
            cursor = self.run_sql(sql, params)
            try:  # as in fetch_all
                return cursor.fetchone()
            except Exception as exc:
                self.raise_store_error(exc)
                raise

    def byte_total(self) -> int:
        """The byte total: one read on the connection, under one hold of the lock. A read that succeeds
        begins or ends no transaction, so only a failed one settles the writers' queue (SQLite may have
        ended a caller's transaction after the error)."""
        with self.lock:
            conn = self._state.conn
            if conn is None:  # connects, as every statement does
                row = self.fetch_one(self.total_nbytes_sql, ())
            else:
                try:  # as in fetch_one
                    row = conn.execute(self.total_nbytes_sql).fetchone()
                except Exception as exc:
                    self.settle_writers()
                    self.raise_store_error(exc)
                    raise
        return 0 if row is None else int(row[0])

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        """Run one statement for each row, streaming ``rows``; return the rows changed. Errors as in
        :meth:`run_sql`."""
        with self.lock, self.statement_errors:
            cursor: sqlite3.Cursor = self.cursor()  # type: ignore[no-untyped-call]
            cursor.executemany(sql, rows)
            return cursor.rowcount

    def hold(self) -> threading.RLock:
        """The database lock: the one connection serves one thread at a time."""
        return self.lock

    def errors(self) -> Translation:
        """A block whose driver errors become the package's (see :meth:`raise_store_error`)."""
        return self.read_errors

    def raise_store_error(self, exc: BaseException, *, constraints: bool = False) -> None:
        """Raise the package error for the driver exception ``exc`` (see :mod:`.driver_errors`); return
        when ``exc`` is none, or is a constraint violation and ``constraints`` is false."""
        error = store_error(exc, path=self.path or "", timeout=self.timeout, constraints=constraints)
        if error is not None:
            raise error

    def rollback_if_open(self) -> None:
        """Roll back the connection's transaction, if one is open (SQLite ends it itself after some
        errors, a full disk among them)."""
        conn = self._state.conn
        try:
            if conn is not None and conn.in_transaction:
                with PEEWEE_CLASSES:
                    conn.execute("ROLLBACK")
        finally:
            self.settle_writers()
