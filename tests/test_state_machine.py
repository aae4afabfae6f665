"""Random sequences of every operation, the store's functions and writes through the models (a target's
save(), a job's status save(), a job's delete), against a plain-Python reference model of the rules.

After every step the store must agree with the model: each job's row and targets, the rule 4 invariants
(computed again from the stored targets), lease values, idempotency answers, live counts and the byte
total. Sweep and evict must return what the model returns, remove exactly the model's jobs, and never
evict a queued or running job; a claim must hand out exactly the model's targets, in its order, and a
rescue fail exactly its stale live jobs. Small id, caller and key alphabets make collisions common.

HYPOTHESIS_PROFILE=deep runs 2000 examples of each machine.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import POSTGRES_URL, SUFFIX, postgres_missing, postgres_target
from freezegun import freeze_time
from helpers import make_job, make_target
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sift import dcache
from sift.dcache.politeness import MAX_BACK_OFF, PACING_SLACK, SEND_WINDOW

JOB_IDS = ["a", "b", "c", "é"]
CALLERS = ["alice", "bob"]
KEYS = ["", "k1", "k2"]
# Hypothesis leans towards the first choices: those that make busy states come first.
JOB_STATUSES = ["done", "running", "queued", "partial", "failed", "cancelled"]
TARGET_STATUSES = ["done", "failed", "running", "pending"]
LIVE = ("queued", "running")
FINISHED = ("done", "partial", "failed", "cancelled")
IDEM = ("queued", "running", "done", "partial")
FINAL = ("done", "failed")
UNCLAIMED = ("pending", "failed")  # a write of these ends the target's claim
#: The runners that claim; None in an update is a write that names no runner (a client's).
RUNNERS = ["r1", "r2"]
MAX_TOTAL = 4

# A narrow clock, so that equal leases (eviction ties) and lease + ttl == now (boundaries) are common.
times = st.integers(min_value=0, max_value=20)
texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=6)
results = st.one_of(st.sampled_from(["€", "😀", "x" * 20, "é", "a\x01b", ""]), texts, st.none())
# Seconds as int, as a float with an exact binary fraction, or as a timedelta (down to milliseconds).
ttls = st.one_of(
    st.integers(min_value=0, max_value=10),
    st.integers(min_value=0, max_value=40).map(lambda q: q / 4),
    st.integers(min_value=0, max_value=40).map(lambda q: timedelta(milliseconds=250 * q)),
    st.integers(min_value=0, max_value=10_000).map(lambda ms: timedelta(milliseconds=ms)),
)
# Target idxs for a put or a create: often valid, sometimes out of range or repeated.
idx_lists = st.lists(st.integers(min_value=0, max_value=MAX_TOTAL + 1), max_size=MAX_TOTAL + 1)
#: Create the job with every one of its targets.
ALL = "all"


@dataclass(frozen=True)
class Spec:
    """A new job's fields."""

    caller: str
    key: str
    status: str
    caller_class: str
    total: int
    created_at: int
    lease: int


specs = st.builds(
    Spec,
    caller=st.sampled_from(CALLERS),
    key=st.sampled_from(KEYS),
    status=st.sampled_from(JOB_STATUSES),
    caller_class=st.sampled_from(["fleet", "restricted"]),
    total=st.integers(min_value=1, max_value=MAX_TOTAL) | st.just(0),
    created_at=st.integers(min_value=0, max_value=5),
    lease=times,
)


def clock_at(now: int) -> datetime:
    """The wall-clock time whose unix second is ``now``, for freezegun."""
    return datetime.fromtimestamp(now, UTC)


def ttl_seconds(ttl: Any) -> Fraction:
    """The exact length of ``ttl`` in seconds."""
    if isinstance(ttl, timedelta):
        return Fraction(ttl // timedelta(microseconds=1), 1_000_000)
    return Fraction(ttl)


def utf8(text: str | None) -> int:
    return 0 if text is None else len(text.encode("utf-8"))


@dataclass
class MTarget:
    url: str
    options: str
    status: str = "pending"
    result: str | None = None
    error: str | None = None
    hint: str | None = None
    runner: str | None = None
    heartbeat: int | None = None
    attempts: int = 0


@dataclass
class MJob:
    caller: str
    caller_class: str
    idem_key: str
    status: str
    error: str
    targets_total: int
    created_at: int
    lease: int
    seq: int
    targets: dict[int, MTarget] = field(default_factory=dict)

    @property
    def targets_done(self) -> int:
        return sum(1 for t in self.targets.values() if t.status in FINAL)

    @property
    def nbytes(self) -> int:
        return sum(utf8(t.result) for t in self.targets.values())


def url_for(idx: int) -> str:
    """Two hosts, spelled in ways url_host makes one: a per-host limit then has hosts to fill."""
    return f"https://{'H0.Example' if idx % 2 == 0 else 'user@h1.example:8080'}/{idx}"


def target_for(idx: int) -> MTarget:
    return MTarget(url=url_for(idx), options='{"render":false}')


def bad_idxs(idxs: list[int], total: int, stored: set[int]) -> bool:
    """Whether a put of ``idxs`` breaks a rule: out of range, repeated in the call, or already stored."""
    return any(not 0 <= i < total for i in idxs) or len(set(idxs)) != len(idxs) or bool(set(idxs) & stored)


#: The claim rule's orders: weights by caller class, or fair=False.
CLAIM_WEIGHTS: dict[str, dict[str, int] | None] = {
    "fair": None,
    "weighted": {"fleet": 2},
    "weighted the other way": {"restricted": 3, "fleet": 1},
    "oldest first": None,
}


def host_setting(policies: dict[str, tuple[int | None, int | None]], host: str, which: int) -> int | None:
    """``host``'s max_running (``which`` 0) or min_interval in ms (1): its own, else the default's."""
    own = policies.get(host, (None, None))[which]
    return own if own is not None else policies.get("*", (None, None))[which]


class ModelClaim:
    """The claim's order, turn by turn: the ring of callers with a live job holding a pending target (byte
    order), from the machine's cursor; each caller's turn hands out up to its weight (the class of its
    oldest live job with a pending target), one target at a time from its oldest live job with a claimable
    target (per_job this claim, per_host running), host by host (byte order), lowest idx first within a
    host; a caller with nothing claimable leaves. fair=False: the oldest job first across callers."""

    def __init__(
        self,
        machine: StoreMachine,
        limit: int,
        per_job: int | None,
        per_host: int | None,
        weights: dict[str, int] | None,
        now: int,
    ) -> None:
        self.machine, self.jobs, self.now_ms = machine, machine.jobs, now * 1000
        self.limit, self.per_job, self.per_host = limit, per_job or limit, per_host
        self.weights = weights or {}
        self.running = Counter(
            dcache.url_host(t.url)
            for job in self.jobs.values()
            for t in job.targets.values()
            if t.status == "running"
        )
        self.taken: Counter[str] = Counter()
        self.paced: set[str] = set()  # paced hosts this claim took from: one target each
        self.claimed: list[tuple[str, int]] = []
        self.pending = {
            (job_id, idx)
            for job_id, job in self.jobs.items()
            for idx, t in job.targets.items()
            if t.status == "pending"
        }

    def job_order(self) -> list[str]:
        """The live jobs neither paused nor of a paused caller, in claim order."""
        paused, callers = self.machine.paused_jobs, self.machine.paused_callers
        return sorted(
            (
                job_id
                for job_id, job in self.jobs.items()
                if job.status in LIVE and job_id not in paused and job.caller not in callers
            ),
            key=lambda job_id: (self.jobs[job_id].created_at, self.jobs[job_id].seq),
        )

    def next_of_job(self, job_id: str) -> int | None:
        """The job's next claimable target in this claim, or None: not of a host backed off or not due, at
        its cap (the stricter of per_host and its policy's), or paced and taken from in this claim."""
        if self.taken[job_id] >= self.per_job:
            return None
        pending = (idx for j, idx in self.pending if j == job_id)
        for idx in sorted(pending, key=lambda i: (dcache.url_host(self.jobs[job_id].targets[i].url), i)):
            host = dcache.url_host(self.jobs[job_id].targets[idx].url)
            held_until = max(self.machine.backed_off.get(host, 0), self.machine.next_due.get(host, 0))
            if held_until > self.now_ms or host in self.paced:
                continue
            limit = host_setting(self.machine.policies, host, 0)
            caps = [cap for cap in (self.per_host, limit) if cap is not None]
            if not caps or self.running[host] < min(caps):
                return idx
        return None

    def take(self, job_id: str, idx: int) -> None:
        self.pending.discard((job_id, idx))
        self.taken[job_id] += 1
        host = dcache.url_host(self.jobs[job_id].targets[idx].url)
        self.running[host] += 1
        self.claimed.append((job_id, idx))
        if host_setting(self.machine.policies, host, 1):
            self.paced.add(host)

    def next_of_caller(self, caller: str) -> tuple[str, int] | None:
        for job_id in self.job_order():
            if self.jobs[job_id].caller == caller and (idx := self.next_of_job(job_id)) is not None:
                return job_id, idx
        return None

    def run(self, fair: bool) -> list[tuple[str, int]]:
        if not fair:
            for job_id in self.job_order():
                while len(self.claimed) < self.limit and (idx := self.next_of_job(job_id)) is not None:
                    self.take(job_id, idx)
            return self.claimed
        with_pending = [j for j in self.job_order() if any(job == j for job, _ in self.pending)]
        weight = {}
        for job_id in reversed(with_pending):  # the class of each caller's oldest job with pending work
            weight[self.jobs[job_id].caller] = self.weights.get(self.jobs[job_id].caller_class, 1)
        members, out = sorted(weight), set()

        def following(name: str | None) -> str | None:
            left = [c for c in members if c not in out]
            return next((c for c in left if name is None or c > name), left[0] if left else None)

        last, last_used = self.machine.ring
        current, used = None, 0
        if last in weight and 0 < last_used < weight[last]:
            current, used = last, last_used
        else:
            current = following(last)
        while current is not None and len(self.claimed) < self.limit:
            want = min(weight[current] - used, self.limit - len(self.claimed))
            got = 0
            while got < want and (found := self.next_of_caller(current)) is not None:
                self.take(*found)
                got += 1
            if got:
                used += got
                last, last_used = current, used
            if got < want:
                out.add(current)
            if current in out or used >= weight[current]:
                current, used = following(current), 0
        if self.claimed:
            self.machine.ring = (last, last_used)
        return self.claimed


class StoreMachine(RuleBasedStateMachine):
    """The store opened in memory; a subclass runs the same machine on a WAL file."""

    def __init__(self) -> None:
        super().__init__()
        dcache.open_db(self.path())
        self.jobs: dict[str, MJob] = {}
        self.seq = 0
        self.ring: tuple[str | None, int] = (None, 0)  # the claims' cursor: caller served last, turns used
        # politeness: paused job ids (kept by id until resumed), paused callers, back-off ends (ms) by host
        self.paused_jobs: set[str] = set()
        self.paused_callers: set[str] = set()
        self.backed_off: dict[str, int] = {}
        # host policies by host ("*": the default): (max_running, min_interval in ms), and next due (ms)
        self.policies: dict[str, tuple[int | None, int | None]] = {}
        self.next_due: dict[str, int] = {}

    def path(self) -> str | Path:
        return ":memory:"

    def teardown(self) -> None:
        dcache.close_db()

    # -- Helpers ---------------------------------------------------------------------------------------

    def call(self, allowed: set[type[Exception]], fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn``: with ``allowed`` empty it must succeed, else raise one of those classes."""
        try:
            out = fn(*args, **kwargs)
        except dcache.BatchError as exc:
            assert type(exc) in allowed, (
                f"{fn.__name__} raised {exc!r}, expected one of {allowed or 'nothing'}"
            )
            event(f"{fn.__name__}: {type(exc).__name__}")
            return exc
        assert not allowed, f"{fn.__name__} returned {out!r}, expected one of {allowed}"
        event(f"{fn.__name__}: ok")
        return out

    def some_job_id(self, data: st.DataObject) -> str:
        """Often a stored job's id, else any id (so that misses happen too)."""
        stored = sorted(self.jobs)
        pick_stored = data.draw(st.booleans())
        if stored and pick_stored:
            return data.draw(st.sampled_from(stored))
        return data.draw(st.sampled_from(JOB_IDS))

    # -- Writes ------------------------------------------------------------------------------------------

    @initialize(data=st.data(), first=st.lists(specs, min_size=3, max_size=len(JOB_IDS) - 1))
    def create_first_jobs(self, data: st.DataObject, first: list[Spec]) -> None:
        """Start each run with a few jobs holding all their targets, most of them finished with a result,
        and sometimes all on one lease: even a run of one rule over and over then has bytes to count, and
        eviction has ties on lease to break by created_at and id."""
        one_lease = data.draw(st.booleans())
        for job_id, spec in zip(JOB_IDS, first, strict=False):
            if one_lease:
                spec = dataclasses.replace(spec, lease=first[0].lease)
            self.create(job_id, spec, ALL)
            for idx in range(spec.total):
                status = data.draw(st.sampled_from(TARGET_STATUSES))
                result = data.draw(results) if status in FINAL else None
                self.update(job_id, idx, status, result, None, None, spec.lease)

    @rule(job_id=st.sampled_from(JOB_IDS), spec=specs, idxs=st.none() | st.just(ALL))
    def create(self, job_id: str, spec: Spec, idxs: str | None) -> None:
        self.do_create(job_id, spec, None if idxs is None else list(range(spec.total)))

    @rule(
        job_id=st.sampled_from(JOB_IDS),
        caller=st.sampled_from(CALLERS),
        caller_class=st.sampled_from(["fleet", "restricted"]),
        total=st.integers(min_value=1, max_value=MAX_TOTAL),
        created_at=st.integers(min_value=0, max_value=5),
    )
    def submit_live(self, job_id: str, caller: str, caller_class: str, total: int, created_at: int) -> None:
        """A queued job with all its targets pending: claims then meet several callers with work."""
        spec = Spec(caller, "", "queued", caller_class, total, created_at, 10)
        self.do_create(job_id, spec, list(range(total)))

    @rule(job_id=st.sampled_from(JOB_IDS), spec=specs, idxs=idx_lists)
    def create_with_idxs(self, job_id: str, spec: Spec, idxs: list[int]) -> None:
        """Targets given by idx: often out of range, repeated or fewer than the total, which refuses the
        whole job."""
        self.do_create(job_id, spec, idxs)

    def do_create(self, job_id: str, spec: Spec, idxs: list[int] | None) -> None:
        allowed: set[type[Exception]] = set()
        if job_id in self.jobs:
            allowed.add(dcache.DuplicateJob)
        if idxs is not None and (bad_idxs(idxs, spec.total, set()) or len(idxs) != spec.total):
            allowed.add(dcache.InvalidBatchInput)  # targets given must be all the job's
        job = make_job(
            job_id,
            caller=spec.caller,
            idem_key=spec.key,
            status=spec.status,
            caller_class=spec.caller_class,
            targets_total=spec.total,
            created_at=spec.created_at,
            lease=spec.lease,
        )
        targets = None if idxs is None else [make_target(i, url=url_for(i)) for i in idxs]
        self.call(allowed, dcache.create_batch_job, job, targets)
        if not allowed:
            self.seq += 1
            self.jobs[job_id] = MJob(
                spec.caller,
                spec.caller_class,
                spec.key,
                spec.status,
                "",
                spec.total,
                spec.created_at,
                spec.lease,
                self.seq,
            )
            for i in idxs or []:
                self.jobs[job_id].targets[i] = target_for(i)

    @rule(data=st.data(), idxs=idx_lists)
    def put(self, data: st.DataObject, idxs: list[int]) -> None:
        job_id = self.some_job_id(data)
        job = self.jobs.get(job_id)
        allowed: set[type[Exception]] = set()
        if job is None:
            allowed.add(dcache.JobNotFound)
            if bad_idxs(idxs, MAX_TOTAL, set()):
                allowed.add(dcache.InvalidBatchInput)
        elif bad_idxs(idxs, job.targets_total, set(job.targets)):
            allowed.add(dcache.InvalidBatchInput)
        self.call(allowed, dcache.put_batch_targets, job_id, (make_target(i, url=url_for(i)) for i in idxs))
        if not allowed:
            assert job is not None
            for i in idxs:
                job.targets[i] = target_for(i)

    @rule(
        job_id=st.sampled_from(JOB_IDS),
        idx=st.integers(min_value=0, max_value=MAX_TOTAL),
        status=st.sampled_from(TARGET_STATUSES),
        result=results,
        error=st.none() | texts,
        hint=st.none() | st.sampled_from(["", "retry", "ü"]),
        now=times,
        runner=st.none() | st.sampled_from(RUNNERS),
    )
    def update(
        self,
        job_id: str,
        idx: int,
        status: str,
        result: str | None,
        error: str | None,
        hint: str | None,
        now: int,
        runner: str | None = None,
    ) -> None:
        if status not in FINAL:  # result, error and hint go only with done or failed
            result = error = hint = None
        job = self.jobs.get(job_id)
        allowed: set[type[Exception]] = set()
        if job is None:
            allowed.add(dcache.JobNotFound)
        elif idx not in job.targets:
            allowed.add(dcache.TargetNotFound)
            if idx >= job.targets_total:
                allowed.add(dcache.InvalidBatchInput)
        elif runner is not None and job.targets[idx].runner != runner:
            allowed.add(dcache.ClaimLost)  # a late write: this runner does not hold the target
        elif job.targets[idx].status in FINAL and status not in FINAL:
            allowed.add(dcache.InvalidBatchInput)
        self.call(
            allowed,
            dcache.update_batch_target,
            job_id,
            idx,
            status,
            result=result,
            error=error,
            hint=hint,
            runner=runner,
            now=now,
        )
        if not allowed:
            assert job is not None
            target = job.targets[idx]
            target.status, target.result, target.error, target.hint = status, result, error, hint
            if status in UNCLAIMED:  # back in the pool, or failed: the claim ends with the write
                target.runner = target.heartbeat = None
            job.lease = now

    @precondition(lambda self: any(job.targets for job in self.jobs.values()))
    @rule(
        data=st.data(),
        status=st.sampled_from(TARGET_STATUSES),
        result=results,
        error=st.none() | texts,
        hint=st.none() | st.sampled_from(["", "retry", "ü"]),
        now=times,
        runner=st.none() | st.sampled_from(RUNNERS),
    )
    def update_stored(
        self,
        data: st.DataObject,
        status: str,
        result: str | None,
        error: str | None,
        hint: str | None,
        now: int,
        runner: str | None,
    ) -> None:
        """Update a stored target: results, rewrites, refused moves back and late writes are common."""
        stored = sorted((job_id, idx) for job_id, job in self.jobs.items() for idx in job.targets)
        job_id, idx = data.draw(st.sampled_from(stored))
        self.update(job_id, idx, status, result, error, hint, now, runner)

    @precondition(lambda self: any(job.targets for job in self.jobs.values()))
    @rule(data=st.data(), status=st.sampled_from(TARGET_STATUSES), result=results, now=times)
    def save_target(self, data: st.DataObject, status: str, result: str | None, now: int) -> None:
        """A shell user's write: read a stored target through the model, set its status (and its result,
        when final), save(). It keeps the counts as update_batch_target does, or is refused as it is."""
        stored = sorted((job_id, idx) for job_id, job in self.jobs.items() for idx in job.targets)
        job_id, idx = data.draw(st.sampled_from(stored))
        job, modelled = self.jobs[job_id], self.jobs[job_id].targets[idx]
        T = dcache.BatchTarget
        instance = T.get((T.job_id == job_id) & (T.idx == idx))
        instance.status = status
        if status in FINAL:
            instance.result = result
        refused = modelled.status in FINAL and status not in FINAL
        with freeze_time(clock_at(now)):
            self.call({dcache.InvalidBatchInput} if refused else set(), instance.save)
        if not refused:
            if status in FINAL:  # error and hint keep their stored values
                modelled.result = result
            else:
                modelled.result = modelled.error = modelled.hint = None
            if status in UNCLAIMED:
                modelled.runner = modelled.heartbeat = None
            modelled.status, job.lease = status, now

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data(), status=st.sampled_from(JOB_STATUSES), now=times)
    def save_job_status(self, data: st.DataObject, status: str, now: int) -> None:
        """Read a job through the model, set its status, save(): the lease moves to now."""
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        instance = dcache.BatchJob.get_by_id(job_id)
        instance.status = status
        # a finished job does not go back to live through the models
        refused = self.jobs[job_id].status not in LIVE and status in LIVE
        with freeze_time(clock_at(now)):
            saved = self.call({dcache.ModelWriteRefused} if refused else set(), instance.save)
        if not refused:
            assert saved == 1
            self.jobs[job_id].status, self.jobs[job_id].lease = status, now

    @rule(data=st.data(), how=st.sampled_from(["delete_instance", "delete_by_id", "delete().where"]))
    def delete_job(self, data: st.DataObject, how: str) -> None:
        """Delete a job through the model: its targets go with it, and the byte total follows."""
        job_id = self.some_job_id(data)
        J = dcache.BatchJob
        if how == "delete_instance" and job_id in self.jobs:
            deleted = J.get_by_id(job_id).delete_instance()
        elif how == "delete().where":
            deleted = J.delete().where(J.id == job_id).execute()
        else:
            deleted = J.delete_by_id(job_id)  # type: ignore[no-untyped-call]
        assert deleted == (1 if job_id in self.jobs else 0)
        event(f"model delete: {deleted}")
        self.jobs.pop(job_id, None)

    @rule(data=st.data(), status=st.sampled_from(JOB_STATUSES), error=texts, now=times)
    def set_status(self, data: st.DataObject, status: str, error: str, now: int) -> None:
        job_id = self.some_job_id(data)
        job = self.jobs.get(job_id)
        allowed: set[type[Exception]] = set() if job else {dcache.JobNotFound}
        self.call(allowed, dcache.set_batch_job_status, job_id, status, error, now=now)
        if job is not None:
            job.status, job.error, job.lease = status, error, now

    @rule(data=st.data(), now=times)
    def touch(self, data: st.DataObject, now: int) -> None:
        job_id = self.some_job_id(data)
        job = self.jobs.get(job_id)
        allowed: set[type[Exception]] = set() if job else {dcache.JobNotFound}
        self.call(allowed, dcache.touch_batch_job, job_id, now=now)
        if job is not None:
            job.lease = now

    @rule(reason=texts, now=times)
    def mark_in_flight_failed(self, reason: str, now: int) -> None:
        live = [job for job in self.jobs.values() if job.status in LIVE]
        assert dcache.mark_in_flight_failed(reason, now=now) == len(live)
        for job in live:
            job.status, job.error, job.lease = "failed", reason, now

    @rule(  # the first choices come first: claims that span jobs, and caps a job reaches
        limit=st.sampled_from([2 * MAX_TOTAL, 3, 1, 2, 5]),
        per_job=st.sampled_from([1, None, 2, 3]),
        per_host=st.sampled_from([None, 1, 2]),
        order=st.sampled_from(["fair", "weighted", "weighted the other way", "oldest first"]),
        now=times,
        runner=st.sampled_from(RUNNERS),
    )
    def claim(
        self, limit: int, per_job: int | None, per_host: int | None, order: str, now: int, runner: str
    ) -> None:
        weights = CLAIM_WEIGHTS[order]
        model = ModelClaim(self, limit, per_job, per_host, weights, now)
        expected = model.run(order != "oldest first")
        for job_id, idx in expected:
            job = self.jobs[job_id]
            target = job.targets[idx]
            target.status, target.runner, target.heartbeat = "running", runner, now
            target.attempts += 1
            job.status, job.lease = "running", now
        claimed = dcache.claim_batch_targets(
            limit,
            per_job=per_job,
            per_host=per_host,
            weights=weights,
            fair=order != "oldest first",
            runner=runner,
            now=now,
        )
        assert [(t.job_id, t.idx) for t in claimed] == expected
        assert all(t.status == "running" and (t.runner, t.heartbeat) == (runner, now) for t in claimed)
        paced = set(model.paced)
        for host in paced:
            interval = host_setting(self.policies, host, 1) or 0
            self.next_due[host] = now * 1000 + interval + round(PACING_SLACK * 1000)
        send_by = (now * 1000 + round(SEND_WINDOW * 1000)) / 1000
        assert [t.send_by for t in claimed] == [
            send_by if dcache.url_host(t.url) in paced else None for t in claimed
        ]
        event(f"claim: {len(paced)} paced hosts")
        event(f"claim: {min(len(claimed), 3)}+ targets")
        event(f"claim: {order}, from {len({self.jobs[t.job_id].caller for t in claimed})} callers")

    @rule(data=st.data(), now=times)
    def pause_job(self, data: st.DataObject, now: int) -> None:
        job_id = self.some_job_id(data)
        if job_id not in self.jobs:
            self.call({dcache.JobNotFound}, dcache.pause_batch_job, job_id, now=now)
            return
        expected = self.jobs[job_id].status in LIVE and job_id not in self.paused_jobs
        assert dcache.pause_batch_job(job_id, now=now) == expected
        if expected:
            self.paused_jobs.add(job_id)
        event(f"pause_batch_job: {expected}")

    @rule(data=st.data())
    def resume_job(self, data: st.DataObject) -> None:
        job_id = self.some_job_id(data)
        if job_id not in self.jobs:
            self.call({dcache.JobNotFound}, dcache.resume_batch_job, job_id)
            return
        assert dcache.resume_batch_job(job_id) == (job_id in self.paused_jobs)
        self.paused_jobs.discard(job_id)

    @rule(caller=st.sampled_from(CALLERS), pause=st.booleans(), now=times)
    def pause_or_resume_caller(self, caller: str, pause: bool, now: int) -> None:
        if pause:
            assert dcache.pause_caller(caller, now=now) == (caller not in self.paused_callers)
            self.paused_callers.add(caller)
        else:
            assert dcache.resume_caller(caller) == (caller in self.paused_callers)
            self.paused_callers.discard(caller)

    @rule(
        host=st.sampled_from(["h0.example", "H1.Example"]),
        until=st.integers(min_value=0, max_value=100).map(lambda q: q / 4),
        now=times,
    )
    def back_off(self, host: str, until: float, now: int) -> None:
        name = dcache.url_host(f"//{host}")
        end = min(math.ceil(until * 1000), now * 1000 + MAX_BACK_OFF * 1000)
        self.backed_off[name] = max(self.backed_off.get(name, 0), end)
        assert dcache.back_off_host(host, until, now=now) == self.backed_off[name] / 1000

    @rule(
        host=st.sampled_from(["*", "h0.example", "H1.Example"]),
        max_running=st.sampled_from([None, 1, 2]),
        min_interval=st.sampled_from([None, 0, 0.5, 2, 5]),
    )
    def set_policy(self, host: str, max_running: int | None, min_interval: float | None) -> None:
        name = host if host == "*" else dcache.url_host(f"//{host}")
        interval = None if min_interval is None else round(min_interval * 1000)
        self.policies[name] = (max_running, interval)
        policy = dcache.set_host_policy(host, max_running=max_running, min_interval=min_interval)
        assert (policy.host, policy.max_running, policy.min_interval) == (name, max_running, min_interval)

    def held(self, runner: str | None = None) -> list[MTarget]:
        return [
            t
            for job in self.jobs.values()
            for t in job.targets.values()
            if t.status == "running" and (runner is None or t.runner == runner)
        ]

    @rule(runner=st.sampled_from(RUNNERS), now=times)
    def renew(self, runner: str, now: int) -> None:
        held = self.held(runner)
        assert dcache.renew_claims(runner, now=now) == len(held)
        for target in held:
            target.heartbeat = now

    @rule(runner=st.sampled_from(RUNNERS))
    def release(self, runner: str) -> None:
        held = self.held(runner)
        assert dcache.release_claims(runner) == len(held)
        for target in held:
            target.status, target.runner, target.heartbeat = "pending", None, None
            target.attempts -= 1

    @rule(data=st.data(), now=times)
    def finish(self, data: st.DataObject, now: int) -> None:
        job_id = self.some_job_id(data)
        job = self.jobs.get(job_id)
        expected = None
        if job is not None and job.status in LIVE and job.targets_done >= job.targets_total:
            failed = sum(1 for t in job.targets.values() if t.status == "failed")
            expected = "done" if failed == 0 else "failed" if failed >= job.targets_total else "partial"
        allowed: set[type[Exception]] = set() if job else {dcache.JobNotFound}
        out = self.call(allowed, dcache.finish_batch_job, job_id, now=now)
        if job is not None:
            assert out == expected
            event(f"finish: {expected}")
        if job is not None and expected is not None:
            job.status, job.lease = expected, now

    @rule(stale_after=ttls, max_attempts=st.sampled_from([1, 2, 3]), reason=texts, now=times)
    def requeue(self, stale_after: Any, max_attempts: int, reason: str, now: int) -> None:
        moved = 0
        for job in self.jobs.values():
            failed = 0
            for target in job.targets.values():
                if target.status != "running" or (target.heartbeat or 0) + ttl_seconds(stale_after) > now:
                    continue
                moved += 1
                if target.attempts >= max_attempts:
                    target.status, target.error = "failed", reason
                    failed += 1
                else:
                    target.status, target.runner, target.heartbeat = "pending", None, None
            if failed:
                job.lease = now
                if job.status in LIVE and job.targets_done >= job.targets_total:
                    count = sum(1 for t in job.targets.values() if t.status == "failed")
                    job.status = (
                        "done" if count == 0 else "failed" if count >= job.targets_total else "partial"
                    )
        assert (
            dcache.requeue_stale_claims(stale_after, max_attempts=max_attempts, reason=reason, now=now)
            == moved
        )
        event(f"requeue: {min(moved, 2)}+ targets")

    @rule(data=st.data(), stale_after=ttls, reason=texts, now=times)
    def rescue(self, data: st.DataObject, stale_after: Any, reason: str, now: int) -> None:
        live = {i: job for i, job in self.jobs.items() if job.status in LIVE}
        near_live = data.draw(st.booleans())
        if live and near_live:  # around the end of a live job's lease
            job = live[data.draw(st.sampled_from(sorted(live)))]
            seconds = math.floor(ttl_seconds(stale_after))
            now = max(0, job.lease + seconds + data.draw(st.integers(min_value=-1, max_value=1)))
        stale = [job for job in live.values() if job.lease + ttl_seconds(stale_after) <= now]
        assert dcache.rescue_stale_jobs(stale_after, reason, now=now) == len(stale)
        event(f"rescue: {min(len(stale), 2)}+ jobs")
        for job in stale:
            job.status, job.error, job.lease = "failed", reason, now

    @rule(data=st.data(), ttl=ttls, now=times)
    def sweep(self, data: st.DataObject, ttl: Any, now: int) -> None:
        near_stored = data.draw(st.booleans())
        if self.jobs and near_stored:  # around the end of a stored job's lease
            job = self.jobs[data.draw(st.sampled_from(sorted(self.jobs)))]
            now = max(
                0,
                job.lease + math.floor(ttl_seconds(ttl)) + data.draw(st.integers(min_value=-1, max_value=1)),
            )
        due = {i for i, job in self.jobs.items() if job.lease + ttl_seconds(ttl) <= now}
        assert dcache.sweep_batch(ttl, now=now) == len(due)
        event(f"sweep: {min(len(due), 2)}+ jobs")
        for job_id in due:
            del self.jobs[job_id]
        assert self.stored_ids() == set(self.jobs)

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        live = {i for i, job in self.jobs.items() if job.status in LIVE}
        total = sum(job.nbytes for job in self.jobs.values())
        candidates = sorted(
            (i for i, job in self.jobs.items() if job.status in FINISHED and job.nbytes > 0),
            key=lambda i: (self.jobs[i].lease, self.jobs[i].created_at, i),
        )
        # Mostly a budget that the model says takes exactly the first k candidates (0 < k < all, so the
        # order shows), else any small budget.
        k = data.draw(st.integers(min_value=1, max_value=max(len(candidates) - 1, 1)))
        exact = total - sum(self.jobs[i].nbytes for i in candidates[:k])
        max_bytes = data.draw(st.just(max(exact, 0)) | st.integers(min_value=0, max_value=30))
        evicted = 0
        for job_id in candidates:
            if total <= max_bytes:
                break
            total -= self.jobs.pop(job_id).nbytes
            evicted += 1
        assert dcache.evict_batch_oldest(max_bytes) == evicted
        event(
            f"evict: {min(evicted, 2)}+ jobs" + (", live jobs kept over budget" if total > max_bytes else "")
        )
        stored = self.stored_ids()
        assert live <= stored, "an active job was evicted"
        assert stored == set(self.jobs)

    # -- Reads (they must agree with the model, and change nothing: the invariants would see it) ---------

    @rule(data=st.data(), caller=st.sampled_from(CALLERS), key=st.sampled_from(KEYS), ttl=ttls, now=times)
    def idem(self, data: st.DataObject, caller: str, key: str, ttl: Any, now: int) -> None:
        ask_stored = data.draw(st.booleans())
        if self.jobs and ask_stored:  # ask about a stored job, around the end of its lease
            job = self.jobs[data.draw(st.sampled_from(sorted(self.jobs)))]
            caller, key = job.caller, job.idem_key
            now = max(
                0,
                job.lease + math.floor(ttl_seconds(ttl)) + data.draw(st.integers(min_value=-1, max_value=1)),
            )
        answer = self.idem_answer(caller, key, ttl, now)
        assert dcache.batch_job_by_idem(caller, key, ttl, now=now) == answer
        event(f"idem: {'hit' if answer else 'miss'}")

    @rule(job_id=st.sampled_from(JOB_IDS))
    def read(self, job_id: str) -> None:
        assert (dcache.batch_job(job_id) is None) == (job_id not in self.jobs)
        assert (dcache.batch_targets(job_id) is None) == (job_id not in self.jobs)

    # -- The model's answers -------------------------------------------------------------------------------

    def idem_answer(self, caller: str, key: str, ttl: Any, now: int) -> str | None:
        if not key:
            return None
        matches = [
            (job.created_at, job.seq, job_id)
            for job_id, job in self.jobs.items()
            if job.caller == caller
            and job.idem_key == key
            and job.status in IDEM
            and job.lease + ttl_seconds(ttl) > now
        ]
        return max(matches)[2] if matches else None

    def stored_ids(self) -> set[str]:
        return {row[0] for row in dcache.db.execute_sql("SELECT id FROM batch_job").fetchall()}

    # -- After every step ---------------------------------------------------------------------------------

    @invariant()
    def pauses_match_the_model(self) -> None:
        live = {job_id for job_id, job in self.jobs.items() if job.status in LIVE}
        assert dcache.paused_jobs() == sorted(self.paused_jobs & live)
        assert dcache.paused_callers() == sorted(self.paused_callers)

    @invariant()
    def host_rows_match_the_model(self) -> None:
        hosts = set(self.policies) | set(self.backed_off) | set(self.next_due)
        in_order = sorted(hosts, key=lambda h: (h != "*", h.encode()))  # as host_policies() lists them
        want = [
            dcache.HostPolicy(
                host=host,
                max_running=self.policies.get(host, (None, None))[0],
                min_interval=None if (ms := self.policies.get(host, (None, None))[1]) is None else ms / 1000,
                # a time of 0 (a back-off to the epoch) reads as none
                next_due=self.next_due[host] / 1000 if self.next_due.get(host) else None,
                backed_off_until=self.backed_off[host] / 1000 if self.backed_off.get(host) else None,
            )
            for host in in_order
        ]
        assert dcache.host_policies() == want

    @invariant()
    def jobs_and_targets_match_the_model(self) -> None:
        assert self.stored_ids() == set(self.jobs)
        for job_id, model in self.jobs.items():
            job = dcache.batch_job(job_id)
            targets = dcache.batch_targets(job_id)
            assert job is not None and targets is not None
            got = (job.caller, job.caller_class, job.idem_key, job.status, job.error, job.targets_total)
            want = (
                model.caller,
                model.caller_class,
                model.idem_key,
                model.status,
                model.error,
                model.targets_total,
            )
            assert got == want, job_id
            assert (job.created_at, job.lease) == (model.created_at, model.lease), job_id
            assert (job.targets_done, job.nbytes) == (model.targets_done, model.nbytes), job_id
            got_targets = [
                (
                    t.job_id,
                    t.idx,
                    t.url,
                    t.options,
                    t.status,
                    t.result,
                    t.error,
                    t.hint,
                    t.runner,
                    t.heartbeat,
                    t.attempts,
                )
                for t in targets
            ]
            want_targets = [
                (
                    job_id,
                    i,
                    t.url,
                    t.options,
                    t.status,
                    t.result,
                    t.error,
                    t.hint,
                    t.runner,
                    t.heartbeat,
                    t.attempts,
                )
                for i, t in sorted(model.targets.items())
            ]
            assert got_targets == want_targets, job_id
            # Rule 4 from the stored rows alone: the counters agree with the job's targets.
            assert job.targets_done == sum(1 for t in targets if t.status in FINAL), job_id
            assert job.nbytes == sum(utf8(t.result) for t in targets), job_id

    @invariant()
    def totals_match(self) -> None:
        total = sum(job.nbytes for job in self.jobs.values())
        assert dcache.batch_nbytes() == total
        column = dcache.db.execute_sql("SELECT COALESCE(SUM(nbytes), 0) FROM batch_job").fetchone()[0]
        assert column == total
        for caller in CALLERS:
            live = sum(1 for job in self.jobs.values() if job.caller == caller and job.status in LIVE)
            assert dcache.live_batch_jobs(caller) == live
        assert dcache.live_batch_jobs_total() == sum(1 for job in self.jobs.values() if job.status in LIVE)

    @invariant()
    def idempotency_answers_match(self) -> None:
        for caller in CALLERS:
            for key in KEYS[1:]:
                for ttl, now in ((timedelta(milliseconds=2_500), 10), (5, 15)):
                    answer = dcache.batch_job_by_idem(caller, key, ttl, now=now)
                    assert answer == self.idem_answer(caller, key, ttl, now), (caller, key, ttl, now)


class FileStoreMachine(StoreMachine):
    """The same machine on a real WAL file, reopened now and then."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sift-machine-"))
        self.reopened = 0
        super().__init__()

    def path(self) -> str | Path:
        return self.dir / "store.db"

    def teardown(self) -> None:
        super().teardown()
        shutil.rmtree(self.dir, ignore_errors=True)

    @precondition(lambda self: self.reopened < 2)
    @rule()
    def reopen(self) -> None:
        """Reopen the file (a restart): everything is still there, the running total included."""
        self.reopened += 1
        dcache.open_db(self.path())


class PostgresStoreMachine(StoreMachine):
    """The same machine on PostgreSQL, in a schema of this process's own, emptied for each run."""

    def path(self) -> str | Path:
        return postgres_target(f"sift_test_machine_{SUFFIX}")

    def __init__(self) -> None:
        super().__init__()
        dcache.db.execute_sql(
            "TRUNCATE batch_job, batch_target, batch_host_policy, batch_paused_job, batch_paused_caller"
        )
        dcache.db.execute_sql("UPDATE batch_claim_ring SET caller = NULL, turns = 0")
        dcache.db.execute_sql("UPDATE batch_totals SET nbytes = 0 WHERE nbytes <> 0")


@pytest.fixture(scope="module", autouse=True)
def _drop_machine_schema() -> Iterator[None]:
    yield
    if not postgres_missing():
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "sift_test_machine_{SUFFIX}" CASCADE')


# Runs of up to 30 steps; the number of runs is the profile's (HYPOTHESIS_PROFILE=deep: 2000 each).
StoreMachine.TestCase.settings = settings(stateful_step_count=30)
FileStoreMachine.TestCase.settings = settings(stateful_step_count=30)
PostgresStoreMachine.TestCase.settings = settings(stateful_step_count=30)
TestStoreMachine = pytest.mark.slow(StoreMachine.TestCase)
TestFileStoreMachine = pytest.mark.slow(FileStoreMachine.TestCase)
TestPostgresStoreMachine = pytest.mark.slow(
    pytest.mark.postgres(
        pytest.mark.skipif(bool(postgres_missing()), reason=postgres_missing() or "")(
            PostgresStoreMachine.TestCase
        )
    )
)


def test_ttl_seconds_is_exact() -> None:
    assert ttl_seconds(timedelta(milliseconds=2_500)) == Fraction(5, 2)
    assert ttl_seconds(0.25) == Fraction(1, 4)
    assert ttl_seconds(7) == 7
    assert math.isclose(float(ttl_seconds(timedelta(days=1))), 86_400)
