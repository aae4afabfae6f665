"""The dashboard's actions: each one name, one store function. A new action is one entry in ``ACTIONS``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from sift import dcache
from sift.dcache import BatchJob

from . import queries

__all__ = ["ACTIONS", "Action", "ActionContext"]


@dataclasses.dataclass(frozen=True)
class ActionContext:
    """What an action may use: the subject it names (a job id, a caller, a host; "" for the store) and the
    dashboard's settings."""

    subject: str
    stale_after: int


@dataclasses.dataclass(frozen=True)
class Action:
    """One button: its label, what it acts on (``job``, or ``store`` for the whole store), when a page shows
    it for a job, and the store call it makes."""

    label: str
    on: str
    call: Callable[[ActionContext], Any]
    shown_for: Callable[[BatchJob], bool] = lambda job: True


#: Action name -> what it does; the POST ``/actions/<name>`` runs it, and pages show a form for each entry
#: that applies.
ACTIONS: dict[str, Action] = {
    "cancel": Action(
        "Cancel job",
        "job",
        lambda ctx: dcache.cancel_batch_job(ctx.subject, reason="cancelled from the dashboard"),
        queries.is_live,
    ),
    "requeue_stale": Action(
        "Requeue stale claims",
        "store",
        lambda ctx: dcache.requeue_stale_claims(ctx.stale_after),
    ),
}
