"""The SQLite store's writers' queue and checkpoint policy.

Across processes, every write transaction of a file store first takes its place in the writers' queue, an
OS lock on ``<store>-lock`` (:mod:`.writer_queue` says why so), and leaves it when the connection is out of
the transaction again (:meth:`WalPolicy.settle_writers`, after every statement). SQLite's automatic
checkpoint would run inside the COMMIT that takes the ``-wal`` file past 1,000 pages, with the queue still
held: every other process's writer would wait for its copy and fsyncs. So a queued store turns it off and
applies the same rule itself (:meth:`WalPolicy.checkpoint_due`): once the queue is released, on a thread
of its own (the process's other threads write on meanwhile), or on the writing thread for a durable
store; and, once the file is long, with the queue still held, so that no process writes during that
checkpoint and the next write starts the file again from its beginning. Another process's checkpoint
holding SQLite's checkpoint lock then makes that one copy nothing: it is tried again for a moment.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
import threading
import time
from typing import Literal

from ...driver_errors import is_busy
from ...errors import BatchError
from .base import SqliteBase
from .settings import (
    CHECKPOINT_LINGER_S,
    CHECKPOINT_RETRY_S,
    CHECKPOINT_WAIT_S,
    SYNCHRONOUS_DURABLE,
    WAL_AUTOCHECKPOINT_PAGES,
    WAL_RESTART_FRAMES,
)
from .transactions import BulkWrites

__all__ = ["WalPolicy"]

#: Where a due checkpoint runs (:meth:`WalPolicy.checkpoint_due`).
CheckpointPlace = Literal["aside", "here", "queue held"]
#: What a round of the thread aside came to (:meth:`WalPolicy._checkpoint_round`).
RoundEnd = Literal["more", "held back", "done"]

#: The WAL index header's mxFrame (byte 16), the -wal file's salt (bytes 32 to 39, new each time the file
#: starts again) and nBackfill (byte 96), native byte order.
_WAL_INDEX_HEADER = struct.Struct("=16xI12x8s56xI")

#: What the WAL index header says of the -wal file: its frames, how many are copied back, its salt.
WalHeader = tuple[int, int, bytes]


def _frames_waiting(max_frame: int, backfilled: int) -> int:
    """The frames not yet copied back; every one when the header, read while the file starts again, shows
    its new count of frames beside the old count copied."""
    return max_frame - backfilled if max_frame >= backfilled else max_frame


class WalPolicy(SqliteBase):
    """The writers' queue around each write transaction, and checkpoints outside it."""

    #: ``<store>-shm`` (SQLite's WAL index), whose header says how many -wal frames await a checkpoint;
    #: None when SQLite checkpoints by itself (in memory, read-only, without the queue, or the index
    #: could not be read).
    _wal_index_path: str | None
    _wal_index: int | None
    _changes_seen: int  # the connection's total_changes when its last write transaction ended
    _checkpointer: sqlite3.Connection | None
    _checkpoint_lock: threading.Lock
    _checkpoint_thread: threading.Thread | None
    # the long file's last checkpoint waited for another process's until CHECKPOINT_WAIT_S, in vain: the next
    # ones try once, until a checkpoint of this store copies again
    _checkpoint_gave_up: bool
    # the file's salt and frames when the long file's checkpoint was last due
    _long_checkpoint_at: tuple[bytes, int]
    _checkpoint_stop: threading.Event  # the thread aside's: it makes no other round
    _aside_lock: threading.Lock  # around the three below
    _aside_running: bool  # a thread aside runs and will look at _aside_again before it ends
    _aside_again: bool  # a write asked it for another round
    _aside_asked: threading.Condition  # on _aside_lock: notified at each ask, and at close

    def enter_writers(self) -> None:
        """Take this store's place in the writers' queue, the connection opened first (so a process that
        cannot use the store fails at once, not after waiting its turn)."""
        if self._state.closed:
            self.connect()
        self.writers.acquire()

    def settle_writers(self) -> None:
        """Leave the writers' queue once the connection is out of its transaction, however it ended
        (COMMIT, ROLLBACK, a failed BEGIN, SQLite ending it after an error, a raw ``COMMIT``); then, if
        something was written, wake the change feed and checkpoint if due (:meth:`checkpoint_due`)."""
        conn = self._state.conn
        if conn is None or conn.in_transaction:
            if conn is None and self.writers.held:
                self.writers.release()
            return
        wrote = conn.total_changes != self._changes_seen
        self._changes_seen = conn.total_changes  # before the checkpoint's wait, which an interrupt may end
        due = None
        try:
            if wrote and self._wal_index_path is not None:
                due = self.checkpoint_due()
            if due == "queue held":  # before the queue is left: no process writes until the copy ends
                self._checkpoint_restarting()
        finally:
            if self.writers.held:
                self.writers.release()
            if wrote:
                self.nudge_waits()  # this process's waits see the commit now, not at the feed's next look
        if due == "aside":
            self._checkpoint_aside()
        elif due == "here":
            self._checkpoint_quietly()

    def checkpoint_due(self) -> CheckpointPlace | None:
        """SQLite's rule for its automatic checkpoint, applied by the store: once the -wal file holds
        WAL_AUTOCHECKPOINT_PAGES frames not yet copied back, a PASSIVE checkpoint is due. Where: "aside", on
        a thread of its own, the writes going on; "here", on the writing thread, the lock held (a durable
        store); "queue held", the writers' queue too, once the file holds WAL_RESTART_FRAMES frames (and,
        however few wait, each time it grew by WAL_AUTOCHECKPOINT_PAGES frames past them). None: not due;
        or the WAL index cannot be read, and SQLite checkpoints by itself again. The frames come from the
        WAL index header (:meth:`_wal_header`), read once after every write."""
        try:
            if self._wal_index is None:
                assert self._wal_index_path is not None
                flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW  # only the store's own
                self._wal_index = os.open(self._wal_index_path, flags)
            max_frame, backfilled, salt = self._wal_header()
        except (OSError, struct.error):  # unreadable, or shorter than its header
            self._wal_index_path = None
            with contextlib.suppress(Exception):
                self.run_sql(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}", ())
            return None
        waiting = _frames_waiting(max_frame, backfilled)
        last_salt, last_due = self._long_checkpoint_at
        since = last_due if last_salt == salt else 0  # past where it was last due, in this file
        # A checkpoint copies only the frames written before it began, and the -wal file starts again from
        # its beginning only once every frame is copied back: with writes going on beside it (this
        # process's threads, other processes) it would grow without end. So a long file is copied with
        # every writer held. It is due too, however few frames wait, once the file has grown by
        # WAL_AUTOCHECKPOINT_PAGES frames past WAL_RESTART_FRAMES or its last: checkpoints of other
        # connections, or one aside that began late, may have copied nearly every frame with writes beside
        # them. Once a growth of that many, not at every write: a reader of another process may keep the
        # file from starting again however often it is copied.
        if max_frame >= WAL_RESTART_FRAMES and (
            waiting >= WAL_AUTOCHECKPOINT_PAGES
            or max_frame >= max(WAL_RESTART_FRAMES, since) + WAL_AUTOCHECKPOINT_PAGES
        ):
            self._long_checkpoint_at = salt, max_frame
            return "queue held"
        if waiting < WAL_AUTOCHECKPOINT_PAGES:
            return None
        # With durable=True every commit syncs the -wal file, and commits beside a checkpoint were slower
        # than with it in their way: at FULL, bulk writes of 10 took 0.19-0.20 x huey's time against 0.13
        # (python scripts/bench --only peers --db sqlite).
        return "here" if self.synchronous_pragma == SYNCHRONOUS_DURABLE else "aside"

    def _checkpoint_aside(self) -> None:
        """A checkpoint on a thread of its own, the writing thread going on; while one runs, it is asked for
        another round instead. Called with the store's lock held, as ``close_wal_files`` is, which ends the
        thread and waits for it."""
        stop = threading.Event()
        thread = threading.Thread(
            target=self._checkpoint_catching_up, args=(stop,), name="sift-checkpoint", daemon=True
        )
        with self._aside_lock:
            if self._aside_running:
                self._aside_again = True
                self._aside_asked.notify()
                return
            # known before it starts: a close after an interrupt in start() still stops it
            self._aside_running = True
            self._checkpoint_thread, self._checkpoint_stop = thread, stop
        try:
            thread.start()
        except RuntimeError:  # no new thread now (an interpreter shutting down): here, as a durable store
            with self._aside_lock:
                self._aside_running = False
            self._checkpoint_quietly()

    def _checkpoint_catching_up(self, stop: threading.Event) -> None:
        """The thread aside: checkpoints while the last one copied more and WAL_AUTOCHECKPOINT_PAGES frames
        or more still wait, or a write asked for another meanwhile, until ``stop``. A checkpoint copies only
        the frames written before it began; the writes beside it would otherwise wait for a later write.
        One that a reader's older snapshot kept from copying anything waits CHECKPOINT_LINGER_S for a
        write's ask: while that reader reads, each write asks again (its end shows only in SQLite's locks),
        and a thread started for each would cost more than the copy of nothing it makes."""
        try:
            while True:
                end = self._checkpoint_round() if not stop.is_set() else "done"
                with self._aside_lock:  # a write's ask and this thread's end are one or the other
                    if end == "held back" and not (stop.is_set() or self._aside_again):
                        self._aside_asked.wait(CHECKPOINT_LINGER_S)
                    if stop.is_set() or not (end == "more" or self._aside_again):
                        self._aside_running = self._aside_again = False
                        return
                    self._aside_again = False
        except BaseException:
            with self._aside_lock:
                self._aside_running = self._aside_again = False
            raise

    def _checkpoint_round(self) -> RoundEnd:
        """One checkpoint aside, and what it came to: "more", it copied more and WAL_AUTOCHECKPOINT_PAGES
        frames or more still wait (written beside it), so another should follow; "held back", it copied
        nothing with that many waiting, as while a reader's older snapshot holds them back (another would
        copy nothing either, until that reader ends); "done", anything else."""
        try:
            _, copied_before = self._wal_frames()
        except (OSError, struct.error):  # the writes' next look gives the checkpoint back to SQLite
            return "done"
        if self._checkpoint_quietly():  # another process's checkpoint is copying them
            return "done"
        try:
            max_frame, copied = self._wal_frames()
        except (OSError, struct.error):
            return "done"
        if _frames_waiting(max_frame, copied) < WAL_AUTOCHECKPOINT_PAGES:
            return "done"
        return "more" if copied > copied_before else "held back"

    def _wal_header(self) -> WalHeader:
        """The -wal file's frames, how many of them are copied back, and its salt, from the WAL index header
        (sqlite.org/walformat: ``mxFrame`` at byte 16, the salt at byte 32, ``nBackfill`` at byte 96, native
        byte order), read in this one function; the index is opened by :meth:`checkpoint_due`."""
        assert self._wal_index is not None
        max_frame, salt, backfilled = _WAL_INDEX_HEADER.unpack_from(os.pread(self._wal_index, 100, 0))
        return max_frame, backfilled, salt

    def _wal_frames(self) -> tuple[int, int]:
        """The -wal file's frames, and how many of them are copied back (:meth:`_wal_header`)."""
        max_frame, backfilled, _ = self._wal_header()
        return max_frame, backfilled

    def _checkpoint_restarting(self) -> None:
        """The long file's checkpoint, every writer held. While another process's checkpoint holds SQLite's
        checkpoint lock, it copies nothing: tried again for at most CHECKPOINT_WAIT_S (a quarter of the
        timeout when shorter); once it gave up, once at each write that makes it due, until one copies."""
        wait = min(CHECKPOINT_WAIT_S, self.timeout / 4)
        deadline = time.monotonic() + wait
        tries = int(wait / CHECKPOINT_RETRY_S)  # a bound freezegun's frozen clock cannot lift
        while self._checkpoint_quietly():
            tries -= 1
            if self._checkpoint_gave_up or tries < 0 or time.monotonic() >= deadline:
                self._checkpoint_gave_up = True
                return
            time.sleep(CHECKPOINT_RETRY_S)

    def _checkpoint_quietly(self) -> bool:
        """``checkpoint()``, a store error left for a later write to try again; whether SQLite said it was
        busy. One that was not lets the long file's checkpoint wait again."""
        try:
            busy = self._checkpoint_once()
        except BatchError:
            return False
        if not busy:
            self._checkpoint_gave_up = False
        return busy

    def autocheckpoint_pages(self) -> int:
        """The connection's ``wal_autocheckpoint``: 0 while the store checkpoints after the queue."""
        return 0 if self._wal_index_path is not None else WAL_AUTOCHECKPOINT_PAGES

    def _set_pragmas(self, conn: sqlite3.Connection) -> None:
        """The pragmas, on every new connection; and no automatic checkpoint while the store does it.
        (Peewee's hook after each connect: a public one, ``pragmas=``, cannot depend on the store.)"""
        super()._set_pragmas(conn)  # type: ignore[misc]
        if self._wal_index_path is not None:
            conn.execute("PRAGMA wal_autocheckpoint = 0")

    def checkpoint(self, *, truncate: bool = False) -> None:
        """Copy the -wal file back into the database (a PASSIVE checkpoint) on a connection used for
        nothing else, without taking the lock, so other threads go on using the store meanwhile; with
        ``truncate``, also empty the -wal file when no other connection is using it (TRUNCATE)."""
        self._checkpoint_once(truncate=truncate)

    def _checkpoint_once(self, *, truncate: bool = False) -> bool:
        """:meth:`checkpoint`; whether SQLite said it was busy: another connection's checkpoint held its
        checkpoint lock, so nothing was copied (with ``truncate``: or a reader or writer kept it from
        ending)."""
        if self.deferred or self.readonly or self.database == ":memory:":
            return False
        with self._checkpoint_lock:
            try:
                if self._checkpointer is None:
                    self._checkpointer = sqlite3.connect(
                        self.database, isolation_level=None, check_same_thread=False
                    )
                    # its checkpoints write the database file: with the store's own durability
                    self._checkpointer.execute(f"PRAGMA synchronous = {self.synchronous_pragma}")
                mode = "TRUNCATE" if truncate else "PASSIVE"
                # its row: busy (1 when another connection's checkpoint held the lock), frames, copied
                busy, _, _ = self._checkpointer.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
            except sqlite3.Error as exc:
                if is_busy(exc):
                    return True
                self.raise_store_error(exc)
                raise
            return bool(busy)

    def bulk_writes(self) -> BulkWrites:
        """Around many write transactions in a row (a sweep, an eviction): no COMMIT checkpoints under the
        lock; call ``checkpoint()`` between them, and one runs at the end."""
        return BulkWrites(self)

    def close_wal_files(self) -> None:
        """Wait for a checkpoint running aside; close the checkpoints' connection and the WAL index."""
        running = self._checkpoint_thread
        if running is not None:
            self._checkpoint_stop.set()  # after the round under way: others' writes could keep it going
            with self._aside_lock:  # and not after its wait for an ask
                self._aside_asked.notify_all()
            with contextlib.suppress(RuntimeError):  # never started: start() failed, or was interrupted
                running.join()
            self._checkpoint_thread = None  # only now: a close interrupted while it waits waits again
        with self._aside_lock:  # a thread whose start was interrupted never said it ended
            self._aside_running = self._aside_again = False
        self._checkpoint_gave_up = False
        self._long_checkpoint_at = (b"", 0)
        with self._checkpoint_lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
        self.close_wal_index()

    def close_wal_index(self) -> None:
        if self._wal_index is not None:
            with contextlib.suppress(OSError):
                os.close(self._wal_index)
            self._wal_index = None
