"""What the dashboard's pages read: the store's public reads and plain read-only queries on the models, each
bounded by an index and a LIMIT, so that a page's cost does not grow with the jobs or targets stored.

The one exception is the overview's jobs by status, a ``GROUP BY`` over the jobs' rows (as ``sift stats``
reads them): exact counts need every job row; no page reads every target.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import peewee

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, HostPolicy, JobStatus, TargetStatus, politeness, validation
from sift.dcache.models import LIVE_JOB_STATUSES

__all__ = [
    "PAGE_SIZE",
    "CallerRow",
    "HostRow",
    "JobsPage",
    "Overview",
    "RunnerRow",
    "TargetRow",
    "caller_pause_query",
    "caller_pause_state",
    "default_policy",
    "held_hosts_query",
    "host_policy_query",
    "host_policy_state",
    "job_pause_state",
    "jobs_page",
    "jobs_query",
    "overview",
    "runners",
    "target_page",
    "targets_query",
]

#: Rows on one page of jobs or of a job's targets.
PAGE_SIZE = 50
#: Callers and hosts listed at most (the rest summed in one row, as ``store_load`` does).
LIST_CAP = 200

J = BatchJob
T = BatchTarget


@dataclasses.dataclass(frozen=True)
class RunnerRow:
    """A runner holding claims: how many, its newest heartbeat, and whether that is older than
    ``stale_after``."""

    name: str
    claims: int
    heartbeat: int | None
    stale: bool


@dataclasses.dataclass(frozen=True)
class Overview:
    """The overview's figures."""

    jobs: dict[str, int]
    live_jobs: int
    pending: int
    running: int
    final: int
    nbytes: int
    budget: int | None
    runners: int
    stale_claims: int
    now: int

    @property
    def budget_used(self) -> float | None:
        """The share of the budget the stored results use (may pass 1 until eviction runs)."""
        return None if not self.budget else self.nbytes / self.budget


@dataclasses.dataclass(frozen=True)
class JobsPage:
    """One page of jobs in id order, and the cursor of the next page (None on the last)."""

    jobs: list[BatchJob]
    next_after: str | None


@dataclasses.dataclass(frozen=True)
class TargetRow:
    """One target as the job's page lists it: everything but the result, whose size stands in for it."""

    idx: int
    url: str
    status: str
    attempts: int
    runner: str | None
    heartbeat: int | None
    error: str | None
    result_size: int | None


@dataclasses.dataclass(frozen=True)
class CallerRow:
    """A caller's pending and running targets in live jobs, and when it was paused (None: it is not)."""

    caller: str
    pending: int
    running: int
    paused_at: int | None = None


@dataclasses.dataclass(frozen=True)
class HostRow:
    """A host's running targets, and its row of policy (None: it has none, and the default applies)."""

    host: str
    running: int
    policy: HostPolicy | None = None
    backed_off: bool = False


def _by_status() -> list[tuple[str, int, int]]:
    query: Any = (
        J.select(J.status, peewee.fn.COUNT(peewee.SQL("*")), peewee.fn.SUM(J.targets_done))
        .group_by(J.status)
        .tuples()
    )
    return [(status, int(n), int(done or 0)) for status, n, done in query]


def runners(stale_after: int, *, now: int | None = None) -> list[RunnerRow]:
    """Every runner holding a claim, most claims first: the running targets only (their partial index)."""
    now = dcache.unix_now() if now is None else now
    query: Any = (
        T.select(T.runner, peewee.fn.COUNT(peewee.SQL("*")), peewee.fn.MAX(T.heartbeat))
        .where(T.status == TargetStatus.RUNNING.value)
        .group_by(T.runner)
        .tuples()
    )
    rows = [
        RunnerRow(name or "", int(n), beat, beat is None or beat + stale_after <= now)
        for name, n, beat in query
    ]
    return sorted(rows, key=lambda r: (-r.claims, r.name))


def overview(*, budget: int | None, stale_after: int) -> Overview:
    """Jobs by status (every known status, 0 if none), targets of live jobs pending and running, final
    targets, stored bytes against ``budget``, runners and stale claims."""
    now = dcache.unix_now()
    rows = _by_status()
    jobs = {status.value: 0 for status in JobStatus}
    jobs.update({status: n for status, n, _ in rows})
    final = sum(done for _, _, done in rows)
    load = dcache.store_load(callers=1, hosts=1)
    pending = sum(c.pending for c in load.callers) + load.other_callers.pending
    held = runners(stale_after, now=now)
    return Overview(
        jobs=jobs,
        live_jobs=dcache.live_batch_jobs_total(),
        pending=pending,
        running=sum(r.claims for r in held),
        final=final,
        nbytes=dcache.batch_nbytes(),
        budget=budget,
        runners=sum(not r.stale for r in held),
        stale_claims=len(dcache.stale_claims(stale_after, now=now)),
        now=now,
    )


def jobs_page(
    *, status: str = "", caller: str = "", search: str = "", after: str = "", limit: int = PAGE_SIZE
) -> JobsPage:
    """Up to ``limit`` jobs with ``id > after`` in id order (the primary key's order: a page reads one range
    of it), filtered by status and caller; ``search`` matches a job's id or its idempotency key. Text no
    store could hold (a NUL, a lone surrogate) is ``InvalidBatchInput`` naming its field."""
    status, caller, search, after = (
        validation.text(name, value)
        for name, value in (("status", status), ("caller", caller), ("search", search), ("after", after))
    )
    jobs = list(jobs_query(status=status, caller=caller, search=search, after=after, limit=limit + 1))
    more = len(jobs) > limit
    return JobsPage(jobs[:limit], jobs[limit - 1].id if more else None)


def jobs_query(*, status: str, caller: str, search: str, after: str, limit: int) -> Any:
    """The jobs page's query: in the primary key's order from ``after``, filtered, at most ``limit`` rows."""
    query: Any = J.select().order_by(J.id).limit(limit)
    if status:
        query = query.where(J.status == status)
    if caller:
        query = query.where(J.caller == caller)
    if search:
        query = query.where((J.id == search) | (J.idem_key == search))
    if after:
        query = query.where(J.id > after)
    return query


def target_page(
    job_id: str, *, after: int = -1, limit: int = PAGE_SIZE
) -> tuple[list[TargetRow], int | None]:
    """Up to ``limit`` of the job's targets with ``idx > after``, in idx order (one range of the primary
    key), each with its result's size measured by the database; and the cursor of the next page."""
    rows = [TargetRow(*row) for row in targets_query(job_id, after=after, limit=limit + 1)]
    more = len(rows) > limit
    return rows[:limit], rows[limit - 1].idx if more else None


def targets_query(job_id: str, *, after: int, limit: int) -> Any:
    """The job page's targets: one range of the primary key, the result's size in place of the result."""
    size: Any = dcache.db.backend.byte_length(T.result)
    return (
        T.select(T.idx, T.url, T.status, T.attempts, T.runner, T.heartbeat, T.error, size.coerce(False))
        .where((T.job_id == job_id) & (T.idx > after))
        .order_by(T.idx)
        .limit(limit)
        .tuples()
    )


def callers() -> tuple[list[CallerRow], CallerRow | None]:
    """Callers with the most pending and running targets first (``store_load``), each with its pause, then
    the paused callers with neither (up to ``LIST_CAP``); the rest of the busy ones in one row."""
    load = dcache.store_load(callers=LIST_CAP, hosts=1)
    names = [c.caller for c in load.callers]
    paused = caller_pause_state(names)
    rows = [CallerRow(c.caller, c.pending, c.running, paused.get(c.caller)) for c in load.callers]
    shown = set(names)
    rows += [
        CallerRow(name, 0, 0, at) for name, at in _paused_callers(LIST_CAP + len(names)) if name not in shown
    ]
    rest = load.other_callers
    return rows, CallerRow(rest.caller, rest.pending, rest.running) if load.more_callers else None


def hosts(*, now: float | None = None) -> tuple[list[HostRow], HostRow | None]:
    """Hosts with the most running targets first (``store_load``), each with its row of policy, then the
    hosts with a setting of their own or a back-off in force at ``now`` (up to ``LIST_CAP``, by name); the
    rest of the busy ones in one row."""
    now = dcache.unix_now_ms() / 1000 if now is None else now
    load = dcache.store_load(callers=1, hosts=LIST_CAP)
    names = [h.host for h in load.hosts]
    policies = host_policy_state(names)
    rows = [_host_row(h.host, h.running, policies.get(h.host), now) for h in load.hosts]
    shown = set(names)
    rows += [
        _host_row(p.host, 0, p, now) for p in _held_hosts(now, LIST_CAP + len(names)) if p.host not in shown
    ]
    rest = load.other_hosts
    return rows, HostRow(rest.host, rest.running) if load.more_hosts else None


def _host_row(host: str, running: int, policy: HostPolicy | None, now: float) -> HostRow:
    until = policy.backed_off_until if policy else None
    return HostRow(host, running, policy, until is not None and until > now)


def default_policy() -> HostPolicy | None:
    """The default policy (host ``*``), if one was set: one row read by its key."""
    return host_policy_state([politeness.DEFAULT_HOST]).get(politeness.DEFAULT_HOST)


def is_live(job: BatchJob) -> bool:
    return job.status in LIVE_JOB_STATUSES


# -- Pause and policy: the rows a page shows, read by their keys; tables before politeness read as empty. --

PJ = politeness.PAUSED_JOBS
PC = politeness.PAUSED_CALLERS
HP = politeness.HOST_POLICY


def job_pause_state(job: BatchJob) -> int | None:
    """When ``job`` was paused (unix seconds), or None: it is not, or it is finished (nothing to pause)."""
    if not dcache.db.backend.politeness_stored or not is_live(job):
        return None
    query: Any = PJ.select(PJ.paused_at).where(PJ.job_id == job.id).tuples()
    found = list(query)
    return int(found[0][0]) if found else None


def caller_pause_state(callers: list[str]) -> dict[str, int]:
    """When each of ``callers`` that is paused was paused (unix seconds): one read of their keys."""
    if not dcache.db.backend.politeness_stored or not callers:
        return {}
    return {caller: int(at) for caller, at in caller_pause_query(callers)}


def caller_pause_query(callers: list[str]) -> Any:
    """The paused callers among ``callers``: a lookup of each by the table's key."""
    return PC.select(PC.caller, PC.paused_at).where(PC.caller.in_(callers)).tuples()


def _paused_callers(limit: int) -> list[tuple[str, int]]:
    if not dcache.db.backend.politeness_stored:
        return []
    query: Any = PC.select(PC.caller, PC.paused_at).order_by(PC.caller).limit(limit).tuples()
    return [(caller, int(at)) for caller, at in query]


_POLICY_COLUMNS = (HP.host, HP.max_running, HP.min_interval_ms, HP.next_due_ms, HP.backed_off_until_ms)


def _policy(row: Any) -> HostPolicy:
    host, limit, interval, due, until = row
    return HostPolicy(
        host=host,
        max_running=None if limit is None else int(limit),
        min_interval=None if interval is None else interval / 1000,
        next_due=due / 1000 if due else None,
        backed_off_until=until / 1000 if until else None,
    )


def host_policy_state(hosts: list[str]) -> dict[str, HostPolicy]:
    """The row of policy of each of ``hosts`` that has one: one read of their keys."""
    if not dcache.db.backend.politeness_stored or not hosts:
        return {}
    return {row[0]: _policy(row) for row in host_policy_query(hosts)}


def host_policy_query(hosts: list[str]) -> Any:
    """The rows of policy of ``hosts``: a lookup of each by the table's key."""
    return HP.select(*_POLICY_COLUMNS).where(HP.host.in_(hosts)).tuples()


def _held_hosts(now: float, limit: int) -> list[HostPolicy]:
    """Hosts with a setting of their own or a back-off in force, by name, at most ``limit``: the policy
    table in its key's order, stopped by the LIMIT (paced hosts without a setting keep only a due time)."""
    if not dcache.db.backend.politeness_stored:
        return []
    return [_policy(row) for row in held_hosts_query(round(now * 1000), limit)]


def held_hosts_query(now_ms: int, limit: int) -> Any:
    """Hosts with a setting or a back-off in force at ``now_ms``: the key's order, stopped by the LIMIT."""
    return (
        HP.select(*_POLICY_COLUMNS)
        .where(
            (HP.host != politeness.DEFAULT_HOST)
            & (
                HP.max_running.is_null(False)
                | HP.min_interval_ms.is_null(False)
                | (HP.backed_off_until_ms > now_ms)
            )
        )
        .order_by(HP.host)
        .limit(limit)
        .tuples()
    )
