"""Retries: a runner puts a target it holds back to pending to be tried again later (``not_before``), and an
operator reopens a job's failed targets. Each function is one transaction.

A waiting target is pending, not final: it counts as pending work everywhere; only claims skip it, and a
claim moves the targets that have come due back among the claimable ones first (see claimorder.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import peewee

from . import validation
from .counters import counters
from .database import db, retried, run_retried
from .errors import ClaimLost, InvalidBatchInput, JobNotFound, TargetNotFound
from .models import BatchJob, BatchTarget, JobStatus, TargetStatus, target_not_before
from .statements import Slot, Statement

__all__ = ["retry_batch_target", "retry_batch_targets", "retry_failed_targets"]

J = BatchJob
T = BatchTarget
Inline = peewee.ValueLiterals

_LOCK_RETRIED_JOB = Statement(lambda: db.backend.lock_rows(J.select(J.status).where(J.id == Slot("job_id"))))
_TARGET = (T.job_id == Slot("job_id")) & (T.idx == Slot("idx"))
_TARGET_STATE = Statement(lambda: T.select(T.status, T.runner).where(_TARGET))
# Only while ``runner`` holds it: a requeued claim's late retry changes nothing.
_RETRY = Statement(
    lambda: T.update(
        {
            T.status: Inline(peewee.Value(TargetStatus.PENDING.value)),
            T.error: peewee.fn.COALESCE(Slot("error"), T.error),
            T.runner: None,
            T.heartbeat: None,
            T.attempts: T.attempts - Slot("given_back"),
            target_not_before(): Slot("not_before"),
        }
    ).where(_TARGET & Inline(T.status == TargetStatus.RUNNING.value) & (T.runner == Slot("runner")))
)
_LEASE_RETRIED = Statement(lambda: J.update({J.lease: Slot("now")}).where(J.id == Slot("job_id")))
_FAILED = Inline(T.status == TargetStatus.FAILED.value)
_FAILED_TOTALS = Statement(
    lambda: T.select(
        peewee.fn.COUNT(peewee.SQL("*")),
        peewee.fn.COALESCE(peewee.fn.SUM(db.backend.byte_length(T.result)), 0),
    ).where((T.job_id == Slot("job_id")) & _FAILED)
)
_REOPEN_TARGETS = Statement(
    lambda: T.update(
        {
            T.status: Inline(peewee.Value(TargetStatus.PENDING.value)),
            T.result: None,
            T.error: None,
            T.hint: None,
            T.runner: None,
            T.heartbeat: None,
            target_not_before(): None,
        }
    ).where((T.job_id == Slot("job_id")) & _FAILED)
)
_REOPEN_JOB = Statement(
    lambda: J.update(
        {
            J.targets_done: J.targets_done - Slot("count"),
            J.nbytes: J.nbytes - Slot("size"),
            J.status: Inline(peewee.Value(JobStatus.RUNNING.value)),
            J.error: Inline(peewee.Value("")),
            J.lease: Slot("now"),
        }
    ).where(J.id == Slot("job_id"))
)


@retried
def retry_batch_target(
    job_id: str,
    idx: int,
    *,
    runner: str,
    error: str | None,
    not_before: int | None,
    now: int | None = None,
    attempted: bool = True,
) -> None:
    """The target ``runner`` holds goes back to pending with ``error`` (None: its error stays), unclaimed,
    not to be claimed before ``not_before`` (unix seconds; None: at once); its job's count stays (it was not
    final), the job's lease becomes ``now``. ``attempted=False``: it was never tried (its request did not
    leave), and its claim's attempt is given back. ``ClaimLost``, writing nothing, unless ``runner`` holds
    it."""
    job_id = validation.job_id(job_id)
    idx = validation.count("idx", idx)
    runner = validation.key("runner", runner)
    error = None if error is None else validation.message("error", error)
    not_before = None if not_before is None else validation.count("not_before", not_before)
    now = validation.now(now)
    if type(attempted) is not bool:
        validation.invalid("attempted", f"must be True or False, got {attempted!r}")
    _put_back(job_id, [(idx, error, not_before, 0 if attempted else 1)], runner, now)


#: The fields of one entry of ``retry_batch_targets``: ``retry_batch_target``'s per-target arguments.
RETRY_FIELDS = ("idx", "error", "not_before", "attempted")

#: A checked entry: idx, error, not_before, and the attempt given back (1) or not (0).
_PutBack = tuple[int, str | None, int | None, int]


def retry_batch_targets(job_id: str, retries: Iterable[Any], *, runner: str, now: int | None = None) -> int:
    """Many targets of one job that ``runner`` holds put back in one transaction, each as
    ``retry_batch_target`` puts one back; ``retries`` holds mappings of its per-target arguments (``idx``,
    and optionally ``error``, ``not_before``, ``attempted``). Any bad entry, missing target or lost claim
    (``ClaimLost``) refuses the whole call, writing nothing. Returns how many targets were put back."""
    job_id = validation.job_id(job_id)
    if isinstance(retries, (str, bytes, Mapping)) or not isinstance(retries, Iterable):
        validation.invalid("retries", f"must be an iterable of mappings, got {type(retries).__name__}")
    put_back = [_put_back_of(position, entry) for position, entry in enumerate(retries)]
    named: dict[int, int] = {}
    for position, (idx, *_rest) in enumerate(put_back):
        if named.setdefault(idx, position) != position:
            validation.invalid(
                f"retries[{position}].idx", f"names target {idx} again (retries[{named[idx]}])"
            )
    runner = validation.key("runner", runner)
    now = validation.now(now)
    if put_back:
        run_retried(lambda: _put_back(job_id, put_back, runner, now))  # retries are read once, above
    return len(put_back)


def _put_back_of(position: int, entry: Any) -> _PutBack:
    """Entry ``position`` of retry_batch_targets' retries, checked; a refusal names it
    (``retries[3].not_before``)."""
    where = f"retries[{position}]"
    validation.entry(where, entry, RETRY_FIELDS, ("idx",), "a target's retry")
    try:
        idx = validation.count("idx", entry["idx"])
        error = entry.get("error")
        error = None if error is None else validation.message("error", error)
        not_before = entry.get("not_before")
        not_before = None if not_before is None else validation.count("not_before", not_before)
        attempted = entry.get("attempted", True)
        if type(attempted) is not bool:
            validation.invalid("attempted", f"must be True or False, got {attempted!r}")
    except InvalidBatchInput as exc:
        raise InvalidBatchInput(f"{where}.{exc.field}", exc.problem) from None
    return idx, error, not_before, 0 if attempted else 1


def _put_back(job_id: str, put_back: list[_PutBack], runner: str, now: int) -> None:
    """Checked retries of one job's targets, in one write transaction: the job locked before its targets,
    as every target write; the first target ``runner`` does not hold refuses them all."""
    with db.write():
        if not _LOCK_RETRIED_JOB.rows(job_id=job_id):
            raise JobNotFound(job_id)
        for idx, error, not_before, given_back in put_back:
            if not _RETRY.run(
                job_id=job_id,
                idx=idx,
                error=error,
                runner=runner,
                not_before=not_before,
                given_back=given_back,
            ):
                state = _TARGET_STATE.rows(job_id=job_id, idx=idx)
                if not state:
                    raise TargetNotFound(job_id, idx)
                counters.add("late_writes_refused")
                raise ClaimLost(job_id, idx, runner, state[0][1])
        _LEASE_RETRIED.run(job_id=job_id, now=now)


@retried
def retry_failed_targets(job_id: str, *, now: int | None = None) -> int:
    """An operator's second try: the job's failed targets become pending again (attempts kept; result,
    error and hint cleared), each leaving ``targets_done`` once, and the job becomes running (from any
    status but cancelled, which is refused: its caller stopped it). Returns how many targets reopened."""
    job_id = validation.job_id(job_id)
    now = validation.now(now)
    with db.write():
        status = _LOCK_RETRIED_JOB.rows(job_id=job_id)
        if not status:
            raise JobNotFound(job_id)
        if status[0][0] == JobStatus.CANCELLED.value:
            validation.invalid(
                "job_id", f"job {job_id!r} is cancelled: its caller stopped it, so it stays so"
            )
        count, size = _FAILED_TOTALS.rows(job_id=job_id)[0]
        if count:
            _REOPEN_JOB.run(job_id=job_id, count=int(count), size=int(size), now=now)
            _REOPEN_TARGETS.run(job_id=job_id)
    return int(count)
