"""The runner's one writer: what its fetches say, written in few transactions (group commit).

Workers hand each outcome to :class:`Writer`; its thread takes whatever has arrived (up to
:data:`WRITE_BATCH` outcomes, waiting at most :data:`WRITE_WAIT` seconds for more once one is there) and
writes each job's results and failures in one ``update_batch_targets`` call, then its retries, then finishes
the jobs whose targets are all final. It writes at once, not waiting, when its runner has no fetch in flight
(:meth:`Writer.flush`): no more outcomes are on their way.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..dcache import (
    BatchError,
    ClaimLost,
    JobNotFound,
    TargetNotFound,
    finish_batch_job,
    retry_batch_target,
    update_batch_targets,
)

__all__ = ["WRITE_BATCH", "WRITE_WAIT", "Outcome", "Writer"]

log = logging.getLogger("sift.runner")

#: At most this many outcomes in one round of writes.
WRITE_BATCH = 256
#: Once an outcome has arrived, how long the writer waits for more before writing (seconds): the longest
#: a result waits to be written beyond the write itself.
WRITE_WAIT = 0.005


@dataclass(frozen=True)
class Outcome:
    """What a fetch of target ``idx`` of ``job_id`` came to: a write (``status`` done or failed, with its
    result, error and hint) or, with status pending, a retry not before ``not_before`` (``attempted``
    False: given back untried, its error kept when ``error`` is None)."""

    job_id: str
    idx: int
    status: str
    result: str | None = None
    error: str | None = None
    hint: str | None = None
    not_before: int | None = None
    attempted: bool = True


#: How long the writer waits before writing again a round the store refused (seconds).
RETRY_WAIT = 1.0

_STOP = object()
_FLUSH = object()


class Writer:
    """The writer thread of one runner, writing as ``runner``; ``tally(name, n)`` counts what it wrote."""

    def __init__(self, runner: str, tally: Any) -> None:
        self.runner = runner
        self.tally = tally
        self.queue: queue.Queue[Any] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name=f"sift-writer {runner}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, outcome: Outcome) -> None:
        self.queue.put(outcome)

    def flush(self) -> None:
        """Nothing more is on its way for now: write what has arrived without waiting for more."""
        self.queue.put(_FLUSH)

    def close(self, timeout: float) -> bool:
        """Write what has arrived, then stop; False if it was still writing after ``timeout`` seconds."""
        self.queue.put(_STOP)
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _next(self, wait: float | None) -> Any:
        """The next item, or None after ``wait`` seconds without one (None: wait for one)."""
        try:
            return self.queue.get(timeout=wait)
        except queue.Empty:
            return None

    def _loop(self) -> None:
        stopping = False
        carried: list[Outcome] = []  # a round that failed, written again first (a rewrite changes nothing)
        while not stopping:
            batch, carried = carried, []
            item = self._next(WRITE_WAIT if batch else None)
            deadline = time.monotonic() + WRITE_WAIT
            while item is not None:
                if item is _STOP:
                    stopping = True
                    break
                if item is _FLUSH:
                    if batch:
                        break
                else:
                    batch.append(item)
                    if len(batch) >= WRITE_BATCH:
                        break
                item = self._next(max(0.0, deadline - time.monotonic()))
            if batch:
                try:
                    self.write(batch)
                except Exception:
                    log.exception("sift runner %s: writing %d outcomes failed", self.runner, len(batch))
                    if not stopping:  # the store may come back: the claims are still this runner's
                        carried = batch
                        time.sleep(RETRY_WAIT)
                    # stopping: the runner releases what was not written

    def write(self, batch: list[Outcome]) -> None:
        """One round: each job's writes in one call, then the retries, then the jobs finished."""
        writes: dict[str, list[Outcome]] = defaultdict(list)
        for outcome in batch:
            if outcome.status == "pending":
                self._retry(outcome)
            else:
                writes[outcome.job_id].append(outcome)
        for job_id, outcomes in writes.items():
            if self._write_job(job_id, outcomes):
                finish_batch_job(job_id)

    def _write_job(self, job_id: str, outcomes: list[Outcome]) -> int:
        """The job's outcomes in one ``update_batch_targets`` call; a lost claim refuses the whole call and
        names its target, which is dropped (its holder writes it) before the call is made again."""
        entries = {o.idx: _entry(o) for o in outcomes}
        while entries:
            try:
                written = update_batch_targets(job_id, list(entries.values()), runner=self.runner)
            except ClaimLost as lost:
                self.tally("lost", 1)
                log.info("sift runner %s: %s", self.runner, lost)
                entries.pop(lost.idx)
                continue
            except (JobNotFound, TargetNotFound) as gone:  # swept or deleted meanwhile
                log.info("sift runner %s: %s", self.runner, gone)
                return 0
            for entry in entries.values():
                self.tally("done" if entry["status"] == "done" else "failed", 1)
            return written
        return 0

    def _retry(self, outcome: Outcome) -> None:
        try:
            retry_batch_target(
                outcome.job_id,
                outcome.idx,
                runner=self.runner,
                error=outcome.error,
                not_before=outcome.not_before,
                attempted=outcome.attempted,
            )
        except ClaimLost as lost:
            self.tally("lost", 1)
            log.info("sift runner %s: %s", self.runner, lost)
        except BatchError as exc:
            log.info("sift runner %s: %s", self.runner, exc)
        else:
            self.tally("retried" if outcome.attempted else "given_back", 1)


def _entry(outcome: Outcome) -> dict[str, Any]:
    entry: dict[str, Any] = {"idx": outcome.idx, "status": outcome.status}
    for name in ("result", "error", "hint"):
        if getattr(outcome, name) is not None:
            entry[name] = getattr(outcome, name)
    return entry
