"""The single-process simulation's simulated clock, and its tally of what the calls returned."""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["SimClock", "Tally"]


class SimClock:
    """The simulated clock: advances a fixed step per target written; says when a sweep is due."""

    def __init__(self, start: int, step: int, sweep_every: int) -> None:
        self._lock = threading.Lock()
        self._now = start
        self.start = start
        self.step = step
        self.sweep_every = max(1, sweep_every)
        self._next_sweep = start + self.sweep_every

    def now(self) -> int:
        with self._lock:
            return self._now

    def tick(self) -> tuple[int, bool]:
        """Advance one step; return the new time and whether a sweep is due at it."""
        with self._lock:
            self._now += self.step
            due = self._now >= self._next_sweep
            if due:
                self._next_sweep = self._now + self.sweep_every
            return self._now, due


@dataclass
class Tally:
    """What the run did, counted as the calls returned."""

    submissions: int = 0
    jobs_created: int = 0
    idem_hits: int = 0
    idem_wrong: int = 0
    idem_started_anew: int = 0
    polls: int = 0
    claims: int = 0
    targets_claimed: int = 0
    targets_written: int = 0
    targets_failed: int = 0
    targets_lost: int = 0
    claims_lost: int = 0
    stale_requeued: int = 0
    stale_failed: int = 0
    sweeps: int = 0
    jobs_swept: int = 0
    jobs_evicted: int = 0
    restart_requeued: int = 0
    restart_failed: int = 0
