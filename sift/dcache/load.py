"""Who is waiting and which sites are busy: pending and running targets per caller, running targets per
host, each list capped so a dashboard's label cardinality stays bounded.

What a call reads, so a scrape may run it often: every live job's row (the partial index of live jobs, by
caller), and every running target with its job (the partial index of running targets, bounded by what the
runners hold). It never reads the pending targets themselves: a caller's pending count is its live jobs'
``targets_total - targets_done`` less its running targets. A running target's host is ``url_host`` of its
URL, computed here rather than read from the stored ``host`` column, so that ``sift stats`` reads a store
of an older version, opened read-only and never upgraded, the same way.
"""

from __future__ import annotations

import collections

import peewee

from . import validation
from .hosts import url_host
from .models import LIVE_JOB_STATUSES, BatchJob, BatchTarget, TargetStatus
from .reports import CallerLoad, HostLoad, LoadReport
from .statements import Statement

__all__ = ["OTHER", "store_load"]

#: The name of the row that sums the callers (or hosts) past the cap.
OTHER = "(other)"

J = BatchJob
T = BatchTarget
Inline = peewee.ValueLiterals

# Each caller's targets in live jobs not yet final (pending or running): the live jobs' rows only, through
# the partial index of live jobs by caller.
_OUTSTANDING = Statement(
    lambda: (
        J.select(J.caller, peewee.fn.SUM(J.targets_total - J.targets_done))
        .where(Inline(J.status.in_(LIVE_JOB_STATUSES)))
        .group_by(J.caller)
    )
)
# Every running target's URL, and its job's caller if that job is live: the partial index of running
# targets, each job by its key. A correlated subquery, not a join, so the plan cannot start from the jobs
# (an analyzed SQLite store chose to scan them).
_JOB = J.alias("owner")
_RUNNING = Statement(
    lambda: T.select(
        T.url,
        _JOB.select(_JOB.caller)
        .where((_JOB.id == T.job_id) & Inline(_JOB.status.in_(LIVE_JOB_STATUSES)))
        .alias("caller"),
    ).where(Inline(T.status == TargetStatus.RUNNING.value))
)


def store_load(*, callers: int = 20, hosts: int = 10) -> LoadReport:
    """The ``callers`` callers with the most pending and running targets in live jobs (most first, then by
    name), the ``hosts`` hosts with the most running targets, and the rest of each summed in one row named
    ``OTHER``. Reads only, in two statements whose cost does not grow with the pending targets."""
    callers = validation.positive("callers", callers)
    hosts = validation.positive("hosts", hosts)
    outstanding = {caller: int(n or 0) for caller, n in _OUTSTANDING.rows()}
    running: collections.Counter[str] = collections.Counter()
    by_host: collections.Counter[str] = collections.Counter()
    for url, caller in _RUNNING.rows():
        by_host[url_host(url)] += 1
        if caller is not None:  # its job is live
            running[caller] += 1
    loads = [
        # Read in two statements: a claim between them may make pending look one short; never below zero.
        CallerLoad(caller, max(0, n - running[caller]), running[caller])
        for caller, n in outstanding.items()
    ]
    loads += [CallerLoad(caller, 0, n) for caller, n in running.items() if caller not in outstanding]
    loads.sort(key=lambda load: (-(load.pending + load.running), load.caller))
    busy = sorted((HostLoad(host, n) for host, n in by_host.items()), key=lambda h: (-h.running, h.host))
    rest, rest_hosts = loads[callers:], busy[hosts:]
    return LoadReport(
        callers=loads[:callers],
        other_callers=CallerLoad(OTHER, sum(r.pending for r in rest), sum(r.running for r in rest)),
        more_callers=len(rest),
        hosts=busy[:hosts],
        other_hosts=HostLoad(OTHER, sum(h.running for h in rest_hosts)),
        more_hosts=len(rest_hosts),
    )
