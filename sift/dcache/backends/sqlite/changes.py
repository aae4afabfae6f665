"""The SQLite store's change feed for :func:`sift.dcache.wait_for_batch_job`: while anyone in the process
waits, one thread reads ``PRAGMA data_version`` on a private read-only connection every
:data:`POLL_SECONDS`, and at once after each write of this process's shared connection; when another
connection (of any process, this one's shared connection included) has committed, it reads the waited
jobs' status and count there and wakes the waits of those that moved.

An in-memory store has only the shared connection: the thread watches its ``total_changes`` and wakes every
wait, each reading its job again.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from ...tables import JOB_TABLE
from ...waiters import ChangeFeed, JobWaiters
from .base import SqliteBase

__all__ = ["POLL_SECONDS", "DataVersionFeed", "SqliteChanges"]

#: How often a waiting process looks for a commit, in seconds: a wait ends within about this much of the
#: commit that ends it, and an idle store costs one cheap pragma per interval while anyone waits.
POLL_SECONDS = 0.005

# The jobs read per statement: well under SQLite's limit on a statement's parameters.
_JOBS_PER_READ = 500


class DataVersionFeed:
    """Announces commits seen by ``token`` (a value that changes with each commit) to ``waiters``; with a
    private connection, only the jobs whose status or ``targets_done`` moved."""

    def __init__(
        self, waiters: JobWaiters, token: Callable[[], Any], conn: sqlite3.Connection | None = None
    ) -> None:
        self._waiters = waiters
        self._token = token
        self._conn = conn
        self._lock = threading.Lock()  # the private connection is used by the thread and by arm()
        self._stopped = threading.Event()
        self._busy = threading.Event()  # set while anyone waits: the thread sleeps otherwise
        self._poke = threading.Event()  # set by a write of this process: look now
        self._seen: dict[str, tuple[str, int] | None] = {}
        self._last: Any = None
        self._thread: threading.Thread | None = None

    def arm(self) -> None:
        with self._lock:
            if not self._busy.is_set():  # the thread was idle: its last reading may be old
                self._last = self._token()
                self._busy.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sift change feed", daemon=True)
                self._thread.start()

    def nudge(self) -> None:
        """This process has just written: look now rather than at the end of the interval."""
        self._poke.set()

    def stop(self) -> None:
        self._stopped.set()
        self._busy.set()
        self._poke.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._busy.wait()
            self._poke.wait(POLL_SECONDS)
            self._poke.clear()  # a write after this is seen by the look below, or pokes again
            if self._stopped.is_set():
                return
            try:
                moved = self._look()
            except sqlite3.Error:  # e.g. the file went away: the waits read it themselves and see why
                moved = [None]
                self._stopped.wait(1.0)
            for job_id in moved:
                self._waiters.wake(job_id)

    def _look(self) -> list[str | None]:
        """The jobs to wake after one look at the store."""
        with self._lock:
            job_ids = self._waiters.job_ids()
            if not job_ids:
                self._busy.clear()
                self._seen.clear()
                return []
            token = self._token()
            if token == self._last:
                return []
            self._last = token
            return self._moved(job_ids)

    def _moved(self, job_ids: list[str]) -> list[str | None]:
        """The waited jobs whose status or count differs from the last reading (all of them: [None],
        without a private connection)."""
        if self._conn is None:
            return [None]
        now: dict[str, tuple[str, int]] = {}
        for start in range(0, len(job_ids), _JOBS_PER_READ):
            chunk = job_ids[start : start + _JOBS_PER_READ]
            marks = ", ".join("?" * len(chunk))
            sql = f"SELECT id, status, targets_done FROM {JOB_TABLE} WHERE id IN ({marks})"
            now.update((row[0], (row[1], row[2])) for row in self._conn.execute(sql, chunk))
        moved: list[str | None] = []
        for job_id in job_ids:
            current = now.get(job_id)
            if job_id not in self._seen or self._seen[job_id] != current:
                moved.append(job_id)
            self._seen[job_id] = current
        for job_id in set(self._seen) - set(job_ids):
            del self._seen[job_id]
        return moved


class SqliteChanges(SqliteBase):
    """The waits of this process on the open SQLite store, and their change feed."""

    _waiters: JobWaiters | None = None
    _feed: DataVersionFeed | None = None

    def job_waiters(self) -> JobWaiters:
        """This process's waits on the open store (made at the first wait)."""
        with self.lock:
            if self._waiters is None or self._waiters.pid != os.getpid():
                self._waiters = JobWaiters(self._change_feed)
            return self._waiters

    def stop_waits(self) -> None:
        """Stop the change feed: the store is closing."""
        waiters, self._waiters, self._feed = self._waiters, None, None
        if waiters is not None and waiters.pid == os.getpid():
            waiters.close()

    def nudge_waits(self) -> None:
        """After a write of the shared connection: the feed, if any, looks now."""
        feed = self._feed
        if feed is not None:
            feed.nudge()

    def _change_feed(self, waiters: JobWaiters) -> ChangeFeed:
        if self.deferred:
            self.connect()  # raises the store's error when nothing is open
        if self.file in (None, ":memory:"):
            shared = self.connection()
            feed = DataVersionFeed(waiters, lambda: shared.total_changes)
        else:
            conn = self.private_reader()
            feed = DataVersionFeed(waiters, lambda: conn.execute("PRAGMA data_version").fetchone()[0], conn)
        self._feed = feed
        return feed
