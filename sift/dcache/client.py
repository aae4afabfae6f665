"""The client's side in one call each: submit a list of URLs, cancel a job.

``submit`` builds the job and its targets from plain values and runs ``submit_batch_job``'s idempotent
create; a key that finds a job made from another request is refused (``IdempotencyConflict``) rather than
answered with that job. ``cancel_batch_job`` ends a live job and its open targets in one transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

import peewee

from . import validation
from .counters import counters
from .database import db, retried, run_retried
from .errors import IdempotencyConflict, InvalidBatchInput, JobNotFound
from .jsontext import checked_options
from .manager import submit_batch_job
from .models import (
    FINAL_TARGET_STATUSES,
    LIVE_JOB_STATUSES,
    BatchJob,
    BatchTarget,
    CallerClass,
    JobStatus,
    TargetStatus,
)
from .statements import Slot, Statement
from .validation import Duration

__all__ = ["Submitted", "cancel_batch_job", "submit"]

J = BatchJob
T = BatchTarget
Inline = peewee.ValueLiterals

#: The options of a target that names none, and of ``submit``'s targets when ``options`` is None.
DEFAULT_OPTIONS = "{}"


class Submitted(NamedTuple):
    """What ``submit`` answers: the job's id, and whether this call created it."""

    job_id: str
    created: bool


# A key hit is compared with the request that made the job: its caller class, then its targets in idx order.
_STORED_CLASS = Statement(lambda: J.select(J.caller_class, J.targets_total).where(J.id == Slot("job_id")))
_STORED_TARGETS = Statement(
    lambda: T.select(T.url, T.options).where(T.job_id == Slot("job_id")).order_by(T.idx)
)


def _open_target() -> peewee.Node:
    return Inline(T.status.not_in(FINAL_TARGET_STATUSES))


# The job first (its open targets counted as they are about to fail), then the targets: the order every
# target write locks them in. Claimed targets lose their claim, so the runner's late write is ClaimLost.
_CANCEL_JOB = Statement(
    lambda: J.update(
        {
            J.status: Inline(peewee.Value(JobStatus.CANCELLED.value)),
            J.error: Slot("reason"),
            J.lease: Slot("now"),
            J.targets_done: J.targets_done
            + T.select(peewee.fn.COUNT(peewee.SQL("*"))).where((T.job_id == Slot("job_id")) & _open_target()),
        }
    ).where((J.id == Slot("job_id")) & Inline(J.status.in_(LIVE_JOB_STATUSES)))
)
_FAIL_OPEN_TARGETS = Statement(
    lambda: T.update(
        {
            T.status: Inline(peewee.Value(TargetStatus.FAILED.value)),
            T.error: Slot("reason"),
            T.runner: peewee.SQL("NULL"),
            T.heartbeat: peewee.SQL("NULL"),
        }
    ).where((T.job_id == Slot("job_id")) & _open_target())
)
_JOB_EXISTS = Statement(lambda: J.select(peewee.SQL("1")).where(J.id == Slot("job_id")))


def submit(
    caller: str,
    urls: Iterable[Any],
    *,
    idem_key: str = "",
    caller_class: str = CallerClass.FLEET,
    options: Any = None,
    ttl: Duration = 3600,
    now: int | None = None,
) -> Submitted:
    """Create a queued job of ``urls`` (URL strings, ``(url, options)`` pairs or ``BatchTarget``s;
    ``options`` is every other target's) as ``submit_batch_job`` does, with a new id and ``now`` as its
    created_at and lease. A key that finds a job made from another request raises ``IdempotencyConflict``."""
    now = validation.now(now)
    requested = _requested(urls, options)
    # The job's own fields, checked before the transaction opens (submit_batch_job checks them again).
    validation.key("caller", caller)
    validation.key("idem_key", idem_key, allow_empty=True)
    checked_class = validation.caller_class(caller_class)
    validation.cutoff(now, ttl)
    job = BatchJob(
        id=uuid.uuid4().hex,
        caller=caller,
        caller_class=caller_class,
        idem_key=idem_key,
        status=JobStatus.QUEUED.value,
        error="",
        targets_total=len(requested),
        targets_done=0,
        created_at=now,
        lease=now,
        nbytes=0,
    )
    targets = [BatchTarget(idx=idx, url=url, options=text) for idx, (url, text) in enumerate(requested)]

    def create() -> Submitted:  # the lookup, the comparison and the create: one transaction
        with db.write():
            job_id, created = submit_batch_job(job, targets, ttl, now=now)
            if not created and not _same_request(job_id, checked_class, requested):
                raise IdempotencyConflict(job_id, idem_key)
        return Submitted(job_id, created)

    return run_retried(create)  # urls are read once, above


@retried
def cancel_batch_job(job_id: str, *, reason: str = "cancelled", now: int | None = None) -> bool:
    """A queued or running job becomes cancelled (``error = reason``, ``lease = now``) and each of its
    targets not yet final becomes failed with that error, counted once, its claim cleared; True. A finished
    job is left as it is: False. An unknown job raises ``JobNotFound``."""
    job_id = validation.job_id(job_id)
    reason = validation.text("reason", reason)
    now = validation.now(now)
    with db.write():
        db.backend.lock_job(job_id)  # before its targets, as every target write takes them
        if not _CANCEL_JOB.run(job_id=job_id, reason=reason, now=now):
            if not _JOB_EXISTS.rows(job_id=job_id):
                counters.add("batch_write_miss")
                raise JobNotFound(job_id)
            return False
        _FAIL_OPEN_TARGETS.run(job_id=job_id, reason=reason)
    return True


def _requested(urls: Any, options: Any) -> list[tuple[str, str]]:
    """``urls`` as (url, options text) in order, each checked as storing it would check it."""
    if isinstance(urls, (str, bytes)) or not isinstance(urls, Iterable):
        validation.invalid("urls", f"must be an iterable of URLs, got {type(urls).__name__}")
    default = DEFAULT_OPTIONS if options is None else _options(options)
    requested = [_one(idx, entry, default) for idx, entry in enumerate(urls)]
    if not requested:
        validation.invalid("urls", "must not be empty: a job without targets never finishes")
    return requested


def _one(idx: int, entry: Any, default: str) -> tuple[str, str]:
    """Entry ``idx`` of ``urls``: a URL, a (url, options) pair or a BatchTarget, as (url, options text).
    A refusal names ``url``, ``options`` or ``idx`` and the target, as the store's own checks do."""
    if isinstance(entry, BatchTarget):
        data = entry.__data__
        if data.get("idx") not in (None, idx):
            problem = f"must be the target's place in urls, got {data['idx']!r} (target {idx})"
            validation.invalid("idx", problem)
        url, given = data.get("url"), data.get("options")
    elif isinstance(entry, (tuple, list)) and len(entry) == 2:
        url, given = entry
    else:
        url, given = entry, None
    if not isinstance(url, str):
        got = type(entry).__name__
        validation.invalid(
            "urls", f"entry {idx} must be a URL, a (url, options) pair or a BatchTarget, got {got}"
        )
    url = validation.plain(url)
    try:
        if not url:
            validation.invalid("url", "must be a non-empty str")
        validation.utf8_size("url", url)  # no NUL, no lone surrogate
        return url, default if given is None else _options(given)
    except InvalidBatchInput as exc:
        raise InvalidBatchInput(exc.field or "url", f"{exc.problem} (target {idx})") from None


def _options(value: Any) -> str:
    """Options as the JSON text stored (a dict or list as compact JSON), checked: a refusal names
    ``options``."""
    return checked_options(value)


def _same_request(job_id: str, caller_class: str, requested: list[tuple[str, str]]) -> bool:
    """Whether the stored job ``job_id`` was made from this request: its caller class, then its targets'
    URLs and options in idx order. A job whose targets are not all stored yet is another request."""
    row = _STORED_CLASS.rows(job_id=job_id)
    if not row or row[0][0] != caller_class or row[0][1] != len(requested):
        return False
    stored = _STORED_TARGETS.rows(job_id=job_id)
    return [(url, text) for url, text in stored] == requested
