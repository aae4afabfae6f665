"""Claims: runners take pending targets, keep them with a heartbeat, and give back what they cannot finish.

A claim is the runner's, not the job's: its ``runner``, ``heartbeat`` and ``attempts`` live on the target,
and the job's lease (its client's keep-alive) never renews a claim. Each function is one transaction; one
with nothing to write (no stale claim, a job not complete) makes one read instead.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

import peewee

from . import validation
from .claimorder import LOCK_RING, ClaimOrder
from .clock import unix_now_ms
from .counters import counters
from .database import db, retried
from .errors import JobNotFound
from .models import LIVE_JOB_STATUSES, TARGET_COLUMNS, BatchJob, BatchTarget, JobStatus, TargetStatus
from .politeness import PACING_SLACK, SEND_WINDOW
from .statements import Slot, Statement, literal
from .validation import Duration

__all__ = [
    "claim_batch_targets",
    "finish_batch_job",
    "finish_complete_jobs",
    "release_claims",
    "renew_claims",
    "requeue_in_flight",
    "requeue_stale_claims",
    "runner_name",
    "stale_claims",
]

J = BatchJob
T = BatchTarget
Inline = peewee.ValueLiterals


def _running(target: Any = T) -> peewee.Node:
    """``target`` is running: the partial index batch_target_running holds exactly these, by runner."""
    return Inline(target.status == TargetStatus.RUNNING.value)


def _stale() -> peewee.Node:
    """A running target whose claim was last renewed at ``cutoff`` or before, held by ``runner`` unless it is
    NULL (any runner); a target set running by a program that records no heartbeat (the original service, a
    restore) is stale at once."""
    stale = _running() & (peewee.fn.COALESCE(T.heartbeat, 0) <= Slot("cutoff"))
    return stale & (peewee.Cast(Slot("runner"), "TEXT").is_null() | (T.runner == Slot("runner")))


_UNCLAIM = {T.runner: None, T.heartbeat: None}
# The runner's claims that no other transaction holds, locked and then renewed by their address: a claim
# whose row is held is being ended (its result written, its target put back or requeued), and a renewal that
# waited for it would wait in the other order from a write of many targets (PostgreSQL: a deadlock).
_RENEW = Statement(
    lambda: T.update({T.heartbeat: Slot("now")}).where(
        db.backend.among(
            db.backend.row_address,
            db.backend.lock_rows(
                T.select(db.backend.row_address).where((T.runner == Slot("runner")) & _running()),
                skip_locked=True,
            ),
        )
    )
)
# A clean shutdown's release gives the attempt back: only a claim that went stale counts against a target.
_RELEASE = Statement(
    lambda: T.update(
        {T.status: Inline(peewee.Value(TargetStatus.PENDING.value)), T.attempts: T.attempts - 1, **_UNCLAIM}
    ).where((T.runner == Slot("runner")) & _running())
)
# The jobs of stale targets, locked (in id order) before their targets, as every target write locks them;
# found by id among the running targets' jobs (a semi-join was planned as a scan of every job).
_STALE_JOBS = Statement(
    lambda: db.backend.lock_rows(
        J.select(J.id).where(db.backend.among(J.id, T.select(T.job_id).where(_stale()))).order_by(J.id)
    )
)
_FAIL_STALE = Statement(
    lambda: (
        T.update(
            {T.status: Inline(peewee.Value(TargetStatus.FAILED.value)), T.error: Slot("reason"), **_UNCLAIM}
        )
        .where(_stale() & (T.attempts >= Slot("max_attempts")))
        .returning(T.job_id)
    )
)
_REQUEUE_STALE = Statement(
    lambda: T.update({T.status: Inline(peewee.Value(TargetStatus.PENDING.value)), **_UNCLAIM}).where(_stale())
)
# Whether any claim is stale: a keeper's requeue finds none most rounds, and then writes nothing.
_ANY_STALE = Statement(lambda: T.select(T.idx).where(_stale()).limit(literal(1)))
# Unordered: ORDER BY (job_id, idx) would have SQLite walk every target in key order; stale_claims sorts.
_STALE_CLAIMS = Statement(lambda: T.select(*[getattr(T, n) for n in TARGET_COLUMNS]).where(_stale()))
_COUNT_FAILED = Statement(
    lambda: J.update({J.targets_done: J.targets_done + Slot("failed"), J.lease: Slot("now")}).where(
        J.id == Slot("job_id")
    )
)


def _finished_status() -> peewee.Node:
    """A job whose every target is final: done when none failed, failed when all did, else partial."""
    failed = T.select(peewee.fn.COUNT(peewee.SQL("*"))).where(
        (T.job_id == J.id) & Inline(T.status == TargetStatus.FAILED.value)
    )
    return peewee.Case(
        None,
        [(failed == 0, JobStatus.DONE.value), (failed >= J.targets_total, JobStatus.FAILED.value)],
        JobStatus.PARTIAL.value,
    )


# The job, locked before its targets are counted: on PostgreSQL every target write holds it, so the count
# that follows, in a statement of its own (a snapshot taken after the lock), sees each write committed.
_LOCK_JOB = Statement(lambda: db.backend.lock_rows(J.select(J.status).where(J.id == Slot("job_id"))))
_JOB_STATUS = Statement(lambda: J.select(J.status).where(J.id == Slot("job_id")))
# Whether a job is live with every target final: after most of its writes a job has targets left, and its
# finish then reads one row and writes nothing (PostgreSQL: no lock on a row other writers wait for).
_JOB_COMPLETE = Statement(
    lambda: J.select(Inline(J.status.in_(LIVE_JOB_STATUSES)) & (J.targets_done >= J.targets_total)).where(
        J.id == Slot("job_id")
    )
)
_FINISH_JOB = Statement(
    lambda: J.update({J.status: _finished_status(), J.lease: Slot("now")}).where(
        (J.id == Slot("job_id"))
        & Inline(J.status.in_(LIVE_JOB_STATUSES))
        & (J.targets_done >= J.targets_total)
    )
)


#: At most this many caller classes in ``weights``, each at most this many turns a round.
MAX_WEIGHTS = 1000
MAX_WEIGHT = 1_000_000


@retried
def claim_batch_targets(
    limit: int,
    *,
    per_job: int | None = None,
    per_host: int | None = None,
    weights: Mapping[str, int] | None = None,
    fair: bool = True,
    runner: str | None = None,
    now: int | None = None,
) -> list[BatchTarget]:
    """Move up to ``limit`` pending targets of queued or running jobs to running and return them, in the
    claim's order: round-robin over the callers with pending work (byte order of caller names, from where
    the last claim stopped), ``weights[caller_class]`` turns each a round (default 1), each caller's oldest
    job first (created_at, then insertion order), within a job host by host (``url_host``, byte order), then
    idx; at most ``per_job`` from one job. ``fair=False``: oldest job first across all callers.
    ``per_host``: no host gets more than that many targets running at once; a host at its limit is skipped.
    Each host's policy (``set_host_policy``) caps it too (the stricter cap wins), a paced host gives at most
    one target a claim and is skipped until due, a backed-off host is skipped; paused jobs and the jobs of
    paused callers are skipped (their running targets finish as they would).
    Each job claimed from becomes running with ``lease = now``. No target is ever handed to two claimers.

    Each claimed target records ``runner`` (default: ``runner_name()``, host name and process id) and its
    heartbeat ``now``, and its ``attempts`` goes up by one; ``renew_claims`` keeps the claim alive. A target
    of a paced host comes with ``send_by``: its request must leave by then, or the target be given back
    untried (``retry_batch_target(..., attempted=False)``), for the host's interval to hold."""
    limit = validation.positive("limit", limit)
    per_job = limit if per_job is None else validation.positive("per_job", per_job)
    per_host = None if per_host is None else validation.positive("per_host", per_host)
    if type(fair) is not bool:
        validation.invalid("fair", f"must be True or False, got {fair!r}")
    checked = _weights(weights, fair)
    runner = _runner(runner)
    given = None if now is None else validation.now(now)
    db.backend.require_claims()
    with db.backend.direct_write() as execute:
        # One time for the whole claim, read in its transaction: on SQLite holding the write lock; on
        # PostgreSQL just before the statement that waits for the ring's lock (the server never reads the
        # clock for a rule). A wait there only makes the time early, which is sound: a host is due, and a
        # delayed target comes due, at the time or later (an early time holds more back), and a paced host's
        # send_by (time + SEND_WINDOW) and next due time (time + interval + PACING_SLACK) come from the same
        # time, so the gap between two claims' requests to it stays at least interval + PACING_SLACK -
        # SEND_WINDOW, whatever the wait.
        now, now_ms = _claim_clock(given)
        claimed = db.backend.claim_targets(
            limit=limit,
            per_job=per_job,
            per_host=per_host,
            weights=checked,
            fair=fair,
            runner=runner,
            now=now,
            now_ms=now_ms,
            slack_ms=_PACING_SLACK_MS,
        )
        paced: Collection[str]
        if claimed is None:  # the backend runs the claim's statements in-process
            order = ClaimOrder(
                execute,
                per_job=per_job,
                per_host=per_host,
                weights=checked,
                runner=runner,
                now=now,
                now_ms=now_ms,
            )
            claimed, paced = order.run(limit, fair), order.hosts.paced
        else:  # each row ends with whether the claim paced its host
            paced = {row[_HOST] for row in claimed if row[-1]}
    if not claimed:
        return []
    counters.add_event("claims", "targets_claimed", len(claimed))
    # Each row: the target's columns, then its host (and whatever the backend adds, which from_row leaves).
    targets = BatchTarget.from_rows(TARGET_COLUMNS, claimed)
    if paced:  # their requests must leave by send_by, for the hosts' intervals to hold
        send_by = (now_ms + _SEND_WINDOW_MS) / 1000
        for target, row in zip(targets, claimed, strict=True):
            if row[_HOST] in paced:
                target.send_by = send_by
    return targets


def _claim_clock(now: int | None) -> tuple[int, int]:
    """The claim's time in whole seconds (heartbeats, leases) and in milliseconds (host pacing): a ``now``
    given (checked already) is its second's start; otherwise the clock's, read once."""
    if now is None:
        now_ms = unix_now_ms()
        return now_ms // 1000, now_ms
    return now, min(now * 1000, _LAST_MS)


#: The latest pacing time: a paced host's next due time, after it, still fits a 64-bit integer.
_LAST_MS = 2**62
_SEND_WINDOW_MS = round(SEND_WINDOW * 1000)
#: Where a claimed row's host is: after the target's columns.
_HOST = len(TARGET_COLUMNS)
_PACING_SLACK_MS = round(PACING_SLACK * 1000)


def _weights(weights: Mapping[str, int] | None, fair: bool) -> dict[str, int] | None:
    """``weights`` checked and copied: caller class (str) -> turns a round (int, 1 or more); only for a
    fair claim."""
    if weights is None:
        return None
    if not fair:
        validation.invalid("weights", "apply to the fair claim only; leave them out with fair=False")
    if not isinstance(weights, Mapping):
        validation.invalid(
            "weights", f"must be a mapping of caller class to turns, got {type(weights).__name__}"
        )
    if len(weights) > MAX_WEIGHTS:
        validation.invalid("weights", f"may name at most {MAX_WEIGHTS} caller classes, got {len(weights)}")
    checked: dict[str, int] = {}
    for name, weight in weights.items():
        if len(checked) == MAX_WEIGHTS:  # counted as read: a Mapping's own __len__ may say less
            validation.invalid("weights", f"may name at most {MAX_WEIGHTS} caller classes")
        if type(name) is not str:
            validation.invalid("weights", f"keys must be caller classes (str), got {name!r}")
        if type(weight) is not int or not 1 <= weight <= MAX_WEIGHT:
            validation.invalid(
                "weights", f"{name!r} must have an int in 1..{MAX_WEIGHT} turns, got {weight!r}"
            )
        checked[name] = weight
    return checked


def runner_name() -> str:
    """The runner name a claim records when none is given: this host's name and this process's id, read
    once a process (a host renamed meanwhile leaves the name, and so the process's claims, as they were)."""
    global _runner_name
    pid = os.getpid()
    if _runner_name is None or _runner_name[0] != pid:  # the first call, or a forked child's
        _runner_name = pid, f"{socket.gethostname()}:{pid}"
    return _runner_name[1]


#: This process's id and its runner name, once asked for.
_runner_name: tuple[int, str] | None = None


def _runner(runner: str | None) -> str:
    return runner_name() if runner is None else validation.key("runner", runner)


@retried
def renew_claims(runner: str, *, now: int | None = None) -> int:
    """The runner's heartbeat: every claim ``runner`` holds on a running target gets ``heartbeat = now``,
    but one whose row another transaction holds, or changed in that instant (PostgreSQL), which it skips
    rather than wait for. Returns how many. It never touches a job (a job's lease is its client's signal)."""
    runner = validation.key("runner", runner)
    now = validation.now(now)
    with db.write():
        renewed = _RENEW.run(runner=runner, now=now)
    counters.add("claims_renewed", renewed)
    return renewed


@retried
def release_claims(runner: str, *, now: int | None = None) -> int:
    """A clean shutdown: every running target ``runner`` holds goes back to pending at once, unclaimed,
    and the attempt it took is given back. Returns how many. ``now`` is accepted for symmetry only."""
    runner = validation.key("runner", runner)
    validation.now(now)
    with db.write():
        released = _RELEASE.run(runner=runner)
    counters.add("claims_released", released)
    return released


@retried
def requeue_stale_claims(
    stale_after: Duration,
    *,
    runner: str | None = None,
    max_attempts: int = 3,
    reason: str = "runner stopped",
    now: int | None = None,
) -> int:
    """Every running target whose claim was last renewed at least ``stale_after`` ago (``heartbeat +
    stale_after <= now``), held by ``runner`` when given, goes back to pending, unclaimed; one whose
    ``attempts`` has reached ``max_attempts`` becomes failed with ``error = reason`` instead, counted once in
    its job's targets_done, and a live job whose last target that was becomes done, partial or failed.
    Returns how many targets moved. Safe from every host at any time; job leases move only where a target
    failed."""
    runner = None if runner is None else validation.key("runner", runner)
    max_attempts = validation.positive("max_attempts", max_attempts)
    reason = validation.message("reason", reason)
    now = validation.now(now)
    cutoff = validation.cutoff(now, stale_after, "stale_after")
    return _requeue(cutoff, max_attempts, reason, now, runner)


@retried
def requeue_in_flight(
    *, max_attempts: int = 3, reason: str = "the runner restarted", now: int | None = None
) -> int:
    """A single runner's start: every running target (all were its previous run's) is requeued as by
    ``requeue_stale_claims(0, ...)``; queued jobs and pending targets are left alone. With several
    runners, use ``requeue_stale_claims`` instead: this would take the others' claims."""
    max_attempts = validation.positive("max_attempts", max_attempts)
    reason = validation.message("reason", reason)
    now = validation.now(now)
    return _requeue(now, max_attempts, reason, now)


def stale_claims(
    stale_after: Duration, *, runner: str | None = None, now: int | None = None
) -> list[BatchTarget]:
    """The running targets ``requeue_stale_claims(stale_after, runner=runner, now=now)`` would move, by job
    and idx (``stale_claims(0, runner=name)``: every claim ``name`` holds). Reads only."""
    runner = None if runner is None else validation.key("runner", runner)
    cutoff = validation.cutoff(validation.now(now), stale_after, "stale_after")
    rows = _STALE_CLAIMS.rows(cutoff=cutoff, runner=runner)
    rows.sort(key=lambda row: (row[0], row[1]))  # job_id, idx
    return BatchTarget.from_rows(TARGET_COLUMNS, rows)


def _requeue(cutoff: int, max_attempts: int, reason: str, now: int, runner: str | None = None) -> int:
    """One transaction: stale targets (of ``runner`` when given) at their last attempt fail (counted on
    their jobs, which finish when complete); the other stale targets go back to pending. None stale: one
    read, and nothing written."""
    if not _ANY_STALE.rows(cutoff=cutoff, runner=runner):  # one read: no write transaction, no turn taken
        return 0
    with db.write():
        # PostgreSQL: the claims' turn first, then the jobs in id order, then their targets. A claim holds the
        # turn while it locks jobs in claim order: without it, each could hold a job the other waits for.
        LOCK_RING.rows()
        _STALE_JOBS.rows(cutoff=cutoff, runner=runner)
        failed = Counter(
            row[0]
            for row in _FAIL_STALE.rows(
                reason=reason, cutoff=cutoff, max_attempts=max_attempts, runner=runner
            )
        )
        for job_id, count in failed.items():
            _COUNT_FAILED.run(job_id=job_id, failed=count, now=now)
            _FINISH_JOB.run(job_id=job_id, now=now)
        requeued = _REQUEUE_STALE.run(cutoff=cutoff, runner=runner)
    counters.add("targets_requeued", requeued)
    counters.add("targets_failed_stale", failed.total())
    return requeued + failed.total()


@retried
def finish_batch_job(job_id: str, *, now: int | None = None) -> JobStatus | None:
    """A live job whose every target is final becomes done (none failed), failed (every one failed) or
    partial, with ``lease = now``, and that status is returned; a job with targets still to finish, or
    already finished, is left alone (None). The runner's call after its job's last write."""
    job_id = validation.job_id(job_id)
    now = validation.now(now)
    complete = _JOB_COMPLETE.rows(job_id=job_id)
    if complete and not complete[0][0]:  # targets left, or finished already: one read, nothing written
        return None
    with db.write():
        if not _LOCK_JOB.rows(job_id=job_id):
            counters.add("batch_write_miss")
            raise JobNotFound(job_id)
        if not _FINISH_JOB.run(job_id=job_id, now=now):
            return None
        status = _JOB_STATUS.scalar(job_id=job_id)
    return JobStatus(status)


# Live jobs whose every target is final, read through a partial index of the live jobs alone (unordered:
# ORDER BY id would walk every job's key; the rule sorts them, the order its locks are taken in).
_COMPLETE_JOBS = Statement(
    lambda: J.select(J.id).where(
        Inline(J.status.in_(LIVE_JOB_STATUSES)) & (J.targets_done >= J.targets_total)
    )
)


@retried
def finish_complete_jobs(*, now: int | None = None) -> int:
    """Every live job whose targets are all final is finished as ``finish_batch_job`` finishes one, in one
    transaction, also one whose last writer stopped before finishing it. Returns how many. A runner's
    keeper calls it; it reads the live jobs only, and writes nothing when none is complete."""
    now = validation.now(now)
    complete = sorted(row[0] for row in _COMPLETE_JOBS.rows())
    if not complete:  # the usual case: one read, no transaction
        return 0
    finished = 0
    with db.write():
        for job_id in complete:  # each locked before its targets are counted, in id order
            if _LOCK_JOB.rows(job_id=job_id):
                finished += _FINISH_JOB.run(job_id=job_id, now=now)
    return finished
