"""The SQLite store's transactions and blocks: each holds the database lock for as long as it runs.

Peewee's ``thread_safe=False`` shares the one connection *and* its transaction state without any lock, so
each of these takes the database's re-entrant lock first.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import peewee

from ...errors import StoreReadOnly
from .base import SqliteBase

__all__ = [
    "BufferedCursor",
    "BulkWrites",
    "DirectWrite",
    "Locked",
    "StoreConnection",
    "ThreadContexts",
    "WriteTransaction",
]

F = TypeVar("F", bound=Callable[..., Any])


class BufferedCursor:
    """A finished statement: its rows fetched while the lock was held, so no statement stays open."""

    __slots__ = ("_pos", "_rows", "description", "lastrowid", "rowcount")

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._rows = cursor.fetchall() if cursor.description else []
        self._pos = 0
        self.description = cursor.description
        self.rowcount = cursor.rowcount
        self.lastrowid = cursor.lastrowid
        cursor.close()

    def fetchone(self) -> Any:
        if self._pos >= len(self._rows):
            return None
        self._pos += 1
        return self._rows[self._pos - 1]

    def fetchmany(self, size: int = 1) -> list[Any]:
        rows = self._rows[self._pos : self._pos + size]
        self._pos += len(rows)
        return rows

    def fetchall(self) -> list[Any]:
        rows = self._rows[self._pos :]
        self._pos = len(self._rows)
        return rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def close(self) -> None:
        self._rows = []


class Locked:
    """Holds the database lock around a Peewee transaction or atomic block (usable as a decorator)."""

    def __init__(self, database: SqliteBase, make: Callable[[], Any]) -> None:
        self.database = database
        self.make = make

    def __enter__(self) -> Any:
        self.database.lock.acquire()
        try:
            self.inner = self.make()
            return self.inner.__enter__()
        except BaseException:
            self.database.lock.release()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        try:
            return self.inner.__exit__(exc_type, exc, tb)
        finally:
            self.database.lock.release()

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Locked(self.database, self.make):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class WriteTransaction:
    """BEGIN IMMEDIATE … COMMIT under the database lock, without Peewee's per-transaction bookkeeping
    (the hot paths run one per call). Inside another transaction it is a Peewee savepoint instead."""

    __slots__ = ("database", "savepoint")

    def __init__(self, database: SqliteBase) -> None:
        self.database = database
        self.savepoint: Any = None

    def __enter__(self) -> None:
        database = self.database
        if database.readonly:
            raise StoreReadOnly(
                f"database: {database.path!r} is open read-only; open_db(path) without readonly=True to write"
            )
        database.lock.acquire()
        try:
            if database._state.transactions:
                self.savepoint = peewee.SqliteDatabase.atomic(database)
                self.savepoint.__enter__()
            else:
                database.enter_writers()  # connects first, if the connection is closed
                database._state.conn.execute("BEGIN IMMEDIATE")
                database._state.transactions.append(self)
        except BaseException as exc:
            try:
                database.settle_writers()
            finally:
                database.lock.release()
            database.raise_store_error(exc)
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        database = self.database
        try:
            if self.savepoint is not None:
                self.savepoint.__exit__(exc_type, exc, tb)
            else:
                database._state.transactions.pop()
                if exc_type is None:
                    try:
                        database._state.conn.execute("COMMIT")
                    except BaseException:
                        database.rollback_if_open()
                        raise
                else:
                    database.rollback_if_open()
        except BaseException as end_error:
            database.raise_store_error(end_error, constraints=True)
            raise
        finally:
            try:  # an interrupt in the checkpoint's wait leaves no lock held
                database.settle_writers()
            finally:
                database.lock.release()
        if exc is not None:  # what failed inside the transaction: here it leaves the store's functions
            database.raise_store_error(exc, constraints=True)


class DirectWrite(WriteTransaction):
    """The write transaction of a hot path, which sends its statements to the connection itself: the block
    is given the connection's ``execute`` (sqlite3's own, parameters bound by position), and its driver
    errors become the package's as the block ends. One hold of the lock and one turn in the writers' queue
    cover the whole call; the queue is settled, and a checkpoint made if due, once, at its end."""

    __slots__ = ()

    def __enter__(self) -> Callable[[str, Sequence[Any]], sqlite3.Cursor]:  # type: ignore[override]
        database = self.database
        state = database._state
        database.lock.acquire()
        if database.readonly or state.closed or state.transactions:  # refused, connecting, or a savepoint
            try:
                super().__enter__()
            finally:
                database.lock.release()  # super() holds it, once more
            execute: Callable[[str, Sequence[Any]], sqlite3.Cursor] = state.conn.execute
            return execute
        try:  # WriteTransaction's own steps, inline: this runs once per call of the hot paths
            database.writers.acquire()
            execute = state.conn.execute
            state.conn.execute("BEGIN IMMEDIATE")
            state.transactions.append(self)
        except BaseException as exc:
            try:
                database.settle_writers()
            finally:
                database.lock.release()
            database.raise_store_error(exc)
            raise
        return execute


class BulkWrites:
    # SQLite's automatic checkpoint runs inside the COMMIT that takes the -wal file past 1,000 pages.
    # It copies the log back and fsyncs both files, tens of milliseconds with the lock held, stalling
    # every thread; bulk deletes reach it every few transactions.
    def __init__(self, database: SqliteBase) -> None:
        self.database = database

    def __enter__(self) -> None:
        with self.database.lock:
            self.database.run_sql("PRAGMA wal_autocheckpoint = 0", ())

    def __exit__(self, *exc_info: object) -> None:
        with self.database.lock:
            self.database.run_sql(f"PRAGMA wal_autocheckpoint = {self.database.autocheckpoint_pages()}", ())
        self.database.checkpoint()


class ThreadContexts(threading.local):
    """Each thread's own stack of ``with db:`` blocks (Peewee keeps one stack for all threads)."""

    def __init__(self) -> None:
        self.stack: list[Locked] = []


class StoreConnection:
    """``db.connection_context()``: the store's connection is open inside; leaving never closes it."""

    def __init__(self, database: SqliteBase) -> None:
        self.database = database

    def __enter__(self) -> None:
        self.database.connect()

    def __exit__(self, *exc_info: object) -> None:
        pass

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
