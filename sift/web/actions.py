"""The dashboard's actions: each one name, one store function. A new action is one entry in ``ACTIONS``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from sift import dcache
from sift.dcache import politeness

from . import queries

__all__ = ["ACTIONS", "Action", "ActionContext"]


@dataclasses.dataclass(frozen=True)
class ActionContext:
    """What an action may use: the subject it names (a job id, a caller, a host; "" for the store), the
    dashboard's settings, and the value typed into the form's field (for an action that ``asks``)."""

    subject: str
    stale_after: int
    value: str = ""


@dataclasses.dataclass(frozen=True)
class Action:
    """One button: its label, what it acts on (``job``, ``caller``, ``host``, or ``store`` for the whole
    store), when a page shows it for a subject (a ``BatchJob``, a ``CallerRow``, a ``HostRow``), the store
    call it makes, and the label of the one field its form asks for (None: none)."""

    label: str
    on: str
    call: Callable[[ActionContext], Any]
    shown_for: Callable[[Any], bool] = lambda subject: True
    asks: str | None = None


def _back_off(ctx: ActionContext) -> float:
    """Back the host off for the seconds typed (whole or not, up to ``MAX_BACK_OFF``) from now."""
    try:
        seconds = float(ctx.value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= politeness.MAX_BACK_OFF):
        raise dcache.InvalidBatchInput(
            "seconds",
            f"must be a number of seconds above 0 and up to {politeness.MAX_BACK_OFF}, got {ctx.value!r}",
        )
    return dcache.back_off_host(ctx.subject, dcache.unix_now_ms() / 1000 + seconds)


#: Action name -> what it does; the POST ``/actions/<name>`` runs it, and pages show a form for each entry
#: that applies.
ACTIONS: dict[str, Action] = {
    "cancel": Action(
        "Cancel job",
        "job",
        lambda ctx: dcache.cancel_batch_job(ctx.subject, reason="cancelled from the dashboard"),
        queries.is_live,
    ),
    # a finished job with failures, or a live one: a done job has none, a cancelled one is refused
    "retry_failed": Action(
        "Retry failed targets",
        "job",
        lambda ctx: dcache.retry_failed_targets(ctx.subject),
        lambda job: queries.is_live(job) or job.status in ("partial", "failed"),
    ),
    "pause_job": Action(
        "Pause job",
        "job",
        lambda ctx: dcache.pause_batch_job(ctx.subject),
        lambda job: queries.is_live(job) and queries.job_pause_state(job) is None,
    ),
    "resume_job": Action(
        "Resume job",
        "job",
        lambda ctx: dcache.resume_batch_job(ctx.subject),
        lambda job: queries.job_pause_state(job) is not None,
    ),
    "pause_caller": Action(
        "Pause",
        "caller",
        lambda ctx: dcache.pause_caller(ctx.subject),
        lambda row: row.paused_at is None,
    ),
    "resume_caller": Action(
        "Resume",
        "caller",
        lambda ctx: dcache.resume_caller(ctx.subject),
        lambda row: row.paused_at is not None,
    ),
    "back_off_host": Action("Back off", "host", _back_off, asks="seconds"),
    "release_host": Action(
        "Release",
        "host",
        lambda ctx: dcache.release_host(ctx.subject),
        lambda row: row.backed_off,
    ),
    "requeue_stale": Action(
        "Requeue stale claims",
        "store",
        lambda ctx: dcache.requeue_stale_claims(ctx.stale_after),
    ),
}
