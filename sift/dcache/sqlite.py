"""SQLite's backend: the shared connection and its lock, the pragmas, the schema and its open-time repair,
and SQLite's spellings of what the rules need (byte length, the JSON check, insertion order, the total).

One connection is shared by every thread of the process, as in the Go original (``SetMaxOpenConns(1)``).
Peewee's ``thread_safe=False`` shares that connection *and* its transaction state without any lock, so
:class:`SerializedSqliteDatabase` holds one re-entrant lock from BEGIN to COMMIT and around every single
statement, including ad-hoc model queries made by a web view or a shell. Users reach it through
``sift.dcache.db`` (:mod:`.database`), which forwards every call here while a SQLite store is open.

Across processes, every write transaction of a file store (``write()``, and Peewee's transactions, which
all begin through :meth:`SerializedSqliteDatabase.begin`) first takes its place in the writers' queue, an
OS lock on ``<store>-lock`` (:mod:`.writer_queue` says why so), and leaves it when the connection is out
of the transaction again (:meth:`SerializedSqliteDatabase.settle_writers`, after every statement).
SQLite's automatic checkpoint would run inside the COMMIT that takes the ``-wal`` file past 1,000 pages,
with the queue still held: every other process's writer would wait for its copy and fsyncs. So a queued
store turns it off and applies the same rule itself, once the queue is released
(:meth:`SerializedSqliteDatabase.checkpoint_if_due`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import sys
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import peewee

from . import files
from .driver_errors import is_busy, store_error
from .errors import BatchError, StoreNotOpen, StoreReadOnly, StoreUnavailable
from .writer_queue import WriterQueue

__all__ = ["BASE_SCHEMA", "BUSY_TIMEOUT_S", "PRAGMAS", "TOTAL_NBYTES_SQL", "SerializedSqliteDatabase"]

F = TypeVar("F", bound=Callable[..., Any])

# Peewee's context manager that turns sqlite3 errors into peewee.IntegrityError, OperationalError, …
_peewee_errors: Any = vars(peewee)["__exception_wrapper__"]

#: Pages of -wal file after which a COMMIT checkpoints (SQLite's default), except in bulk writes.
WAL_AUTOCHECKPOINT_PAGES = 1000

#: The oldest SQLite whose library can run claim_batch_targets.
CLAIMS_NEED_SQLITE = (3, 35, 0)
#: The busy timeout: how long a write waits for another process's write lock before failing.
BUSY_TIMEOUT_S = 10.0

#: Connection pragmas, applied on every connect.
PRAGMAS: dict[str, object] = {
    # Readers never block the writer and vice versa; two processes can share the file.
    "journal_mode": "wal",
    # In WAL mode, commits survive a process kill; a power loss may drop the last transactions,
    # never corrupt the file.
    "synchronous": "normal",
    # Milliseconds a statement waits on another process's lock (BEGIN IMMEDIATE uses it too).
    "busy_timeout": int(BUSY_TIMEOUT_S * 1000),
    # Truncate the -wal file back to 64 MiB after each checkpoint, so one big sweep cannot leave it huge.
    "journal_size_limit": 64 * 1024 * 1024,
    # SQLite's default: a COMMIT that takes the -wal file past this many pages checkpoints it.
    "wal_autocheckpoint": WAL_AUTOCHECKPOINT_PAGES,
    # 32 MiB of page cache: the hot indexes of a large store stay in memory.
    "cache_size": -32 * 1024,
    # An INSERT OR REPLACE deletes the row it replaces; only with this on does that delete fire the
    # trigger that keeps batch_totals right.
    "recursive_triggers": 1,
    # The schema has no foreign keys; keep SQLite from checking any another program may add.
    "foreign_keys": 0,
}

#: The original schema, verbatim. Files written by the Go service have exactly these tables.
BASE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS batch_job (
    id TEXT PRIMARY KEY, caller TEXT NOT NULL, caller_class TEXT NOT NULL, idem_key TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', targets_total INTEGER NOT NULL,
    targets_done INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, lease INTEGER NOT NULL,
    nbytes INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS batch_target (
    job_id TEXT NOT NULL, idx INTEGER NOT NULL, url TEXT NOT NULL, options TEXT NOT NULL,
    status TEXT NOT NULL, result TEXT, error TEXT, hint TEXT, PRIMARY KEY (job_id, idx))""",
    "CREATE INDEX IF NOT EXISTS batch_job_idem  ON batch_job(caller, idem_key)",
    "CREATE INDEX IF NOT EXISTS batch_job_lease ON batch_job(lease)",
)

# What the hot paths need to stay flat in history. The partial indexes hold only live jobs, or only
# jobs that eviction may take; triggers keep the byte total whoever writes the file, and open_db
# recomputes it, so a file written by a program that never knew of this table is still right.
SPEED_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS batch_job_live ON batch_job(caller) WHERE status IN ('queued', 'running')",
    "CREATE INDEX IF NOT EXISTS batch_job_evictable ON batch_job(lease, created_at, id) "
    "WHERE nbytes > 0 AND status IN ('done', 'partial', 'failed', 'cancelled')",
    # claim_batch_targets: live jobs in claim order (created_at, then rowid, which every index entry ends
    # with), and each job's pending targets in idx order, so a claim reads neither history nor done targets.
    "CREATE INDEX IF NOT EXISTS batch_job_claim ON batch_job(created_at) "
    "WHERE status IN ('queued', 'running')",
    "CREATE INDEX IF NOT EXISTS batch_target_pending ON batch_target(job_id, idx) WHERE status = 'pending'",
    # rescue_stale_jobs: live jobs by lease. batch_job_lease holds the history too, which a rescue would
    # read through (every finished job with an older lease) while holding the write lock.
    "CREATE INDEX IF NOT EXISTS batch_job_live_lease ON batch_job(lease) "
    "WHERE status IN ('queued', 'running')",
    "CREATE TABLE IF NOT EXISTS batch_totals ("
    "id INTEGER PRIMARY KEY CHECK (id = 0), nbytes INTEGER NOT NULL)",
    "CREATE TRIGGER IF NOT EXISTS batch_totals_insert AFTER INSERT ON batch_job BEGIN "
    "UPDATE batch_totals SET nbytes = nbytes + NEW.nbytes WHERE id = 0; END",
    "CREATE TRIGGER IF NOT EXISTS batch_totals_delete AFTER DELETE ON batch_job BEGIN "
    "UPDATE batch_totals SET nbytes = nbytes - OLD.nbytes WHERE id = 0; END",
    "CREATE TRIGGER IF NOT EXISTS batch_totals_update AFTER UPDATE OF nbytes ON batch_job "
    "WHEN NEW.nbytes IS NOT OLD.nbytes BEGIN "
    "UPDATE batch_totals SET nbytes = nbytes + NEW.nbytes - OLD.nbytes WHERE id = 0; END",
)
#: What a read-only store sets: nothing that writes the file (``journal_mode`` is the file's own), and
#: ``query_only`` so that even an ad-hoc write through the connection is refused.
READONLY_PRAGMAS: dict[str, object] = {
    **{
        k: v
        for k, v in PRAGMAS.items()
        if k not in ("journal_mode", "wal_autocheckpoint", "journal_size_limit")
    },
    "query_only": 1,
}
#: The running byte total kept by the triggers above.
TOTAL_NBYTES_SQL = "SELECT nbytes FROM batch_totals WHERE id = 0"
RECOMPUTE_TOTAL_SQL = (
    "INSERT OR REPLACE INTO batch_totals (id, nbytes) SELECT 0, COALESCE(SUM(nbytes), 0) FROM batch_job"
)
SCHEMA_NAMES = frozenset(
    {"batch_job", "batch_target", "batch_job_idem", "batch_job_lease", "batch_job_live"}
    | {"batch_job_evictable", "batch_totals", "batch_totals_insert", "batch_totals_delete"}
    | {"batch_totals_update", "batch_job_claim", "batch_target_pending", "batch_job_live_lease"}
)
#: What a read-only open requires: the indexes only claims and rescues read (writes, which a read-only
#: store refuses anyway) may be missing, so a store an earlier sift made opens read-only as it is.
READ_SCHEMA_NAMES = SCHEMA_NAMES - {"batch_job_claim", "batch_target_pending", "batch_job_live_lease"}

# Connections a forked child inherited. They are kept referenced, never used and never closed:
# closing SQLite's handle in the child could release or break the parent's locks on the file.
_inherited_connections: list[sqlite3.Connection] = []


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


class _Locked:
    """Holds the database lock around a Peewee transaction or atomic block (usable as a decorator)."""

    def __init__(self, database: SerializedSqliteDatabase, make: Callable[[], Any]) -> None:
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
            with _Locked(self.database, self.make):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class _WriteTransaction:
    """BEGIN IMMEDIATE … COMMIT under the database lock, without Peewee's per-transaction bookkeeping
    (the hot paths run one per call). Inside another transaction it is a Peewee savepoint instead."""

    __slots__ = ("database", "savepoint")

    def __init__(self, database: SerializedSqliteDatabase) -> None:
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
                database.enter_writers()
                database.run_sql("BEGIN IMMEDIATE", ())
                database._state.transactions.append(self)
        except BaseException as exc:
            database.settle_writers()
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
                        database.run_sql("COMMIT", ())
                    except BaseException:
                        database.rollback_if_open()
                        raise
                else:
                    database.rollback_if_open()
        except BaseException as end_error:
            database.raise_store_error(end_error, constraints=True)
            raise
        finally:
            database.settle_writers()
            database.lock.release()
        if exc is not None:  # what failed inside the transaction: here it leaves the store's functions
            database.raise_store_error(exc, constraints=True)


class _BulkWrites:
    # SQLite's automatic checkpoint runs inside the COMMIT that takes the -wal file past 1,000 pages.
    # It copies the log back and fsyncs both files, tens of milliseconds with the lock held, stalling
    # every thread; bulk deletes reach it every few transactions.
    def __init__(self, database: SerializedSqliteDatabase) -> None:
        self.database = database

    def __enter__(self) -> None:
        with self.database.lock:
            self.database.run_sql("PRAGMA wal_autocheckpoint = 0", ())

    def __exit__(self, *exc_info: object) -> None:
        with self.database.lock:
            self.database.run_sql(f"PRAGMA wal_autocheckpoint = {self.database.autocheckpoint_pages()}", ())
        self.database.checkpoint()


class _ThreadContexts(threading.local):
    """Each thread's own stack of ``with db:`` blocks (Peewee keeps one stack for all threads)."""

    def __init__(self) -> None:
        self.stack: list[_Locked] = []


class StoreConnection:
    """``db.connection_context()``: the store's connection is open inside; leaving never closes it."""

    def __init__(self, database: SerializedSqliteDatabase) -> None:
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


class SerializedSqliteDatabase(peewee.SqliteDatabase):
    """A ``SqliteDatabase`` whose one connection is shared by all threads, one transaction at a time.

    Every transaction is ``BEGIN IMMEDIATE``: a deferred BEGIN that reads and then writes fails at once
    with "database is locked" when another process writes, without waiting on the busy timeout. Before
    it, the transaction waits its turn in the writers' queue (``writers``) behind other processes' writers.
    A child made by ``fork()`` drops the inherited connection unused and opens its own on first use.
    """

    _state: Any  # Peewee's shared connection state (thread_safe=False): conn and transaction stack
    _lock_type: str  # Peewee's: the kind of BEGIN its transactions use (IMMEDIATE here)

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._store_open = False  # between open_db and close_db: the connection belongs to the store
        self.path: str | None = None
        self.readonly = False
        self._contexts = _ThreadContexts()
        self._raw_init = True  # Peewee's constructor calls init(None)
        super().__init__(None, thread_safe=False, lock_type="IMMEDIATE", autoconnect=True)
        self._raw_init = False
        self._forked_in_transaction = False
        self._checkpointer: sqlite3.Connection | None = None
        self._checkpoint_lock = threading.Lock()
        #: The OS lock that queues write transactions across processes (see :mod:`.writer_queue`).
        self.writers = WriterQueue(None, BUSY_TIMEOUT_S)
        #: For measurement only (``scripts/bench.py --only tail`` compares both ways in one run): False
        #: makes the next ``open_store`` leave writers to SQLite's busy handler alone, as before the queue.
        self._queue_writers = True
        #: ``<store>-shm`` (SQLite's WAL index), whose header says how many -wal frames await a checkpoint;
        #: None when SQLite checkpoints by itself (in memory, read-only, without the queue, or the index
        #: could not be read).
        self._wal_index_path: str | None = None
        self._wal_index: int | None = None
        self._changes_seen = 0  # the connection's total_changes at the last look at the -wal file
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

    def _after_fork_in_parent(self) -> None:
        self.lock.release()

    def _after_fork(self) -> None:
        self._forked_in_transaction = bool(self._state.transactions)
        self.lock = threading.RLock()
        self._checkpoint_lock = threading.Lock()
        _inherited_connections.extend(c for c in (self._state.conn, self._checkpointer) if c is not None)
        self._checkpointer = None
        self.writers.after_fork_in_child()
        self._close_wal_index()
        self._state.reset()

    def __repr__(self) -> str:
        if self.deferred:
            return f"<{type(self).__name__}: no store open; call sift.dcache.open_db(path)>"
        state = "closed" if self.is_closed() else "open"
        return f"<{type(self).__name__} {self.path!r}: {state}{', read-only' if self.readonly else ''}>"

    # Peewee's connection idioms assume a connection per thread. Here the one connection belongs to the
    # store from open_db to close_db, so connect(), close(), `with db:` and connection_context() never
    # open or close it while it is open: request hooks written for Peewee work unchanged from any thread.

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
            return self._close_connection()

    def _close_connection(self) -> bool:
        with self._checkpoint_lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
        self._close_wal_index()
        return bool(super().close())

    def _close_wal_index(self) -> None:
        if self._wal_index is not None:
            with contextlib.suppress(OSError):
                os.close(self._wal_index)
            self._wal_index = None

    def __enter__(self) -> SerializedSqliteDatabase:
        """``with db:`` is a transaction of this thread's (``db.atomic()``); it never closes the store."""
        block = self.atomic()
        block.__enter__()
        self._contexts.stack.append(block)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        return self._contexts.stack.pop().__exit__(exc_type, exc, tb)

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
        conn = self._state.conn
        if conn is not None and not conn.in_transaction:
            self.settle_writers()
            return
        self.run_sql("ROLLBACK", ())

    def enter_writers(self) -> None:
        """Take this store's place in the writers' queue, the connection opened first (so a process that
        cannot use the store fails at once, not after waiting its turn)."""
        if self._state.closed:
            self.connect()
        self.writers.acquire()

    def settle_writers(self) -> None:
        """Leave the writers' queue once the connection is out of its transaction, however it ended
        (COMMIT, ROLLBACK, a failed BEGIN, SQLite ending it after an error, a raw ``COMMIT``); then, if
        something was written, checkpoint if due."""
        conn = self._state.conn
        if conn is not None and conn.in_transaction:
            return
        if self.writers.held:
            self.writers.release()
        if self._wal_index_path is not None and conn is not None and conn.total_changes != self._changes_seen:
            self._changes_seen = conn.total_changes
            self.checkpoint_if_due()

    def checkpoint_if_due(self) -> None:
        """SQLite's rule for its automatic checkpoint, applied outside the writers' queue: once the -wal
        file holds WAL_AUTOCHECKPOINT_PAGES frames not yet copied back, a PASSIVE checkpoint. It never
        fails the write before it; if the WAL index cannot be read, SQLite checkpoints by itself again."""
        pending = self._wal_frames_pending()
        if pending is None:
            self._wal_index_path = None
            with contextlib.suppress(Exception):
                self.run_sql(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}", ())
        elif pending >= WAL_AUTOCHECKPOINT_PAGES:
            with contextlib.suppress(BatchError):  # retried after the next write
                self.checkpoint()

    def _wal_frames_pending(self) -> int | None:
        """Frames in the -wal file not yet checkpointed, from the WAL index header (sqlite.org/walformat:
        ``mxFrame`` at byte 16, ``nBackfill`` at byte 96, native byte order), or None if unreadable."""
        try:
            if self._wal_index is None:
                assert self._wal_index_path is not None
                self._wal_index = os.open(self._wal_index_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            header = os.pread(self._wal_index, 100, 0)
        except OSError:
            return None
        if len(header) < 100:
            return None
        max_frame = int.from_bytes(header[16:20], sys.byteorder)
        backfilled = int.from_bytes(header[96:100], sys.byteorder)
        return max_frame - backfilled if max_frame >= backfilled else max_frame

    def autocheckpoint_pages(self) -> int:
        """The connection's ``wal_autocheckpoint``: 0 while the store checkpoints after the queue."""
        return 0 if self._wal_index_path is not None else WAL_AUTOCHECKPOINT_PAGES

    def manual_commit(self) -> _Locked:  # type: ignore[override]
        return _Locked(self, lambda: super(SerializedSqliteDatabase, self).manual_commit())

    def open_store(
        self, path: str | os.PathLike[str], *, timeout: float = BUSY_TIMEOUT_S, readonly: bool = False
    ) -> None:
        """Close what is open and open ``path``, all under the lock, so other threads' calls run on the old
        store or on the new one, never in between. See :func:`open_db`."""
        with self.lock:
            self._refuse_inside_transaction("open_db")
            self.close_store()
            try:
                target, shown = _store_target(path, readonly)
                if not readonly and shown != ":memory:":
                    files.create_store_file(shown)  # 0600, not the umask's mode; see files.py
                pragmas = READONLY_PRAGMAS if readonly else PRAGMAS
                queued = not readonly and shown != ":memory:" and self._queue_writers
                self.writers = WriterQueue(target if queued else None, timeout)
                self._wal_index_path = target + "-shm" if queued else None
                self._changes_seen = 0
                self._init_raw(
                    target,
                    pragmas=dict(pragmas, busy_timeout=int(timeout * 1000)),
                    timeout=timeout,
                    check_same_thread=False,
                    uri=readonly,
                )
                self.path, self.readonly = shown, readonly
                self.connect()
                if readonly:
                    self._check_schema()
                else:
                    self._prepare_schema()
                self._check_columns()
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
                self.path, self.readonly = None, False
                if isinstance(exc, StoreUnavailable) and str(exc).startswith("path:"):
                    raise
                # Keep the kind (StoreCorrupt, StoreFull, ...) and the driver's error as the cause.
                kind = type(exc) if isinstance(exc, StoreUnavailable) else StoreUnavailable
                cause = exc.__cause__ if isinstance(exc, BatchError) and exc.__cause__ is not None else exc
                raise kind(f"path: cannot open {path!r} as a batch store: {exc}") from cause
            self._store_open = True

    def _set_pragmas(self, conn: sqlite3.Connection) -> None:
        """The pragmas, on every new connection; and no automatic checkpoint while the store does it."""
        super()._set_pragmas(conn)  # type: ignore[misc]
        if self._wal_index_path is not None:
            conn.execute("PRAGMA wal_autocheckpoint = 0")

    def close_store(self) -> None:
        """Close the store's connection, waiting for any transaction of another thread to end first."""
        with self.lock:
            self._refuse_inside_transaction("close_db")
            self._store_open = False
            self.writers.close()
            if not self.deferred:
                self._close_connection()

    def _refuse_inside_transaction(self, call: str) -> None:
        # With the lock held, an open transaction is this thread's own: closing would end it half-done.
        if self.in_transaction():
            raise BatchError(f"database: {call}() inside a transaction; end the transaction first")

    def checkpoint(self) -> None:
        """Copy the -wal file back into the database (a PASSIVE checkpoint) on a connection used for
        nothing else, without taking the lock, so other threads go on using the store meanwhile."""
        if self.deferred or self.readonly or self.database == ":memory:":
            return
        with self._checkpoint_lock:
            try:
                if self._checkpointer is None:
                    self._checkpointer = sqlite3.connect(
                        self.database, isolation_level=None, check_same_thread=False
                    )
                self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error as exc:
                if is_busy(exc):  # another process is checkpointing, which does the same work
                    return
                self.raise_store_error(exc)
                raise

    def bulk_writes(self) -> _BulkWrites:
        """Around many write transactions in a row (a sweep, an eviction): no COMMIT checkpoints under the
        lock; call ``checkpoint()`` between them, and one runs at the end."""
        return _BulkWrites(self)

    def execute_sql(self, sql: str, params: Sequence[Any] | None = None) -> BufferedCursor:
        with self.lock:
            try:
                return BufferedCursor(super().execute_sql(sql, params))  # type: ignore[no-untyped-call]
            except Exception as exc:
                self.raise_store_error(exc)
                raise
            finally:
                self.settle_writers()

    def atomic(self, *args: Any, **kwargs: Any) -> _Locked:  # type: ignore[override]
        return _Locked(self, lambda: super(SerializedSqliteDatabase, self).atomic(*args, **kwargs))

    def transaction(self, *args: Any, **kwargs: Any) -> _Locked:  # type: ignore[override]
        return _Locked(self, lambda: super(SerializedSqliteDatabase, self).transaction(*args, **kwargs))

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

    def write(self) -> _WriteTransaction:
        """The store's write transaction: BEGIN IMMEDIATE under the lock. Inside another transaction it
        is a savepoint. Any driver error leaving the block, a constraint violation included, becomes the
        package's error: StoreUnavailable (a lock held by another process past the busy timeout, say) or
        one of its subclasses."""
        return _WriteTransaction(self)

    def run_sql(self, sql: str, params: Sequence[Any]) -> sqlite3.Cursor:
        """Execute on the shared connection without Peewee's query wrapping. The caller holds the lock
        while it reads rows from the cursor; one-shot statements take it here. A constraint violation
        is a ``peewee.IntegrityError``; any other driver error is the package's StoreUnavailable (or a
        subclass)."""
        with self.lock:
            try:
                with _peewee_errors:
                    conn = self._state.conn
                    if conn is None:
                        self.connect()
                        conn = self._state.conn
                    return conn.execute(sql, params)  # type: ignore[no-any-return]
            except Exception as exc:
                self.raise_store_error(exc)
                raise
            finally:
                self.settle_writers()

    def fetch_all(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Every row of a query; errors as in :meth:`run_sql` (reading rows after the first steps the
        statement again, and can meet a damaged page or an I/O error too)."""
        with self.lock:
            cursor = self.run_sql(sql, params)
            try:
                return cursor.fetchall()
            except Exception as exc:
                self.raise_store_error(exc)
                raise

    def fetch_one(self, sql: str, params: Sequence[Any]) -> Any:
        """The first row of a query, or None; errors as in :meth:`fetch_all`."""
        with self.lock:
            cursor = self.run_sql(sql, params)
            try:
                return cursor.fetchone()
            except Exception as exc:
                self.raise_store_error(exc)
                raise

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        """Run one statement for each row, streaming ``rows``; return the rows changed. Errors as in
        :meth:`run_sql`."""
        with self.lock:
            try:
                with _peewee_errors:
                    cursor: sqlite3.Cursor = self.cursor()  # type: ignore[no-untyped-call]
                    cursor.executemany(sql, rows)
                    return cursor.rowcount
            except Exception as exc:
                self.raise_store_error(exc)
                raise

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
                with _peewee_errors:
                    conn.execute("ROLLBACK")
        finally:
            self.settle_writers()

    def set_variable_limit(self, limit: int) -> int:
        """Lower SQLite's bound-variable limit on this connection (for tests); return the old one."""
        with self.lock:
            conn: sqlite3.Connection = self.connection()  # type: ignore[no-untyped-call]
            return conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)

    # -- Schema: created, repaired and checked at open time --------------------------------------------

    def _prepare_schema(self) -> None:
        """Create what is missing, and recompute the byte total if anything was missing. Opening reads only
        the schema and the total's row, whatever the size of the store: a complete file is only read (so
        opening does not wait on another process's write), and a total another writer made drift is for
        ``check_store(repair=True)`` (``sift check --repair``) to find and mend."""
        present = {row[0] for row in self.execute_sql("SELECT name FROM sqlite_master")}
        if present >= SCHEMA_NAMES and self.execute_sql(TOTAL_NBYTES_SQL).fetchone() is not None:
            return
        with self.atomic():
            for statement in BASE_SCHEMA + SPEED_SCHEMA:
                self.execute_sql(statement)
            self.execute_sql(RECOMPUTE_TOTAL_SQL)

    def _check_schema(self) -> None:
        """A read-only store cannot add what is missing: refuse a file that lacks part of the schema."""
        present = {row[0] for row in self.execute_sql("SELECT name FROM sqlite_master")}
        if {"batch_job", "batch_target"} <= present:
            self._check_columns()  # tables another program made are the first thing to name
        if missing := sorted(READ_SCHEMA_NAMES - present):
            raise StoreUnavailable(
                f"path: {self.path!r} lacks {', '.join(missing)}; "
                "open it once without readonly=True to add them"
            )

    def _check_columns(self) -> None:
        """Refuse a file whose batch tables were made by someone else with other columns."""
        reference = sqlite3.connect(":memory:")
        try:
            for statement in BASE_SCHEMA:
                reference.execute(statement)
            for table in ("batch_job", "batch_target"):
                want = [row[1] for row in reference.execute(f"PRAGMA table_info({table})")]
                have = {row[1] for row in self.execute_sql(f"PRAGMA table_info({table})")}
                if missing := [name for name in want if name not in have]:
                    raise StoreUnavailable(f"table {table} lacks the column(s) {', '.join(missing)}")
        finally:
            reference.close()

    # -- SQLite's spellings of what the rules need (see Backend in database.py) ------------------------

    #: The running byte total kept by the triggers.
    total_nbytes_sql = TOTAL_NBYTES_SQL

    #: The order rows were inserted in: ties in created_at go to the later insert.
    insertion_order = peewee.SQL("_rowid_")

    @staticmethod
    def byte_length(expr: peewee.Node) -> peewee.Node:
        """The UTF-8 byte length of a TEXT expression (NULL stays NULL)."""
        return peewee.fn.length(peewee.Cast(expr, "BLOB"))

    @staticmethod
    def json_or_null(expr: peewee.Node) -> peewee.Node:
        """``expr`` when it is valid JSON text, else NULL (which the NOT NULL column then rejects)."""
        return peewee.Case(None, [(peewee.fn.json_valid(expr), expr)], None)

    # BEGIN IMMEDIATE holds the whole file from the first statement, so no rule needs a row lock, and no
    # transaction meets a deadlock: these are no-ops here (PostgreSQL's backend does the work).

    @staticmethod
    def lock_rows(query: peewee.Node, *, skip_locked: bool = False) -> peewee.Node:
        """``query`` as it is: SQLite has no ``FOR UPDATE``."""
        return query

    @staticmethod
    def require_claims() -> None:
        """A claim's statement uses ``UPDATE … FROM``, ``RETURNING`` and a ``MATERIALIZED`` CTE: an older
        SQLite library is refused by name, not with the syntax error it would give."""
        if sqlite3.sqlite_version_info < CLAIMS_NEED_SQLITE:
            raise StoreUnavailable(
                f"database: claim_batch_targets needs SQLite {'.'.join(map(str, CLAIMS_NEED_SQLITE[:2]))} "
                f"or later; this Python's sqlite3 module uses SQLite {sqlite3.sqlite_version}"
            )

    def removals(self) -> _WriteTransaction:
        """A sweep or eviction chunk's transaction: the write transaction."""
        return _WriteTransaction(self)

    def lock_job(self, job_id: str) -> None:
        pass

    def lock_target(self, job_id: str, idx: int) -> None:
        pass

    def lock_key(self, caller: str, idem_key: str) -> None:
        pass

    def retry(self, conflict: BaseException, run: Callable[[], Any]) -> Any:
        """SQLite raises no StoreConflict; should one arrive, it is not retried."""
        raise conflict


def _store_target(path: str | os.PathLike[str], readonly: bool) -> tuple[str, str]:
    """What to hand SQLite for ``path`` (a ``mode=ro`` URI when read-only), and the path to show; a
    path that cannot be a store file is refused with the reason."""
    shown = os.fspath(path)
    if not isinstance(shown, str):
        raise StoreUnavailable(f"path: must be a str or os.PathLike of str, got {type(path).__name__}")
    if not shown:
        raise StoreUnavailable("path: is empty; give the store file's path, or ':memory:' for a private one")
    if shown == ":memory:":
        if readonly:
            raise StoreUnavailable("path: a read-only store must be a file, not ':memory:'")
        return shown, shown
    full = os.path.abspath(shown)
    folder = os.path.dirname(full)
    if os.path.isdir(full):
        raise StoreUnavailable(f"path: {shown!r} is a directory, not a store file")
    if not os.path.isdir(folder):
        raise StoreUnavailable(f"path: the directory {folder!r} of {shown!r} does not exist")
    if not readonly:
        return full, shown  # absolute: a reconnection or a side connection after a chdir finds the same file
    if not os.path.isfile(full):
        raise StoreUnavailable(f"path: no store at {shown!r}")
    uri = f"file:{urllib.parse.quote(full)}?mode=ro"
    if os.access(folder, os.W_OK) or os.path.exists(full + "-shm") or not _is_wal_file(full):
        return uri, shown
    # SQLite reads a WAL file only with a -shm file beside it, which a folder we cannot write cannot get.
    # On a read-only file system nobody can write the file, so it can be read as it stands ("immutable");
    # elsewhere another user may write it while we read, and SQLite would then read torn pages.
    if not os.statvfs(folder).f_flag & os.ST_RDONLY:
        raise StoreUnavailable(
            f"path: {shown!r} is a WAL store in a directory this process cannot write, where SQLite cannot "
            "make the -shm file it needs to read it; read it as a user who can write there, or copy it"
        )
    if os.path.exists(full + "-wal") and os.path.getsize(full + "-wal") > 0:
        raise StoreUnavailable(
            f"path: {shown!r} has writes in its -wal file, and its read-only file system cannot hold the "
            "-shm file that reading them needs; copy the file and its -wal file to a writable directory"
        )
    return uri + "&immutable=1", shown


def _is_wal_file(path: str) -> bool:
    """Whether the SQLite file at ``path`` is in WAL mode (its header's read and write versions are 2)."""
    with open(path, "rb") as file:
        header = file.read(20)
    return header[18:20] == b"\x02\x02"
