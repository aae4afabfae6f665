"""Waiting for a job to change: :func:`wait_for_batch_job`, woken by the backend's change feed
(:mod:`.waiters`): PostgreSQL's one listening connection per process (NOTIFY sent by the writing
transaction), SQLite's ``PRAGMA data_version`` read every few milliseconds while anyone waits. Waiting never
writes.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from .clock import monotonic
from .database import db
from .errors import InvalidBatchInput
from .manager import batch_job
from .models import LIVE_JOB_STATUSES, BatchJob
from .validation import text

__all__ = ["MAX_WAIT_SECONDS", "checked_wait", "job_changed", "wait_for_batch_job"]

#: The longest one wait may be asked to last, in seconds: a day. A long poll is a few tens of seconds.
MAX_WAIT_SECONDS = 86_400.0


def checked_wait(job_id: Any, timeout: Any, since: Any) -> tuple[str, float, tuple[str, int] | None]:
    """The arguments of a wait, checked: the job id, the timeout in seconds, and ``since``'s status and
    count of final targets (None without ``since``)."""
    job_id = text("job_id", job_id)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 <= timeout <= MAX_WAIT_SECONDS
    ):
        raise InvalidBatchInput("timeout", f"must be a number of seconds from 0 to {MAX_WAIT_SECONDS:g}")
    if since is None:
        return job_id, float(timeout), None
    if not isinstance(since, BatchJob):
        raise InvalidBatchInput("since", f"must be the BatchJob as read earlier, got {type(since).__name__}")
    if since.id != job_id:
        raise InvalidBatchInput("since", f"is job {since.id!r}, not {job_id!r}")
    return job_id, float(timeout), (str(since.status), int(since.targets_done))


def job_changed(job: BatchJob | None, since: tuple[str, int] | None) -> bool:
    """Whether a wait is over for this read of its job: gone, final, or (with ``since``) moved on."""
    if job is None or job.status not in LIVE_JOB_STATUSES:
        return True
    return since is not None and (str(job.status), int(job.targets_done)) != since


def wait_for_batch_job(job_id: str, *, timeout: float, since: BatchJob | None = None) -> BatchJob | None:
    """The job as soon as it is final, or, given ``since`` (the job as read earlier), as soon as its status
    or ``targets_done`` differs from it; the job as it is after ``timeout`` seconds; None for an unknown
    job. Woken by the writes themselves, never by a fixed sleep; it never writes."""
    job_id, timeout, mark = checked_wait(job_id, timeout, since)
    waiters = db.backend.job_waiters()
    waker = threading.Event()
    waiters.add(job_id, waker)
    try:
        deadline = monotonic() + timeout
        while True:
            waker.clear()
            job = batch_job(job_id)
            if job_changed(job, mark):
                return job
            remaining = deadline - monotonic()
            if remaining <= 0:
                return job
            if not waker.wait(remaining):
                return batch_job(job_id)  # the job as it is at the timeout
    finally:
        waiters.remove(job_id, waker)
