"""What the layers of :class:`~.database.SerializedSqliteDatabase` share: the lock, where the store is, and
(for the type checker) the methods one layer calls on another."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import peewee

from ...driver_errors import Translation
from ..heldwrites import HeldWrites
from .writer_queue import WriterQueue

__all__ = ["SqliteBase"]


class SqliteBase(HeldWrites, peewee.SqliteDatabase):
    """The base every layer of the SQLite store's database extends (each layer is a mixin of one concern)."""

    #: Held from BEGIN to COMMIT and around every single statement: one connection serves every thread.
    lock: threading.RLock
    #: Where the store is, as shown in messages; None when nothing is open.
    path: str | None
    #: The store file's resolved path, or ":memory:"; None when nothing is open.
    file: str | None
    readonly: bool
    #: Whether the store has the claims' columns (a read-only open of an older file may not), and the key
    #: under which statements are compiled for it (see :class:`sift.dcache.statements.Statement`).
    claims_stored: bool = True
    hosts_stored: bool = True
    politeness_stored: bool = True
    statement_key: str = "sqlite"
    #: The ``synchronous`` pragma of every connection the store opens (see ``open_db(durable=)``).
    synchronous_pragma: str
    #: The OS lock that queues write transactions across processes (see :mod:`.writer_queue`).
    writers: WriterQueue
    _state: Any  # Peewee's shared connection state (thread_safe=False): conn and transaction stack
    _lock_type: str  # Peewee's: the kind of BEGIN its transactions use (IMMEDIATE here)
    _store_open: bool  # between open_db and close_db: the connection belongs to the store
    #: Around each statement: driver errors as Peewee's classes, then as the package's (see Translation).
    statement_errors: Translation
    #: Around reading a statement's rows, or Peewee's own execution: driver errors as the package's.
    read_errors: Translation

    #: The SQL that reads the byte total (see :mod:`.schema`).
    total_nbytes_sql: str

    if TYPE_CHECKING:

        def run_sql(self, sql: str, params: Sequence[Any]) -> Any: ...

        def execute_sql(self, sql: str, params: Sequence[Any] | None = None) -> Any: ...

        def connection(self) -> Any: ...

        def fetch_all(self, sql: str, params: Sequence[Any]) -> list[Any]: ...

        def fetch_one(self, sql: str, params: Sequence[Any]) -> Any: ...

        def executemany(self, sql: str, rows: Any) -> int: ...

        def raise_store_error(self, exc: BaseException, *, constraints: bool = False) -> None: ...

        def rollback_if_open(self) -> None: ...

        def write(self) -> Any: ...

        def enter_writers(self) -> None: ...

        def settle_writers(self) -> None: ...

        def checkpoint(self, *, truncate: bool = False) -> None: ...

        def nudge_waits(self) -> None: ...

        def autocheckpoint_pages(self) -> int: ...

        def close_wal_files(self) -> None: ...

        def close_store(self) -> None: ...

        def private_reader(self) -> sqlite3.Connection: ...

        def refuse_inside_transaction(self, call: str) -> None: ...
