"""Politeness under the operator's hand: each host's policy (how many of its targets run at once, how
often one is claimed), back-off of a host that asked for it, and pause and resume of jobs and callers.

Claims read all of it (see :mod:`sift.dcache.claimorder`); each function here is one transaction. Times are
unix seconds (floats allowed) at the API and whole milliseconds in the tables.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Any

import peewee

from . import validation
from .clock import unix_now_ms
from .counters import counters
from .database import db, retried
from .errors import JobNotFound
from .hosts import url_host
from .models import LIVE_JOB_STATUSES, BatchJob, BatchTarget, TargetStatus, target_host, target_not_before
from .statements import Slot, Statement
from .tables import HOST_POLICY_TABLE, PAUSED_CALLER_TABLE, PAUSED_JOB_TABLE

__all__ = [
    "DEFAULT_HOST",
    "HOST_POLICY",
    "MAX_BACK_OFF",
    "MAX_MIN_INTERVAL",
    "PACING_SLACK",
    "PAUSED_CALLERS",
    "PAUSED_JOBS",
    "SEND_WINDOW",
    "HostPolicy",
    "back_off_host",
    "backed_off_hosts",
    "host_policies",
    "pause_batch_job",
    "pause_caller",
    "paused_callers",
    "paused_jobs",
    "policy_host",
    "release_host",
    "resume_batch_job",
    "resume_caller",
    "set_host_policy",
]

#: The host name of the default policy, for every host without a setting of its own.
DEFAULT_HOST = "*"
#: The longest back-off ``back_off_host`` sets, in seconds from now: one day. A ``Retry-After`` further
#: out (or a runner's mistake) holds a host back for a day, not for ever.
MAX_BACK_OFF = 86_400
#: The longest ``min_interval``, in seconds: one day.
MAX_MIN_INTERVAL = 86_400
#: A paced target's request leaves within this many seconds of its claim (``BatchTarget.send_by``), or
#: the runner gives the target back untried.
SEND_WINDOW = 0.05
#: A paced host is next due ``min_interval`` plus this many seconds after a claim: one send window, and one
#: more for a request checked in time that a busy machine holds before it leaves.
PACING_SLACK = 2 * SEND_WINDOW

HOST_POLICY: Any = peewee.Table(
    HOST_POLICY_TABLE, ("host", "max_running", "min_interval_ms", "next_due_ms", "backed_off_until_ms")
).bind(db)
PAUSED_JOBS: Any = peewee.Table(PAUSED_JOB_TABLE, ("job_id", "paused_at")).bind(db)
PAUSED_CALLERS: Any = peewee.Table(PAUSED_CALLER_TABLE, ("caller", "paused_at")).bind(db)
P = HOST_POLICY
J = BatchJob


@dataclasses.dataclass(frozen=True)
class HostPolicy:
    """One host's row: its settings (None: the default's applies; on ``*``, no default), when a paced
    claim may next take one of its targets, and the end of its back-off (unix seconds; None: not set)."""

    host: str
    max_running: int | None
    min_interval: float | None
    next_due: float | None
    backed_off_until: float | None


def policy_host(host: Any, *, default: bool = True) -> str:
    """``host`` as claims count it: ``url_host``'s name for a bare host (``Example.COM.``, ``[::1]``,
    ``::1``, ``127.1``, a port or userinfo dropped), or ``*`` (``default``) for the default policy."""
    checked = validation.key("host", host)
    if checked == DEFAULT_HOST and default:
        return checked
    if any(c in checked for c in "/?#\\") or checked.strip() != checked:
        validation.invalid("host", f"must be a host name, not a URL or path, got {checked!r}")
    if checked.count(":") > 1 and not checked.startswith("["):  # a bare IPv6 address
        checked = f"[{checked}]"
    name = url_host(f"//{checked}")
    if not name or name == DEFAULT_HOST:
        validation.invalid("host", f"names no host, got {checked!r}")
    return name


def _interval_ms(value: Any) -> int | None:
    """``min_interval`` (seconds, int, float or timedelta) in whole milliseconds, rounded to nearest."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if type(value) not in (int, float) or not (math.isfinite(value) and 0 <= value <= MAX_MIN_INTERVAL):
        validation.invalid(
            "min_interval", f"must be seconds from 0 to {MAX_MIN_INTERVAL} (or None), got {value!r}"
        )
    return round(float(value) * 1000)


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


_ADD_HOST = Statement(lambda: P.insert({P.host: Slot("host")}).on_conflict_ignore())
_SET_POLICY = Statement(
    lambda: P.update({P.max_running: Slot("max_running"), P.min_interval_ms: Slot("min_interval_ms")}).where(
        P.host == Slot("host")
    )
)
_POLICIES = Statement(
    lambda: P.select(P.host, P.max_running, P.min_interval_ms, P.next_due_ms, P.backed_off_until_ms)
)
_POLICY = Statement(
    lambda: P.select(P.host, P.max_running, P.min_interval_ms, P.next_due_ms, P.backed_off_until_ms).where(
        P.host == Slot("host")
    )
)
_BACK_OFF = Statement(
    lambda: P.update(
        {
            P.backed_off_until_ms: peewee.Case(
                None, [(P.backed_off_until_ms < Slot("until"), Slot("until"))], P.backed_off_until_ms
            )
        }
    ).where(P.host == Slot("host"))
)
_BACKED_OFF_UNTIL = Statement(lambda: P.select(P.backed_off_until_ms).where(P.host == Slot("host")))


def _host_pending() -> peewee.Node:
    """The pending targets of the host ``host``: batch_target_pending_host, which only back-offs read."""
    return (target_host() == Slot("host")) & peewee.ValueLiterals(
        BatchTarget.status == TargetStatus.PENDING.value
    )


# A host backed off takes its claimable targets (and those waiting for the end of a shorter back-off of
# it) out of the claims' index until the back-off's end, so a claim passes a held site at no cost however
# many targets it has; a claim moves them back when due (and keeps a due retried target waiting while its
# host is backed off). Each is found by batch_target_pending_host (host, not_before).
_DELAY_HOST = Statement(
    lambda: BatchTarget.update({target_not_before(): Slot("until")}).where(
        _host_pending() & peewee.ValueLiterals(target_not_before().is_null())
    )
)
_DELAY_LONGER = Statement(
    lambda: BatchTarget.update({target_not_before(): Slot("until")}).where(
        _host_pending() & (target_not_before() == Slot("earlier"))
    )
)
# A released host's targets that waited for the back-off come back at once; a retried one keeps its time.
_UNDELAY_HOST = Statement(
    lambda: BatchTarget.update({target_not_before(): None}).where(
        _host_pending() & (target_not_before() == Slot("until"))
    )
)


def _second_of(ms: int) -> int:
    """The whole second ``ms`` falls in: a held target waits out of the claims' index to the start of its
    host's last second of back-off; for that second the claims' walk holds the host to the millisecond."""
    return ms // 1000


@retried
def set_host_policy(host: str, *, max_running: int | None = None, min_interval: Any = None) -> HostPolicy:
    """Set ``host``'s policy (``"*"``: the default, for every host without a setting of its own): at most
    ``max_running`` of its targets running at once, at least ``min_interval`` seconds between two claims
    of its targets. None clears a setting (the default's applies); ``min_interval=0`` paces it not at all."""
    host = policy_host(host)
    limit = None if max_running is None else validation.positive("max_running", max_running)
    interval = _interval_ms(min_interval)
    with db.write():
        _ADD_HOST.run(host=host)
        _SET_POLICY.run(host=host, max_running=limit, min_interval_ms=interval)
        row = _POLICY.rows(host=host)[0]
    return _policy(row)


def host_policies() -> list[HostPolicy]:
    """Every host's row (a policy set, a back-off, or a paced host's next due time), ``*`` first, then
    by host (byte order). Reads only."""
    if not db.backend.politeness_stored:
        return []
    rows = sorted(_POLICIES.rows(), key=lambda row: (row[0] != DEFAULT_HOST, row[0].encode()))
    return [_policy(row) for row in rows]


def _policy(row: Any) -> HostPolicy:
    host, limit, interval, due, until = row
    return HostPolicy(
        host=host,
        max_running=None if limit is None else int(limit),
        min_interval=_seconds(interval),
        next_due=_seconds(due) if due else None,
        backed_off_until=_seconds(until) if until else None,
    )


@retried
def back_off_host(host: str, until: float, *, now: float | None = None) -> float:
    """No target of ``host`` is claimed before ``until`` (unix seconds), by any runner: at most
    :data:`MAX_BACK_OFF` seconds after ``now``, and never earlier than a back-off already set. Returns the
    back-off's end."""
    host = policy_host(host, default=False)
    now_ms = _now_ms(now)
    if type(until) not in (int, float) or not math.isfinite(until) or until < 0:
        validation.invalid("until", f"must be unix seconds (a finite number), got {until!r}")
    until_ms = min(math.ceil(until * 1000), now_ms + MAX_BACK_OFF * 1000)
    with db.write():
        _ADD_HOST.run(host=host)
        before = int(_BACKED_OFF_UNTIL.scalar(host=host))
        _BACK_OFF.run(host=host, until=until_ms)
        end = int(_BACKED_OFF_UNTIL.scalar(host=host))
        if _second_of(end) > _second_of(now_ms):
            _DELAY_HOST.run(host=host, until=_second_of(end))
            if _second_of(now_ms) < _second_of(before) < _second_of(end):
                _DELAY_LONGER.run(host=host, until=_second_of(end), earlier=_second_of(before))
    return end / 1000


_RELEASE = Statement(
    lambda: P.update({P.backed_off_until_ms: 0}).where(
        (P.host == Slot("host")) & (P.backed_off_until_ms > Slot("now_ms"))
    )
)

# A row left with nothing in it (no setting, no pacing time to come) goes: claims walk hosts only while
# some row holds something.
_DROP_EMPTY = Statement(
    lambda: P.delete().where(
        (P.host == Slot("host"))
        & P.max_running.is_null()
        & P.min_interval_ms.is_null()
        & (P.next_due_ms <= Slot("now_ms"))
    )
)


@retried
def release_host(host: str, *, now: float | None = None) -> bool:
    """Claims take ``host``'s targets again at once: its back-off ends (a retried target keeps a later time
    of its own), and its row goes if nothing else is set. True if one was in force at ``now`` (unix
    seconds)."""
    host = policy_host(host, default=False)
    now_ms = _now_ms(now)
    with db.write():
        end = _BACKED_OFF_UNTIL.scalar(host=host)
        if not _RELEASE.run(host=host, now_ms=now_ms):
            return False
        _UNDELAY_HOST.run(host=host, until=_second_of(int(end)))
        _DROP_EMPTY.run(host=host, now_ms=now_ms)
        return True


def _now_ms(now: Any) -> int:
    if now is None:
        return unix_now_ms()
    if type(now) not in (int, float) or not math.isfinite(now) or now < 0:
        validation.invalid("now", f"must be unix seconds (a finite number), got {now!r}")
    return math.floor(float(now) * 1000)


# -- pause and resume -------------------------------------------------------------------------------------

_LOCK_JOB = Statement(lambda: db.backend.lock_rows(J.select(J.status).where(J.id == Slot("job_id"))))
_PAUSE_JOB = Statement(
    lambda: PAUSED_JOBS.insert(
        {PAUSED_JOBS.job_id: Slot("job_id"), PAUSED_JOBS.paused_at: Slot("now")}
    ).on_conflict_ignore()
)
_RESUME_JOB = Statement(lambda: PAUSED_JOBS.delete().where(PAUSED_JOBS.job_id == Slot("job_id")))
_PAUSE_CALLER = Statement(
    lambda: PAUSED_CALLERS.insert(
        {PAUSED_CALLERS.caller: Slot("caller"), PAUSED_CALLERS.paused_at: Slot("now")}
    ).on_conflict_ignore()
)
_RESUME_CALLER = Statement(lambda: PAUSED_CALLERS.delete().where(PAUSED_CALLERS.caller == Slot("caller")))
_PAUSED_JOBS = Statement(
    lambda: (
        PAUSED_JOBS.select(PAUSED_JOBS.job_id)
        .join(J, on=(J.id == PAUSED_JOBS.job_id))
        .where(peewee.ValueLiterals(J.status.in_(LIVE_JOB_STATUSES)))
    )
)
_PAUSED_CALLERS = Statement(lambda: PAUSED_CALLERS.select(PAUSED_CALLERS.caller))


def _job_status(job_id: str) -> str:
    """The job's status, its row locked (before any target, as every target write locks it)."""
    rows = _LOCK_JOB.rows(job_id=job_id)
    if not rows:
        counters.add("batch_write_miss")
        raise JobNotFound(job_id)
    return str(rows[0][0])


@retried
def pause_batch_job(job_id: str, *, now: int | None = None) -> bool:
    """No claim takes the live job's pending targets until it is resumed; its running targets finish, and
    its lease runs on (a paused job whose client stopped polling still expires). True if it was not paused;
    False for a finished job, which has nothing to pause."""
    job_id = validation.job_id(job_id)
    now = validation.now(now)
    with db.write():
        if _job_status(job_id) not in LIVE_JOB_STATUSES:
            return False
        return _PAUSE_JOB.run(job_id=job_id, now=now) == 1


@retried
def resume_batch_job(job_id: str) -> bool:
    """Claims take the job's pending targets again, where it stood. True if it was paused."""
    job_id = validation.job_id(job_id)
    with db.write():
        _job_status(job_id)
        return _RESUME_JOB.run(job_id=job_id) == 1


@retried
def pause_caller(caller: str, *, now: int | None = None) -> bool:
    """No claim takes a pending target of ``caller``'s jobs (those sent later too) until it is resumed;
    running targets finish. True if it was not paused."""
    caller = validation.key("caller", caller)
    now = validation.now(now)
    with db.write():
        return _PAUSE_CALLER.run(caller=caller, now=now) == 1


@retried
def resume_caller(caller: str) -> bool:
    """Claims take ``caller``'s pending targets again, in its turn. True if it was paused."""
    caller = validation.key("caller", caller)
    with db.write():
        return _RESUME_CALLER.run(caller=caller) == 1


_BACKED_OFF = Statement(lambda: P.select(P.host).where(P.backed_off_until_ms > Slot("now_ms")))


def backed_off_hosts(*, now: float | None = None) -> list[str]:
    """The hosts backed off at ``now`` (unix seconds), sorted (byte order). Reads only."""
    now_ms = _now_ms(now)
    if not db.backend.politeness_stored:
        return []
    rows = _BACKED_OFF.rows(now_ms=now_ms)
    return sorted((row[0] for row in rows), key=lambda host: host.encode())


def paused_jobs() -> list[str]:
    """The ids of the paused live jobs, sorted. Reads only."""
    if not db.backend.politeness_stored:
        return []
    return sorted(row[0] for row in _PAUSED_JOBS.rows())


def paused_callers() -> list[str]:
    """The paused callers, sorted (byte order). Reads only."""
    if not db.backend.politeness_stored:
        return []
    return sorted((row[0] for row in _PAUSED_CALLERS.rows()), key=lambda name: name.encode())
