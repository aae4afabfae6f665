"""The runner's one writer: what its fetches say, written in few transactions (group commit).

Workers hand each outcome to :class:`Writer`; its thread takes whatever has arrived (up to
:data:`WRITE_BATCH` outcomes, waiting at most :data:`WRITE_WAIT` seconds for more once one is there) and
writes its retries, then each job's results and failures in one ``update_batch_targets`` call, then
finishes the jobs whose targets are all final. It writes at once, not waiting, when its runner says no
more outcomes are on their way (:meth:`Writer.flush`): no fetch in flight, and no claim under way nor one
to come whose outcomes it would wait for.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple

from ..dcache import (
    BatchError,
    BatchTarget,
    ClaimLost,
    InvalidBatchInput,
    JobNotFound,
    TargetNotFound,
    finish_batch_job,
    retry_batch_targets,
    update_batch_targets,
)
from .outcomes import storable_message

__all__ = ["WRITE_BATCH", "WRITE_WAIT", "Outcome", "Writer"]

log = logging.getLogger("sift.runner")

#: At most this many outcomes in one round of writes.
WRITE_BATCH = 256
#: Once an outcome has arrived, how long the writer waits for more before writing (seconds): the longest
#: a result waits to be written beyond the write itself.
WRITE_WAIT = 0.005


class Outcome(NamedTuple):
    """What a fetch of target ``idx`` of ``job_id`` came to: a write (``status`` done or failed, with its
    result, error and hint) or, with status pending, a retry not before ``not_before`` (``attempted``
    False: given back untried, its error kept when ``error`` is None). ``claim``: the claimed target it
    says of, which tells one claim of a target from another. A tuple: a worker makes one a target, a third
    of a frozen dataclass's time."""

    job_id: str
    idx: int
    status: str
    result: str | None = None
    error: str | None = None
    hint: str | None = None
    not_before: int | None = None
    attempted: bool = True
    claim: BatchTarget | None = None


#: How long the writer waits before writing again a round the store refused (seconds).
RETRY_WAIT = 1.0

#: ``Writer._wake_at`` while the writer is writing: no arrival wakes it.
_WRITING = sys.maxsize


class Writer:
    """The writer thread of one runner, writing as ``runner``; ``tally(name, n)`` counts what it wrote.

    Outcomes wait in a list under one lock. An arrival wakes the thread only when it is what the thread
    waits for (the first outcome of a round, or a full round): a handoff is an append, not a queue's
    wakeup per outcome."""

    def __init__(
        self,
        runner: str,
        tally: Any,
        settled: Callable[[list[Outcome], list[Outcome]], None] | None = None,
        sending: Callable[[list[Outcome]], AbstractContextManager[list[Outcome]]] | None = None,
    ) -> None:
        self.runner = runner
        self.tally = tally
        # settled(outcomes, left): what of a round's outcomes is done with (its put-backs before claims go on)
        self.settled = settled
        # sending(put_back): around a round's retries and give-backs, those to send
        self.sending = sending
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._inbox: list[Outcome] = []
        self._wake_at = _WRITING  # how many waiting outcomes wake the thread
        self._now = False  # write what has arrived without waiting for more
        self._closing = False
        self._close_by = float("inf")  # once closing: until when a round the store refused is tried again
        self.thread = threading.Thread(target=self._loop, name=f"sift-writer {runner}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, outcome: Outcome) -> None:
        with self._lock:
            self._inbox.append(outcome)
            if len(self._inbox) >= self._wake_at:
                self._wake_at = _WRITING
                self._arrived.notify()

    def would_wait(self, seconds: float) -> bool:
        """Whether outcomes ``seconds`` after the first of a round could still join it (``WRITE_WAIT``)."""
        return seconds < WRITE_WAIT

    def flush(self) -> None:
        """Nothing more is on its way for now: write what has arrived without waiting for more."""
        with self._lock:
            self._now = True
            self._arrived.notify()

    def close(self, timeout: float) -> bool:
        """Write what has arrived, then stop; False if it was still writing after ``timeout`` seconds. A round
        the store refuses is written again (every ``RETRY_WAIT``) while the time left allows."""
        with self._lock:
            self._closing = True
            self._close_by = time.monotonic() + timeout
            self._arrived.notify()
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _gather(self, carried: list[Outcome]) -> tuple[list[Outcome], bool]:
        """The next round: ``carried`` and what arrives, up to :data:`WRITE_BATCH` outcomes, waiting for
        the first, then at most :data:`WRITE_WAIT` seconds for more; and whether the writer then stops
        (closed, with nothing left to write)."""
        with self._lock:
            while not (self._inbox or carried or self._closing):
                self._now = False  # a flush with nothing to write: the next outcome may wait for more
                self._wake_at = 1
                self._arrived.wait()
            deadline = time.monotonic() + WRITE_WAIT
            while len(carried) + len(self._inbox) < WRITE_BATCH and not (self._now or self._closing):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wake_at = WRITE_BATCH - len(carried)
                self._arrived.wait(left)
            self._wake_at = _WRITING
            take = max(0, WRITE_BATCH - len(carried))
            batch = carried + self._inbox[:take]
            del self._inbox[:take]
            if not self._inbox:
                self._now = False
            return batch, self._closing and not self._inbox

    def _loop(self) -> None:
        carried: list[Outcome] = []  # what the store could not take, written again first
        while True:
            batch, stopping = self._gather(carried)
            carried = self._round(batch) if batch else []
            del batch  # written: its outcomes (results, claimed targets) are not kept through the next wait
            if not carried:
                if stopping:
                    return
                continue
            # closing, with outcomes still to come (more than a round's) or not: the close's time bounds it
            if self._closing and time.monotonic() + RETRY_WAIT >= self._close_by:
                return  # the runner releases what was not written
            time.sleep(RETRY_WAIT)  # the store may come back: the claims are still this runner's

    def _round(self, batch: list[Outcome]) -> list[Outcome]:
        """``write(batch)``; what the store could not take, to be written again (after an error it did not
        foresee, every outcome it had not settled)."""
        settled: set[int] = set()
        try:
            return self.write(batch, settled)
        except Exception:
            log.exception("sift runner %s: writing %d outcomes failed", self.runner, len(batch))
            return [outcome for outcome in batch if id(outcome) not in settled]  # a rewrite changes nothing

    def write(self, batch: list[Outcome], settled: set[int] | None = None) -> list[Outcome]:
        """One round: the retries and give-backs (those ``sending`` lets through), then each job's writes in
        one call, then the jobs finished; each outcome settled once done with (its ``id`` added to
        ``settled``). Returns what the store could not take now (unavailable, say), to be written again."""
        writes: dict[str, list[Outcome]] = defaultdict(list)
        # a target's result sent again beside its next claim's outcome: the result is written (in a round
        # of its own too, the retry would then find its claim ended), and the retry is not
        finished = {(outcome.job_id, outcome.idx) for outcome in batch if outcome.status != "pending"}
        put_back: list[Outcome] = []
        rest: list[Outcome] = []
        for outcome in batch:
            if outcome.status != "pending":
                writes[outcome.job_id].append(outcome)
            elif (outcome.job_id, outcome.idx) in finished:
                self.tally("lost", 1)
            else:
                put_back.append(outcome)
                continue
            rest.append(outcome)
        left: list[Outcome] = []
        if put_back:
            with self.sending(put_back) if self.sending is not None else nullcontext(put_back) as kept:
                by_job: dict[str, list[Outcome]] = defaultdict(list)
                for outcome in kept:
                    by_job[outcome.job_id].append(outcome)
                for job_id, outcomes in by_job.items():
                    left += self._retry_job(job_id, outcomes)
                # before claims go on: a claim of a target put back, even one in doubt, is then no earlier one
                self._settle(put_back, left, settled)
        for job_id, outcomes in writes.items():
            try:
                written, unwritten = self._write_job(job_id, outcomes)
            except Exception:
                log.exception("sift runner %s: writing %d outcomes failed", self.runner, len(outcomes))
                left += outcomes
                continue
            left += unwritten
            if written:
                try:
                    finish_batch_job(job_id)
                except JobNotFound as gone:  # swept or deleted since its last write
                    log.info("sift runner %s: %s", self.runner, gone)
                except Exception:  # written: the keeper's finish_complete_jobs finishes the job
                    log.exception("sift runner %s: finishing job %s failed", self.runner, job_id)
        self._settle(rest, left, settled)
        return left

    def _settle(self, outcomes: list[Outcome], left: list[Outcome], settled: set[int] | None) -> None:
        """``outcomes`` done with, but those ``left`` to be written again: their claims let go of."""
        if self.settled is not None and outcomes:
            self.settled(outcomes, left)
        if settled is not None:
            carried = {id(outcome) for outcome in left}
            settled.update(id(outcome) for outcome in outcomes if id(outcome) not in carried)

    def _write_job(self, job_id: str, outcomes: list[Outcome]) -> tuple[int, list[Outcome]]:
        """The job's outcomes in one ``update_batch_targets`` call; a lost claim refuses the whole call and
        names its target, which is dropped (its holder writes it) before the call is made again, and after a
        second lost claim the rest go one a call (a round of many, a job cancelled or a runner taken for
        dead, stays linear); an outcome the store refuses (its text) fails its target alone, with the
        refusal as its error. Returns how many targets were written, and what to write again: after an
        error the store did not foresee, the outcomes neither written nor dropped yet."""
        entries: dict[int, dict[str, Any]] = {}
        # two outcomes of one target (one sent again, beside its next claim's): a result over a failure, else
        # the first
        for outcome in outcomes:
            kept = entries.get(outcome.idx)
            if kept is None or (kept["status"] == "failed" and outcome.status == "done"):
                entries[outcome.idx] = _entry(outcome)
        superseded = len(outcomes) - len(entries)  # outcomes of a target beyond the one kept
        failed_here: set[int] = set()  # entries refused once, and written as failures since
        unwritten: list[Outcome] = []
        lost = done = written = 0
        while entries:
            call = list(entries.values()) if lost < 2 else [next(iter(entries.values()))]
            try:
                written += update_batch_targets(job_id, call, runner=self.runner)
            except ClaimLost as refused:
                lost += 1
                self.tally("lost", 1)
                log.info("sift runner %s: %s", self.runner, refused)
                entries.pop(refused.idx)
                continue
            except InvalidBatchInput as refused:
                # Written again as it is, the round would be refused for ever, and every outcome after it
                # with it: the refused one becomes a failure this call can write.
                at = _REFUSED_ENTRY.match(refused.field or "")
                if at is None or int(at[1]) >= len(call):
                    raise
                idx = call[int(at[1])]["idx"]
                log.error("sift runner %s: target %r of job %s: %s", self.runner, idx, job_id, refused)
                if idx in failed_here or (refused.field or "").endswith(".idx"):
                    del entries[idx]  # no target's write at all: nothing of it can be written
                    continue
                failed_here.add(idx)
                error = storable_message(f"the store refused its outcome: {refused}")
                entries[idx] = {"idx": idx, "status": "failed", "error": error}
                continue
            except (JobNotFound, TargetNotFound) as gone:  # swept or deleted meanwhile
                log.info("sift runner %s: %s", self.runner, gone)
                break
            except Exception:  # the store away, say: what is neither written nor dropped goes again
                log.exception("sift runner %s: writing %d outcomes failed", self.runner, len(entries))
                unwritten = [outcome for outcome in outcomes if outcome.idx in entries]
                break
            for entry in call:
                done += entry["status"] == "done"
                del entries[entry["idx"]]
        if written:
            # an outcome superseded by another of its target's is counted lost, unless it is written again
            superseded -= len(unwritten) - len({outcome.idx for outcome in unwritten})
            for name, count in (("done", done), ("failed", written - done), ("lost", superseded)):
                if count:
                    self.tally(name, count)
        return written, unwritten

    def _retry_job(self, job_id: str, outcomes: list[Outcome]) -> list[Outcome]:
        """The job's retries and give-backs in one ``retry_batch_targets`` call; what the store could not
        take now, to be sent again. Once a call is refused (a lost claim, a target gone, a retry the store
        refuses: each dropped, as a lone retry would be), the rest are sent one a call, as is a second
        outcome of one target: each is then taken or refused alone. A job gone drops them all."""
        first: dict[int, Outcome] = {}
        again: list[list[Outcome]] = []  # sent one a call, after the first call
        for outcome in outcomes:
            if outcome.idx in first:
                again.append([outcome])
            else:
                first[outcome.idx] = outcome
        calls: list[list[Outcome]] = [list(first.values()), *again]
        left: list[Outcome] = []
        while calls:
            call = calls.pop(0)
            try:
                retry_batch_targets(job_id, [_retry_entry(outcome) for outcome in call], runner=self.runner)
            except (ClaimLost, TargetNotFound, InvalidBatchInput) as refused:
                dropped = self._refused(job_id, call, refused)
                if len(call) > 1:  # refused as a whole: the rest, each alone
                    calls = [[outcome] for outcome in call if outcome is not dropped] + calls
                continue
            except JobNotFound as gone:  # swept or deleted meanwhile
                log.info("sift runner %s: %s", self.runner, gone)
                return left
            except Exception:
                log.exception(
                    "sift runner %s: putting back %d of job %s's targets failed",
                    self.runner,
                    len(call),
                    job_id,
                )
                left += call
                continue
            tried = sum(outcome.attempted for outcome in call)
            for name, count in (("retried", tried), ("given_back", len(call) - tried)):
                if count:
                    self.tally(name, count)
        return left

    def _refused(self, job_id: str, call: list[Outcome], refused: BatchError) -> Outcome | None:
        """The outcome of ``call`` whose put-back the store refused, logged and counted (a lost claim), never
        to be sent again; None when the refusal names none of them (a lone outcome is then dropped too)."""
        if isinstance(refused, InvalidBatchInput):
            at = _REFUSED_RETRY.match(refused.field or "")
            if at is None or int(at[1]) >= len(call):
                log.warning("sift runner %s: job %s: %s", self.runner, job_id, refused)
                return None
            outcome = call[int(at[1])]
            log.warning("sift runner %s: target %d of job %s: %s", self.runner, outcome.idx, job_id, refused)
            return outcome
        if isinstance(refused, ClaimLost):
            self.tally("lost", 1)
        log.info("sift runner %s: %s", self.runner, refused)
        idx = refused.idx if isinstance(refused, ClaimLost | TargetNotFound) else None
        return next((outcome for outcome in call if outcome.idx == idx), None)


#: The entry an ``update_batch_targets`` refusal names: ``results[3].result``.
_REFUSED_ENTRY = re.compile(r"results\[(\d+)\]")
#: The entry a ``retry_batch_targets`` refusal names: ``retries[3].not_before``.
_REFUSED_RETRY = re.compile(r"retries\[(\d+)\]")


def _entry(outcome: Outcome) -> dict[str, Any]:
    entry: dict[str, Any] = {"idx": outcome.idx, "status": outcome.status}
    if outcome.result is not None:
        entry["result"] = outcome.result
    if outcome.error is not None:
        entry["error"] = outcome.error
    if outcome.hint is not None:
        entry["hint"] = outcome.hint
    return entry


def _retry_entry(outcome: Outcome) -> dict[str, Any]:
    return {
        "idx": outcome.idx,
        "error": outcome.error,
        "not_before": outcome.not_before,
        "attempted": outcome.attempted,
    }
