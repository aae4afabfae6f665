"""The waits of one process on one store (:class:`JobWaiters`), which the backend's change feed wakes.

A wait registers first, then reads its job, then sleeps until woken: the feed is armed before that read,
so a change committed after it always wakes the wait (see :func:`sift.dcache.wait_for_batch_job`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Protocol

__all__ = ["ChangeFeed", "JobWaiters", "Waker"]


class Waker(Protocol):
    """What a waiting call sleeps on: ``set()`` wakes it, from any thread."""

    def set(self) -> None: ...


class ChangeFeed(Protocol):
    """A backend's source of changes, calling ``wake(job_id)`` for a changed job, ``wake(None)`` when any
    job may have changed."""

    def arm(self) -> None:
        """Return once every change committed from now on will be announced."""

    def stop(self) -> None:
        """Stop announcing, and let go of what it holds (a thread, a connection)."""


class JobWaiters:
    """The waits of this process on the open store: each waiting call's :class:`Waker`, by job id."""

    def __init__(self, make_feed: Callable[[JobWaiters], ChangeFeed]) -> None:
        self.pid = os.getpid()
        self._make_feed = make_feed
        self._feed: ChangeFeed | None = None
        self._lock = threading.Lock()
        self._arming = threading.Lock()  # one caller starts the feed; the others wait for it
        self._wakers: dict[str, set[Waker]] = {}

    def add(self, job_id: str, waker: Waker) -> None:
        """Register ``waker`` for ``job_id``; return once a change committed after this call will wake it."""
        with self._lock:
            self._wakers.setdefault(job_id, set()).add(waker)
        try:
            with self._arming:
                if self._feed is None:
                    self._feed = self._make_feed(self)
                self._feed.arm()
        except BaseException:
            self.remove(job_id, waker)
            raise

    def remove(self, job_id: str, waker: Waker) -> None:
        with self._lock:
            wakers = self._wakers.get(job_id)
            if wakers is not None:
                wakers.discard(waker)
                if not wakers:
                    del self._wakers[job_id]

    def job_ids(self) -> list[str]:
        """The jobs waited for now."""
        with self._lock:
            return list(self._wakers)

    def wake(self, job_id: str | None) -> None:
        """Wake the waits for ``job_id``, or every wait (None)."""
        with self._lock:
            if job_id is None:
                wakers = [w for group in self._wakers.values() for w in group]
            else:
                wakers = list(self._wakers.get(job_id, ()))
        for waker in wakers:
            waker.set()

    def close(self) -> None:
        """Stop the feed (the store is closing); waits still running are woken to read once more."""
        with self._arming:
            feed, self._feed = self._feed, None
        if feed is not None:
            feed.stop()
        self.wake(None)
