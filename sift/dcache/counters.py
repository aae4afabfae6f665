"""Operation counters, reset by ``open_db`` and read with ``stats()``."""

import os
import threading
from collections.abc import Callable

COUNTER_NAMES = (
    "batch_job_hit",
    "batch_job_miss",
    "batch_targets_hit",
    "batch_targets_miss",
    "batch_idem_hit",
    "batch_idem_miss",
    "batch_write_miss",
    "invalid_input",
    "jobs_created",
    "targets_put",
    "target_writes",
    "jobs_swept",
    "jobs_evicted",
    "bytes_evicted",
    "jobs_marked_failed",
    "claims",
    "targets_claimed",
    "jobs_rescued",
    "claims_renewed",
    "claims_released",
    "targets_requeued",
    "targets_failed_stale",
    "late_writes_refused",
)


class Counters:
    """A fixed set of named integer counters, safe to bump from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(COUNTER_NAMES, 0)
        #: Called with every addition (prometheus_client's multiprocess counters); ``reset`` spares them.
        self._listeners: tuple[Callable[[str, int], None], ...] = ()

    def add(self, name: str, amount: int = 1) -> None:
        # acquire and release, not ``with``: every write calls this, and the block's protocol costs more
        # than the addition
        lock = self._lock
        lock.acquire()
        try:
            self._values[name] += amount
        finally:
            lock.release()
        if self._listeners:
            for listener in self._listeners:
                listener(name, amount)

    def add_event(self, name: str, counted: str, amount: int) -> None:
        """One more ``name`` and ``amount`` more ``counted`` (a claim, its targets), one hold of the lock."""
        lock = self._lock
        lock.acquire()
        try:
            values = self._values
            values[name] += 1
            values[counted] += amount
        finally:
            lock.release()
        if self._listeners:
            for listener in self._listeners:
                listener(name, 1)
                listener(counted, amount)

    def listen(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(name, amount)`` on every addition from now on (once, however often given)."""
        with self._lock:
            if listener not in self._listeners:
                self._listeners += (listener,)

    def reset(self) -> None:
        with self._lock:
            self._values = dict.fromkeys(COUNTER_NAMES, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


counters = Counters()


def _renew_lock_in_child() -> None:
    # A child forked while another thread held the lock would wait on it forever.
    counters._lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_lock_in_child)


def stats() -> dict[str, int]:
    """Counters since the last ``open_db``: hits and misses of each read, writes to unknown ids, work done."""
    return counters.snapshot()
