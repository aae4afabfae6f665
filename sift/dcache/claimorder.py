"""The claim's order: a ring of callers taking weighted turns, each caller's oldest job first, and the
hosts' rules: a limit on the targets of one host running at once, each host's policy (its own limit, its
pacing, its back-off), and paused jobs and callers skipped (see ``claim_batch_targets`` and
docs/how-to/runners.md).

Everything here runs inside the claim's one transaction, after the ring's row is locked: on PostgreSQL
claims take turns, so the ring is global and the per-host counts read at the start stay exact.

SQLite runs this walk in-process. PostgreSQL runs the same walk, statement for statement, in the server
function of backends/postgres/claim.sql (one round trip, not one a statement): a change of the order or
the rules here is made there too, and tests/test_claim_round_trips.py compares the two backends' claims.
"""

from __future__ import annotations

import bisect
import operator
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import chain, zip_longest
from typing import Any

import peewee

from .database import db
from .models import (
    LIVE_JOB_STATUSES,
    TARGET_COLUMNS,
    BatchJob,
    BatchTarget,
    JobStatus,
    TargetStatus,
    target_host,
    target_not_before,
)
from .politeness import DEFAULT_HOST, HOST_POLICY, PACING_SLACK, PAUSED_CALLERS, PAUSED_JOBS
from .statements import Slot, Statement, literal
from .tables import RING_TABLE

__all__ = ["LOCK_RING", "ClaimOrder", "HostRules"]

J = BatchJob
T = BatchTarget
Inline = peewee.ValueLiterals
_RING = peewee.Table(RING_TABLE, ("id", "caller", "turns"))
_P: Any = HOST_POLICY
_IDX = TARGET_COLUMNS.index("idx")
_HOST = len(TARGET_COLUMNS)  # a claim's rows end with the target's host, after the model's columns
#: The claim's write transaction's ``execute`` (``backend.direct_write``): every statement of the walk goes
#: to it, which holds the lock already and turns driver errors into the package's as the claim ends.
Execute = Callable[[str, Sequence[Any]], Any]


#: Where a claimed row comes in the claim's order within its job: its host, then its idx (RETURNING promises
#: no order; Python compares text by code point, which is UTF-8's byte order).
_claim_key = operator.itemgetter(_HOST, _IDX)


def _pending(target: Any) -> peewee.Node:
    """``target`` is pending and not waiting for its ``not_before``: the partial index batch_target_host
    holds these (a retried target joins them when it comes due, see ``_PROMOTE_DUE``)."""
    return Inline((target.status == TargetStatus.PENDING.value) & target_not_before(target).is_null())


def _live() -> Any:
    return Inline(J.status.in_(LIVE_JOB_STATUSES))


def _host_order(target: Any) -> tuple[peewee.Node, ...]:
    """A job's pending targets as a claim takes them: host by host (byte order), by idx within a host, the
    order of batch_target_host, the one index of pending targets."""
    return db.backend.bytewise(target_host(target)), target.idx


# The hosts of a read of batch_target_host are always a range, never "= ?": given statistics (ANALYZE, or
# PRAGMA optimize) that count about one pending target per job or per job and host, SQLite takes an
# equality on the index's leading columns for one row, reads every entry it matches and sorts them, which
# for a job of 5,000 targets on one host is 5,000 entries a claim. A range keeps it in the index's order,
# reading only the targets it takes, whatever the statistics (tests/test_query_plans.py).
def _any_host(target: Any) -> peewee.Node:
    """Every host (text is never below ''): a range over the index's host column."""
    return Inline(db.backend.bytewise(target_host(target)) >= "")


def _of_host(target: Any) -> peewee.Node:
    """The host ``host``, as a range of one value."""
    host = db.backend.bytewise(target_host(target))
    return (host >= Slot("host")) & (host <= Slot("host"))


def _has_pending() -> peewee.Node:
    """The job has a pending target: a scalar subquery, not EXISTS, which PostgreSQL may turn into a join
    read from every pending target; its ORDER BY keeps PostgreSQL on batch_target_host."""
    probe = (
        T.select(T.idx)
        .where((T.job_id == J.id) & _pending(T) & _any_host(T))
        .order_by(*_host_order(T))
        .limit(literal(1))
    )
    return peewee.Expression(probe, peewee.OP.IS_NOT, None)


def _unpaused() -> peewee.Node:
    """Neither the job nor its caller is paused: one probe of each pause table by its key, so a paused
    caller costs a probe of each of its live jobs, never a read of their targets. Written ``COALESCE(…, 0)
    <> 1``, not ``(…) IS NULL``: PostgreSQL guesses a subquery's IS NULL true for one row in 200, and then
    sorted the live jobs rather than read them in claim order."""
    job = PAUSED_JOBS.select(literal(1)).where(PAUSED_JOBS.job_id == J.id)
    caller = PAUSED_CALLERS.select(literal(1)).where(PAUSED_CALLERS.caller == J.caller)
    return (peewee.fn.COALESCE(job, literal(0)) != literal(1)) & (
        peewee.fn.COALESCE(caller, literal(0)) != literal(1)
    )


def _after(created: str, order: str) -> peewee.Expression:
    """After the position (``created``, ``order``) in claim order (created_at, then insertion order)."""
    position: Any = peewee.Tuple(J.created_at, db.backend.insertion_order)
    return peewee.Expression(position, peewee.OP.GT, peewee.Tuple(Slot(created), Slot(order)))


# The waiting targets that have come due become claimable (back in batch_target_host), read through
# batch_target_delayed: a claim costs what it hands out plus the due ones it moves, each once, however many
# still wait. A due target of a host still backed off past this second waits on, to that back-off's last
# second (its row, by key); in that second the walk holds the host back to the millisecond.
_PROMOTE_DUE = Statement(
    lambda: T.update({target_not_before(): _backed_off_to(target_host())}).where(
        Inline(target_not_before().is_null(False)) & (target_not_before() <= Slot("now"))
    ),
    order=("now", "now"),
)


def _backed_off_to(host: Any) -> peewee.Node:
    """The last second of ``host``'s back-off, if it is after the second ``now``; NULL otherwise."""
    row = HOST_POLICY.alias("backoff")
    second = row.backed_off_until_ms / literal(1000)
    end: peewee.Node = row.select(second).where((row.host == host) & (second > Slot("now")))
    return end


# The ring's cursor, locked first by every claim: claims take turns (PostgreSQL; SQLite's writes do anyway).
# A requeue of stale claims takes it first too: it locks jobs in id order, a claim in claim order.
LOCK_RING = Statement(
    lambda: db.backend.lock_rows(
        _RING.select(_RING.caller, _RING.turns).where(_RING.id == literal(0)).bind(db)  # type: ignore[attr-defined]
    ),
    order=(),
)
_SAVE_RING = Statement(
    lambda: (
        _RING.update({_RING.caller: Slot("caller"), _RING.turns: Slot("turns")})  # type: ignore[attr-defined]
        .where(_RING.id == literal(0))  # type: ignore[attr-defined]
        .bind(db)
    ),
    order=("caller", "turns"),
)


def _caller_job_after(after: bool) -> peewee.Node:
    """The first caller (byte order) with a live job that has a pending target, after ``after`` when asked,
    and that caller's oldest such job (claim order), locked as ``_CALLER_JOB`` locks it: one walk of
    batch_job_ring, each live job probed in batch_target_host; callers without pending work cost a probe
    of each live job, in one statement."""
    caller = db.backend.bytewise(J.caller)
    where = _live() & _unpaused() & _has_pending()
    if after:
        where &= caller > Slot("after")
    return db.backend.lock_rows(
        J.select(J.id, J.created_at, db.backend.insertion_order, J.caller_class, J.caller)
        .where(where)
        .order_by(caller, J.created_at, db.backend.insertion_order)
        .limit(literal(1))
    )


_NEXT_CALLER_JOB = Statement(lambda: _caller_job_after(True), order=("after",))
_FIRST_CALLER_JOB = Statement(lambda: _caller_job_after(False), order=())
# The caller's next live job with a pending target, in claim order, locked (waiting, never skipped: a result
# write holds its job's row only briefly, and a skipped job would starve its caller) before its targets.
_CALLER_JOB = Statement(
    lambda: db.backend.lock_rows(
        J.select(J.id, J.created_at, db.backend.insertion_order, J.caller_class)
        .where(
            _live()
            & (db.backend.bytewise(J.caller) == Slot("caller"))
            & _after("after_created", "after_order")
            & _unpaused()
            & _has_pending()
        )
        .order_by(J.created_at, db.backend.insertion_order)
        .limit(literal(1))
    ),
    order=("caller", "after_created", "after_order"),
)
# fair=False: the next live job with a pending target across all callers, in claim order, locked.
_NEXT_JOB = Statement(
    lambda: db.backend.lock_rows(
        J.select(J.id, J.created_at, db.backend.insertion_order, J.caller_class)
        .where(_live() & _after("after_created", "after_order") & _unpaused() & _has_pending())
        .order_by(J.created_at, db.backend.insertion_order)
        .limit(literal(1))
    ),
    order=("after_created", "after_order"),
)


def _held(host: Any, held: bool = True) -> peewee.Node:
    """``host`` is held back by its row (not due, or backed off, at ``now_ms``), or with ``held=False`` is
    not: a probe of the policy's key, written as a scalar subquery, which PostgreSQL never turns into a join
    reading the whole policy table (see ``_unpaused``)."""
    row = HOST_POLICY.alias("held")
    probe = row.select(literal(1)).where(
        (row.host == host)
        & (row.host != DEFAULT_HOST)
        & ((row.next_due_ms > Slot("now_ms")) | (row.backed_off_until_ms > Slot("now_ms")))
    )
    found = peewee.fn.COALESCE(probe, literal(0))
    return found == literal(1) if held else found != literal(1)


def _setting(column: Any, walk: Any) -> peewee.Node:
    """The walked host's ``column`` of its policy row (NULL: none), by the key: a scalar subquery, not a
    join, so neither backend loops over the walk's rows."""
    setting: peewee.Node = _P.select(column).where(_P.host == walk.c.host)
    return setting


def _host_walk(inclusive: bool) -> peewee.Node:
    """The job's first pending host (byte order) at or after ``host`` that its row does not hold back, with
    its policy's limit and interval (NULL: none): a recursive walk, one probe of batch_target_host a host
    (a skip scan: no target of a held host is read) and one of the policy's key, in one statement, so a
    claim's cost grows with the held hosts it passes in SQL, not in round trips."""
    host = db.backend.bytewise(target_host())
    bound = host >= Slot("host") if inclusive else host > Slot("host")
    first = (
        T.select(target_host())
        .where((T.job_id == Slot("job_id")) & _pending(T) & bound)
        .order_by(host)
        .limit(literal(1))
    )
    walk: Any = peewee.Select(columns=[peewee.Alias(first, "host")]).cte(
        "walk", recursive=True, columns=("host",)
    )
    later = T.alias("later")
    later_host = db.backend.bytewise(target_host(later))
    step = (
        later.select(target_host(later))
        .where(
            (later.job_id == Slot("job_id"))
            & _pending(later)
            & (later_host > db.backend.bytewise(walk.c.host))
        )
        .order_by(later_host)
        .limit(literal(1))
    )
    walked = walk.union_all(
        peewee.Select([walk], [peewee.Alias(step, "host")]).where(
            walk.c.host.is_null(False) & _held(walk.c.host)
        )
    )
    return (
        peewee.Select(
            [walked], [walk.c.host, _setting(_P.max_running, walk), _setting(_P.min_interval_ms, walk)]
        )
        .where(walk.c.host.is_null(False) & _held(walk.c.host, held=False))
        .limit(literal(1))
        .with_cte(walked)
        .bind(db)
    )


_HOST_FROM = Statement(lambda: _host_walk(True))
_HOST_AFTER = Statement(lambda: _host_walk(False))
# The running targets' hosts, one row each (counted in Python: a GROUP BY sorts): read from
# batch_target_running, bounded by what runners hold.
_RUNNING_HOSTS = Statement(
    lambda: T.select(target_host()).where(Inline(T.status == TargetStatus.RUNNING.value))
)
# Whether any host has a row (a policy, a back-off, a pacing time): with none, a claim walks no hosts.
_ANY_POLICY = Statement(lambda: _P.select(_P.host).limit(literal(1)), order=())
# One host's row, by its key: the default's once a claim, each other host's as the walk reaches it.
_HOST_POLICY = Statement(
    lambda: _P.select(_P.max_running, _P.min_interval_ms, _P.next_due_ms, _P.backed_off_until_ms).where(
        _P.host == Slot("host")
    )
)
_ADD_HOST = Statement(lambda: _P.insert({_P.host: Slot("host")}).on_conflict_ignore())
_SET_NEXT_DUE = Statement(lambda: _P.update({_P.next_due_ms: Slot("due")}).where(_P.host == Slot("host")))
_PICK = T.alias("pending")


def _claim_targets(by_host: bool) -> peewee.Node:
    """The job's first ``take`` pending targets (host by host, then idx; of ``host`` only, ``by_host``)
    become running, held by ``runner`` with its heartbeat at ``now``, one more attempt each; the statement
    returns them, each with its host last.

    They are picked in a MATERIALIZED CTE: as an ``IN (… LIMIT … FOR UPDATE SKIP LOCKED)`` subquery,
    PostgreSQL ran the subquery again for each row it updated, and so updated every pending target. The
    update finds the picked rows by their address alone (``backend.row_address``; the pick locked them, so
    they cannot move), by ``backend.among``: PostgreSQL planned a join, or a lookup by job and idx, as a
    nested loop or a filter testing each of the job's pending targets against every picked one, quadratic
    in ``take``; by address alone it reads each picked row once (a TID scan)."""
    where = (
        (_PICK.job_id == Slot("job_id"))
        & _pending(_PICK)
        & (_of_host(_PICK) if by_host else _any_host(_PICK))
    )
    first: Any = db.backend.lock_rows(
        _PICK.select(db.backend.row_address.alias("address"))
        .where(where)
        .order_by(*_host_order(_PICK))
        .limit(Slot("take")),
        skip_locked=True,
    )
    picked = first.cte("picked", materialized=True)
    return (
        T.update(
            {
                T.status: Inline(peewee.Value(TargetStatus.RUNNING.value)),
                T.runner: Slot("runner"),
                T.heartbeat: Slot("now"),
                T.attempts: T.attempts + literal(1),
            }
        )
        # The pick locked its rows, pending targets of this job: nothing else may narrow the plan's choice.
        .where(db.backend.among(db.backend.row_address, peewee.Select([picked], [picked.c.address])))
        .with_cte(picked)
        .returning(*[getattr(T, n) for n in TARGET_COLUMNS], target_host())
    )


_CLAIM_TARGETS = Statement(lambda: _claim_targets(False), order=("job_id", "take", "runner", "now"))
_CLAIM_HOST_TARGETS = Statement(lambda: _claim_targets(True))
# Every job the claim took from, once, at its end: its lookup locked it (before its targets) and found it
# live, so the update waits for no one and the live test changes nothing; it keeps SQLite, which would scan
# a job table of a few dozen rows for the list's rows, on the key's index.
_CLAIM_JOBS = Statement(
    lambda: J.update({J.status: Inline(peewee.Value(JobStatus.RUNNING.value)), J.lease: Slot("now")}).where(
        db.backend.one_of(J.id, Slot("job_ids")) & _live()
    ),
    order=("now", "job_ids"),
)


class _HostRule:
    """What one host allows this claim: at most ``cap`` running (None: no cap), ``interval`` ms between two
    claims of it (0: unpaced), and whether it is held back (not due, or backed off)."""

    __slots__ = ("cap", "held", "interval")

    def __init__(self, cap: int | None, interval: int, held: bool) -> None:
        self.cap, self.interval, self.held = cap, interval, held


class HostRules:
    """The host rules one claim follows: ``per_host``, and each host's policy, read by its key as the walk
    reaches the host (never the whole table), the default's (``*``) once. A paced host gives one target a
    claim, and is next due ``interval`` plus ``PACING_SLACK`` after it: claims take turns on the ring's
    row, so every runner sees the due time the last claim wrote."""

    def __init__(
        self, execute: Execute, sql: dict[Statement, str], per_host: int | None, now_ms: int
    ) -> None:
        self.execute, self.sql = execute, sql
        self.per_host = per_host
        self.now_ms = now_ms
        self.active = per_host is not None
        self.default: tuple[int | None, int] = (None, 0)
        self.rules: dict[str, _HostRule] = {}
        self.paced: dict[str, int] = {}  # hosts this claim took from under pacing: their next due time
        self.running: Counter[str] | None = None

    def load(self) -> None:
        """Inside the claim, after the ring's lock: whether any host has a row, and the default policy."""
        if not self.execute(self.sql[_ANY_POLICY], ()).fetchall():
            return
        self.active = True
        row = _HOST_POLICY.rows_in(self.execute, host=DEFAULT_HOST)
        if row:
            self.default = (row[0][0], row[0][1] or 0)

    def _rule(self, host: str) -> _HostRule:
        rule = self.rules.get(host)
        if rule is None:
            row = _HOST_POLICY.rows_in(self.execute, host=host) if host != DEFAULT_HOST else []
            limit, interval, due, until = row[0] if row else (None, None, 0, 0)
            rule = self._add(host, limit, interval, self.now_ms < max(due, until))
        return rule

    def _add(self, host: str, limit: int | None, interval: int | None, held: bool) -> _HostRule:
        """``host``'s rule from its row's limit and interval (None: the default's) and whether it is held."""
        limit = self.default[0] if limit is None else limit
        caps = [cap for cap in (self.per_host, limit) if cap is not None]
        interval = self.default[1] if interval is None else interval
        rule = self.rules[host] = _HostRule(min(caps) if caps else None, int(interval), held)
        return rule

    def reached(self, host: str, limit: int | None, interval: int | None) -> None:
        """The walk reached ``host``, not held back by its row, whose limit and interval it read."""
        if host not in self.rules:
            self._add(host, *((None, None) if host == DEFAULT_HOST else (limit, interval)), held=False)

    def room(self, host: str) -> int:
        """How many more of ``host``'s targets this claim may take (0: skip the host)."""
        rule = self._rule(host)
        if rule.held or host in self.paced:
            return 0
        room = _NO_CAP
        if rule.cap is not None:
            if self.running is None:  # read once, where a cap first applies: bounded by what runners hold
                self.running = Counter(row[0] for row in _RUNNING_HOSTS.rows_in(self.execute))
            room = rule.cap - self.running[host]
        return min(room, 1) if rule.interval else room

    def took(self, host: str, count: int) -> None:
        """The claim took ``count`` of ``host``'s targets."""
        if self.running is not None:
            self.running[host] += count
        rule = self._rule(host)
        if count and rule.interval:
            self.paced[host] = self.now_ms + rule.interval + _PACING_SLACK_MS

    def save(self) -> None:
        """The paced hosts' next due times, written in the claim's transaction."""
        for host, due in self.paced.items():
            _ADD_HOST.run_in(self.execute, host=host)
            _SET_NEXT_DUE.run_in(self.execute, host=host, due=due)


#: No cap: more than any claim takes.
_NO_CAP = 2**62
_PACING_SLACK_MS = round(PACING_SLACK * 1000)


class _Job:
    """A job this claim takes from: how many it took, and where its walk of hosts stands."""

    __slots__ = ("caller_class", "done", "host", "host_inclusive", "id", "position", "taken")

    def __init__(self, row: Any) -> None:
        self.id: str = row[0]
        self.position: tuple[int, int] = (row[1], row[2])
        self.caller_class: str = row[3]
        self.taken = 0
        self.done = False  # nothing more to take from it in this claim
        self.host = ""  # the walk resumes at this host (inclusive) or after it
        self.host_inclusive = True


class _Caller:
    """A member of the ring: its weight, its current job and its place among its jobs."""

    __slots__ = ("after", "job", "name", "out", "weight")

    def __init__(self, name: str) -> None:
        self.name = name
        self.weight = 1
        self.job: _Job | None = None
        self.after: tuple[int, int] = (-1, -1)  # jobs at or before this position are done for this claim
        self.out = False  # nothing claimable: it has left this claim's ring


#: The walk's statements it sends itself, its values by position (the statement's ``order``): a dozen a
#: claim, each with no call between the walk and the driver.
_BY_POSITION = (
    LOCK_RING,
    _PROMOTE_DUE,
    _ANY_POLICY,
    _NEXT_CALLER_JOB,
    _FIRST_CALLER_JOB,
    _CALLER_JOB,
    _NEXT_JOB,
    _CLAIM_TARGETS,
    _SAVE_RING,
    _CLAIM_JOBS,
)
#: Their SQL for each backend (``statement_key``), read once.
_SQL: dict[str, dict[Statement, str]] = {}


def _walk_sql() -> dict[Statement, str]:
    """The SQL of ``_BY_POSITION`` for the backend open now."""
    sql = _SQL[db.backend.statement_key] = {
        statement: statement.sql_by_position() for statement in _BY_POSITION
    }
    return sql


class ClaimOrder:
    """One claim's walk: built and run inside the claim's transaction (see :meth:`run`)."""

    def __init__(
        self,
        execute: Execute,
        *,
        per_job: int,
        per_host: int | None,
        weights: Mapping[str, int] | None,
        runner: str,
        now: int,
        now_ms: int,
    ) -> None:
        self.execute = execute
        self.sql = sql = _SQL.get(db.backend.statement_key) or _walk_sql()
        self.per_job = per_job
        self.hosts = HostRules(execute, sql, per_host, now_ms)
        self.weights = weights or {}
        self.runner = runner
        self.now = now
        self.claimed: list[Any] = []
        self.members: dict[str, _Caller] = {}
        self.lap_closed = False
        self.taken_from: dict[str, None] = {}  # the jobs claimed from, each once

    def run(self, limit: int, fair: bool) -> list[Any]:
        """Claim up to ``limit`` targets; return their rows (TARGET_COLUMNS, then the host), in the order
        handed out. The jobs claimed from become running, with ``lease = now``, in one statement at its
        end."""
        execute = self.execute
        ring = execute(self.sql[LOCK_RING], ()).fetchall()
        execute(self.sql[_PROMOTE_DUE], (self.now, self.now))
        self.hosts.load()
        if not fair:
            self._oldest_first(limit)
        elif ring:
            self._ring(limit, ring[0][0], int(ring[0][1]))
        if self.taken_from:
            execute(self.sql[_CLAIM_JOBS], (self.now, db.backend.listed(list(self.taken_from))))
        if self.hosts.paced:
            self.hosts.save()
        return self.claimed

    # -- fair=False: oldest job first across callers ------------------------------------------------------

    def _oldest_first(self, limit: int) -> None:
        after = (-1, -1)
        while len(self.claimed) < limit:
            row = self.execute(self.sql[_NEXT_JOB], after).fetchall()
            if not row:
                return
            job = _Job(row[0])
            self._take(job, min(self.per_job, limit - len(self.claimed)))
            after = job.position

    # -- the ring -------------------------------------------------------------------------------------------

    def _ring(self, limit: int, cursor: str | None, used: int) -> None:
        """Turn by turn from the cursor; once every member is known and no host limit applies, whole rounds
        at once (the same targets: each member's share of k rounds is k times its weight, or all it has):
        not where host rules apply, which may skip a member's targets in one round and not the next."""
        last, last_used = cursor, used
        current: _Caller | None = None
        most = max(self.weights.values()) if self.weights else 1
        if cursor is not None and 0 < used < most:  # its turn may go on
            member = self._load(cursor)
            if not member.out and used < member.weight:
                current = member
        if current is None:
            current, used = self._following(cursor), 0
        while current is not None and len(self.claimed) < limit:
            remaining = limit - len(self.claimed)
            if used == 0 and self.lap_closed and not self.hosts.active:
                turn = self._rounds(current, remaining)
                if turn is not None:
                    last, last_used = turn
                    if len(self.claimed) >= limit:
                        break
                    current, used = self._following(last), 0
                    continue
            want = min(current.weight - used, remaining)
            got = self._serve(current, want)
            if got:
                used += got
                last, last_used = current.name, used
            if got < want:
                current.out = True
            if current.out or used >= current.weight:
                if len(self.claimed) >= limit:
                    break  # full: no need to find, and lock the job of, the member that would come next
                current, used = self._following(current.name), 0
        if self.claimed:
            self.execute(self.sql[_SAVE_RING], (last, last_used))

    def _rounds(self, start: _Caller, remaining: int) -> tuple[str, int] | None:
        """k = remaining // (sum of weights) whole rounds, from ``start`` through every member in ring order;
        None when not even one fits. Returns the cursor after them: the last member served in the last round
        that served anyone, and the turns it used there."""
        members = self._in_order(start)
        rounds = remaining // sum([member.weight for member in members])
        if rounds == 0:
            return None
        claimed = self.claimed
        got, turns = [], []
        for member in members:
            weight = member.weight
            want = rounds * weight
            before = len(claimed)
            took = self._serve(member, want)
            if took < want:
                member.out = True
            got.append(took)
            rows = claimed[before:]
            del claimed[before:]
            whole = list(zip(*[iter(rows)] * weight, strict=False))  # its whole turns: a short one stops zip
            if took % weight:  # and its last, short: it ran out
                whole.append(tuple(rows[took - took % weight :]))
            turns.append(whole)
        # Handed out as turn by turn would: round by round, member by member.
        claimed += chain.from_iterable(chain.from_iterable(zip_longest(*turns, fillvalue=())))
        for round_ in range(rounds, 0, -1):
            earlier = round_ - 1
            for member, took in zip(reversed(members), reversed(got), strict=True):
                if took > earlier * member.weight:
                    return member.name, min(member.weight, took - earlier * member.weight)
        return None  # nobody had anything: every member has left the ring

    def _in_order(self, start: _Caller) -> list[_Caller]:
        names = sorted([name for name, member in self.members.items() if not member.out])
        at = names.index(start.name)
        return [self.members[name] for name in names[at:] + names[:at]]

    def _following(self, name: str | None) -> _Caller | None:
        """The ring's next member with something to claim after ``name`` (byte order, wrapping round). Until
        the walk has come round the whole ring, each step is a search of batch_job_ring that finds the next
        caller and its job at once; then the members are known, and the walk goes on among them."""
        if not self.lap_closed:
            row = self.execute(self.sql[_NEXT_CALLER_JOB], (name,)).fetchall() if name is not None else []
            if not row:
                row = self.execute(self.sql[_FIRST_CALLER_JOB], ()).fetchall()
                if not row:
                    return None
            if row[0][4] not in self.members:
                return self._join(row[0])
            # Round the whole ring once: every member is known. The job the search locked (that member's
            # oldest with a pending target) is one this claim holds already, or the one it would take next.
            self.lap_closed = True
        names = sorted([n for n, member in self.members.items() if not member.out])
        if not names:
            return None
        after = 0 if name is None else bisect.bisect_right(names, name)
        return self.members[names[after] if after < len(names) else names[0]]

    def _join(self, row: Any) -> _Caller:
        """The caller of ``row``, its oldest live job with a pending target, as a member: its weight is that
        job's class."""
        member = self.members[row[4]] = _Caller(row[4])
        member.job = _Job(row)
        member.weight = self.weights.get(member.job.caller_class, 1)
        return member

    def _load(self, name: str) -> _Caller:
        """The caller the ring's cursor names as a member (to go on with its turn): its weight is the class of
        its oldest live job with a pending target; none, and it is out."""
        member = self.members[name] = _Caller(name)
        job = self._next_job(member)
        if job is not None:
            member.weight = self.weights.get(job.caller_class, 1)
        return member

    def _next_job(self, member: _Caller) -> _Job | None:
        """The member's next live job with a pending target; none: the member leaves the ring."""
        row = self.execute(self.sql[_CALLER_JOB], (member.name, *member.after)).fetchall()
        member.job = _Job(row[0]) if row else None
        member.out = not row
        return member.job

    def _serve(self, member: _Caller, want: int) -> int:
        """Up to ``want`` targets of the member's jobs, oldest job first, at most ``per_job`` from each."""
        got = 0
        while got < want and not member.out:
            job = member.job if member.job is not None else self._next_job(member)
            if job is None:
                break
            got += self._take(job, min(self.per_job - job.taken, want - got))
            if job.done or job.taken >= self.per_job:
                member.after, member.job = job.position, None
        return got

    def _take(self, job: _Job, want: int) -> int:
        """Up to ``want`` of the job's pending targets, host by host (byte order), by idx within a host; where
        host rules apply, a host they hold back (at its limit, paced, backed off) is skipped."""
        rows: list[Any] = []
        if not self.hosts.active:
            rows = self.execute(self.sql[_CLAIM_TARGETS], (job.id, want, self.runner, self.now)).fetchall()
            rows.sort(key=_claim_key)
            if len(rows) < want:
                job.done = True
        else:
            rows = self._take_by_host(job, want)
        if rows:
            self.taken_from[job.id] = None
            job.taken += len(rows)
            self.claimed += rows
        return len(rows)

    def _take_by_host(self, job: _Job, want: int) -> list[Any]:
        """The job's hosts walked in order, past the hosts their rows hold back (one statement, see
        ``_host_walk``), taking what each host's rules leave room for; a host at its limit, or paced by
        this claim already, is passed by the next walk."""
        rows: list[Any] = []
        while len(rows) < want:
            probe = _HOST_FROM if job.host_inclusive else _HOST_AFTER
            found = probe.rows_in(self.execute, job_id=job.id, host=job.host, now_ms=self.hosts.now_ms)
            if not found:
                job.done = True
                break
            host, limit, interval = found[0]
            self.hosts.reached(host, limit, interval)
            job.host, job.host_inclusive = host, True
            room = self.hosts.room(host)
            if room > 0:
                ask = min(room, want - len(rows))
                got = _CLAIM_HOST_TARGETS.rows_in(
                    self.execute, job_id=job.id, host=host, take=ask, runner=self.runner, now=self.now
                )
                self.hosts.took(host, len(got))
                rows += sorted(got, key=_claim_key)
                if len(got) == ask and self.hosts.room(host) > 0:
                    continue  # the want is met, or the host has more
            job.host_inclusive = False  # held back, or no more of it in this job: the next host
        return rows
