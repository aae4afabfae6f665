"""SQLite's backend: one connection shared by every thread of the process, one transaction at a time.

As in the Go original (``SetMaxOpenConns(1)``), one connection serves the process. Peewee's
``thread_safe=False`` shares that connection *and* its transaction state without any lock, so
:class:`SerializedSqliteDatabase` holds one re-entrant lock from BEGIN to COMMIT and around every single
statement, including ad-hoc model queries made by a web view or a shell. Users reach it through
``sift.dcache.db``, which forwards every call here while a SQLite store is open.

The class is put together from one layer per concern: Peewee's idioms (:mod:`.idioms`), the writers'
queue and checkpoints (:mod:`.wal`), statements and their errors (:mod:`.execution`), the schema
(:mod:`.schema`), maintenance (:mod:`.maintenance`), and the rule functions' SQL pieces and write
transactions (:mod:`.writes`).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Callable
from typing import Any

import peewee

from ...driver_errors import Translation
from ...errors import BatchError, StoreUnavailable
from .changes import SqliteChanges
from .execution import SqliteExecution
from .files import create_store_file
from .idioms import SqliteIdioms
from .maintenance import SqliteMaintenance
from .paths import store_target
from .schema import SqliteSchema
from .settings import BUSY_TIMEOUT_S, PRAGMAS, READONLY_PRAGMAS, SYNCHRONOUS_DURABLE
from .transactions import ThreadContexts
from .wal import WalPolicy
from .writer_queue import WriterQueue
from .writes import SqliteWrites

__all__ = ["SerializedSqliteDatabase"]

# Connections a forked child inherited. They are kept referenced, never used and never closed:
# closing SQLite's handle in the child could release or break the parent's locks on the file.
_inherited_connections: list[sqlite3.Connection] = []


class SerializedSqliteDatabase(
    SqliteIdioms, WalPolicy, SqliteExecution, SqliteSchema, SqliteMaintenance, SqliteWrites, SqliteChanges
):
    """A ``SqliteDatabase`` whose one connection is shared by all threads, one transaction at a time.

    Every transaction is ``BEGIN IMMEDIATE``: a deferred BEGIN that reads and then writes fails at once
    with "database is locked" when another process writes, without waiting on the busy timeout. Before
    it, the transaction waits its turn in the writers' queue (``writers``) behind other processes' writers.
    A child made by ``fork()`` drops the inherited connection unused and opens its own on first use.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._store_open = False  # between open_db and close_db: the connection belongs to the store
        self.path: str | None = None
        self.file: str | None = None  # resolved once by open_db: every companion is named from it
        self.readonly = False
        self.synchronous_pragma = str(PRAGMAS["synchronous"])
        self.contexts = ThreadContexts()
        self._raw_init = True  # Peewee's constructor calls init(None)
        super().__init__(None, thread_safe=False, lock_type="IMMEDIATE", autoconnect=True)
        self._raw_init = False
        self._forked_in_transaction = False
        self._checkpointer = None
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_thread = None
        self._checkpoint_gave_up = False
        self._long_checkpoint_at = (b"", 0)
        self._checkpoint_stop = threading.Event()
        self._aside_lock = threading.Lock()
        self._aside_asked = threading.Condition(self._aside_lock)
        self._aside_running = self._aside_again = False
        self.writers = WriterQueue(None, BUSY_TIMEOUT_S)
        self.statement_errors = Translation(self.raise_store_error, peewee_classes=True)
        self.read_errors = Translation(self.raise_store_error, peewee_classes=False)
        self._wal_index_path = None
        self._wal_index = None
        self._changes_seen = 0
        this = weakref.ref(self)

        def call(method: str) -> Callable[[], None]:
            def hook() -> None:
                database = this()
                if database is not None:
                    getattr(database, method)()

            return hook

        # A fork waits until no other thread is inside a transaction: a child that inherits SQLite's
        # in-process lock state from an open transaction cannot write to the file.
        os.register_at_fork(
            before=call("_before_fork"),
            after_in_parent=call("_after_fork_in_parent"),
            after_in_child=call("_after_fork"),
        )

    def _before_fork(self) -> None:
        self.lock.acquire()
        # and until no checkpoint runs on a thread of its own: the child could inherit SQLite's in-process
        # mutexes of the file held, and its own connection wait on them for ever
        self._checkpoint_lock.acquire()

    def _after_fork_in_parent(self) -> None:
        self._checkpoint_lock.release()
        self.lock.release()

    def _after_fork(self) -> None:
        self._forked_in_transaction = bool(self._state.transactions)
        self.lock = threading.RLock()
        self._checkpoint_lock = threading.Lock()
        _inherited_connections.extend(c for c in (self._state.conn, self._checkpointer) if c is not None)
        self._checkpointer = None
        self._checkpoint_thread = None
        self._checkpoint_gave_up = False
        self._long_checkpoint_at = (b"", 0)
        self._aside_lock = threading.Lock()
        self._aside_asked = threading.Condition(self._aside_lock)
        self._aside_running = self._aside_again = False
        self.writers.after_fork_in_child()
        self.close_wal_index()
        self._state.reset()

    def __repr__(self) -> str:
        if self.deferred:
            return f"<{type(self).__name__}: no store open; call sift.dcache.open_db(path)>"
        state = "closed" if self.is_closed() else "open"
        return f"<{type(self).__name__} {self.path!r}: {state}{', read-only' if self.readonly else ''}>"

    def init(self, database: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Peewee's deferred-database idiom: ``db.init(path)`` is ``open_db(path)`` (the schema included),
        and ``db.init(None)`` is ``close_db()``. Only ``timeout`` and ``readonly`` may be given."""
        if self._raw_init:
            super().init(database, **kwargs)
        elif database is None:
            self.close_store()
            self._init_raw(None)
        else:
            if unknown := sorted(set(kwargs) - {"timeout", "readonly"}):
                raise StoreUnavailable(
                    f"{unknown[0]}: the store sets its own connection options; db.init(path) and "
                    "open_db(path) take only timeout= and readonly="
                )
            self.open_store(database, **kwargs)

    def _init_raw(self, database: Any, **kwargs: Any) -> None:
        self._raw_init = True
        try:
            super().init(database, **kwargs)
        finally:
            self._raw_init = False

    def open_store(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = BUSY_TIMEOUT_S,
        readonly: bool = False,
        create: bool = True,
        durable: bool = False,
    ) -> None:
        """Close what is open and open ``path``, all under the lock, so other threads' calls run on the old
        store or on the new one, never in between. See :func:`open_db`."""
        with self.lock:
            self.refuse_inside_transaction("open_db")
            self.close_store()
            try:
                target, shown, file = store_target(path, readonly, create)
                if not readonly and shown != ":memory:":
                    create_store_file(target)  # 0600, not the umask's mode; see files.py
                pragmas = READONLY_PRAGMAS if readonly else PRAGMAS
                self.synchronous_pragma = SYNCHRONOUS_DURABLE if durable else str(pragmas["synchronous"])
                # Only a file's writers queue: nobody else can write a private in-memory store, and a
                # read-only store never writes.
                queued = not readonly and shown != ":memory:"
                self.writers = WriterQueue(target if queued else None, timeout)
                self._wal_index_path = target + "-shm" if self.writers.path is not None else None
                self._changes_seen = 0
                self._init_raw(
                    target,
                    pragmas=dict(
                        pragmas, busy_timeout=int(timeout * 1000), synchronous=self.synchronous_pragma
                    ),
                    timeout=timeout,
                    check_same_thread=False,
                    uri=readonly,
                )
                self.path, self.file, self.readonly = shown, file, readonly
                self.connect()
                if readonly:
                    self.check_schema()
                else:
                    self.prepare_schema()
                self.check_columns()
            except (
                peewee.DatabaseError,
                sqlite3.DatabaseError,
                OSError,
                ValueError,
                TypeError,
                StoreUnavailable,
            ) as exc:
                self.close_store()
                self._init_raw(None)
                self.path, self.file, self.readonly = None, None, False
                if isinstance(exc, StoreUnavailable) and exc.field == "path":  # already says what is wrong
                    raise
                # Keep the kind (StoreCorrupt, StoreFull, ...) and the driver's error as the cause.
                kind = type(exc) if isinstance(exc, StoreUnavailable) else StoreUnavailable
                cause = exc.__cause__ if isinstance(exc, BatchError) and exc.__cause__ is not None else exc
                raise kind.of_target(f"cannot open {path!r} as a batch store: {exc}") from cause
            self._store_open = True

    def open_memory_copy(self, image: sqlite3.Connection) -> None:
        """Open the in-memory store closed last again, holding a copy of ``image`` (an in-memory store's
        pages, schema included), as ``open_db(":memory:")`` leaves a store: how ``sift.testing`` gives each
        test a fresh store without creating the schema each time."""
        with self.lock:
            self.connect()
            image.backup(self.connection())
            self._store_open = True

    def close_store(self) -> None:
        """Close the store's connection, waiting for any transaction of another thread to end first."""
        with self.lock:
            self.refuse_inside_transaction("close_db")
            self.stop_waits()
            self._store_open = False
            self.writers.close()
            if not self.deferred:
                self.close_connection()

    def refuse_inside_transaction(self, call: str) -> None:
        # With the lock held, an open transaction is this thread's own: closing would end it half-done.
        if self.in_transaction():
            raise BatchError(f"database: {call}() inside a transaction; end the transaction first")
