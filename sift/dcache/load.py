"""Who is waiting and which sites are busy: pending and running targets per caller, running targets per
host, each list capped so a dashboard's label cardinality stays bounded.

What a call reads, so a scrape may run it often: every live job's row (the partial index of live jobs, by
caller), and every running target with its job (the partial index of running targets, bounded by what the
runners hold). It never reads the pending targets themselves: a caller's pending count is its live jobs'
``targets_total - targets_done`` less its running targets.
"""

from __future__ import annotations

import collections
from typing import Any

import peewee

from . import validation
from .hosts import url_host
from .models import LIVE_JOB_STATUSES, BatchJob, BatchTarget, TargetStatus
from .reports import CallerLoad, HostLoad, LoadReport

__all__ = ["OTHER", "store_load"]

#: The name of the row that sums the callers (or hosts) past the cap.
OTHER = "(other)"

J = BatchJob
T = BatchTarget


def store_load(*, callers: int = 20, hosts: int = 10) -> LoadReport:
    """The ``callers`` callers with the most pending and running targets in live jobs (most first, then by
    name), the ``hosts`` hosts with the most running targets, and the rest of each summed in one row named
    ``OTHER``. Reads only, in two statements whose cost does not grow with the pending targets."""
    callers = validation.positive("callers", callers)
    hosts = validation.positive("hosts", hosts)
    live = peewee.ValueLiterals(J.status.in_(LIVE_JOB_STATUSES))
    outstanding_rows: Any = (
        J.select(J.caller, peewee.fn.SUM(J.targets_total - J.targets_done)).where(live).group_by(J.caller)
    )
    outstanding = {caller: int(n or 0) for caller, n in outstanding_rows.tuples()}
    running_rows: Any = (
        T.select(J.caller, T.url, J.status)
        .join(J, on=(T.job_id == J.id))
        .where(peewee.ValueLiterals(T.status == TargetStatus.RUNNING.value))
    )
    running: collections.Counter[str] = collections.Counter()
    by_host: collections.Counter[str] = collections.Counter()
    for caller, url, status in running_rows.tuples():
        by_host[url_host(url)] += 1
        if status in LIVE_JOB_STATUSES:
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
