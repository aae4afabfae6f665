"""The PostgreSQL store's change feed for :func:`sift.dcache.wait_for_batch_job`: one connection per
process, however many calls wait, LISTENs on ``sift_batch_job``, where the trigger of schema version 7
announces each job whose status or ``targets_done`` a transaction changed, at its commit. Its
``application_name`` is ``sift listener (pid N)``, for operators reading ``pg_stat_activity``.

A lost connection is made again (waits are then woken to read their job once more, as announcements made
meanwhile are lost); the connection is opened at the first wait and kept until the store is closed.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any

import psycopg

from ...errors import StoreUnavailable
from ...waiters import ChangeFeed, JobWaiters
from .base import PostgresBase

__all__ = ["CHANNEL", "NotifyFeed", "PostgresListener"]

#: The channel the trigger announces changed jobs on (the payload is ``[schema, job id]`` as JSON).
CHANNEL = "sift_batch_job"

# How long the listening thread blocks on the socket before it looks whether it should stop.
_STOP_CHECK_SECONDS = 0.5


class NotifyFeed:
    """Wakes the waits of each job announced on :data:`CHANNEL` for ``schema``."""

    def __init__(self, waiters: JobWaiters, store: PostgresListener) -> None:
        self._waiters = waiters
        self._store = store
        self._schema = store.schema
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._listening = threading.Event()
        self._conn: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def arm(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sift listener", daemon=True)
                self._thread.start()
        if not self._listening.wait(self._store.timeout + 1):
            problem = f" ({self._error})" if self._error is not None else ""
            raise StoreUnavailable.of_target(f"{self._store.path!r}: no connection to listen on{problem}")

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_STOP_CHECK_SECONDS * 4)

    def _run(self) -> None:
        pause = 0.1
        while not self._stopped.is_set():
            try:
                self._listen()
                pause = 0.1
            except psycopg.Error as exc:
                self._error = exc
            finally:
                self._listening.clear()
                self._close()
            self._waiters.wake(None)  # announcements made while no connection listened are lost
            self._stopped.wait(pause)
            pause = min(pause * 2, 5.0)

    def _listen(self) -> None:
        conn = self._store.listening_connection()
        with self._lock:
            self._conn = conn
        conn.execute(f"LISTEN {CHANNEL}")
        self._error = None
        self._listening.set()
        self._waiters.wake(None)
        while not self._stopped.is_set():
            for note in conn.notifies(timeout=_STOP_CHECK_SECONDS):
                job_id = self._job_id(note.payload)
                if job_id is not None:
                    self._waiters.wake(job_id)

    def _job_id(self, payload: str) -> str | None:
        with contextlib.suppress(ValueError, TypeError):
            schema, job_id = json.loads(payload)
            if schema == self._schema and isinstance(job_id, str):
                return job_id
        return None

    def _close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class PostgresListener(PostgresBase):
    """The waits of this process on the open PostgreSQL store, and their listening connection."""

    _waiters: JobWaiters | None = None
    _waiters_lock = threading.Lock()

    def job_waiters(self) -> JobWaiters:
        """This process's waits on the open store (made at the first wait)."""
        with self._waiters_lock:
            if self._waiters is None or self._waiters.pid != os.getpid():
                self._waiters = JobWaiters(self._change_feed)
            return self._waiters

    def stop_waits(self) -> None:
        """Stop listening: the store is closing."""
        with self._waiters_lock:
            waiters, self._waiters = self._waiters, None
        if waiters is not None and waiters.pid == os.getpid():  # never a forked parent's connection
            waiters.close()

    def _change_feed(self, waiters: JobWaiters) -> ChangeFeed:
        return NotifyFeed(waiters, self)

    def listening_connection(self) -> Any:
        """A new connection of the store's, in autocommit, named for ``pg_stat_activity``."""
        params = {**self.connect_params, "autocommit": True}
        params["application_name"] = f"sift listener (pid {os.getpid()})"
        return psycopg.connect(self.database, **params)
