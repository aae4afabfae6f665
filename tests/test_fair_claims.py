"""The claim's order: a ring of callers taking weighted turns, a cursor that carries a round over from one
claim to the next, and a per-host limit on running targets; on every backend."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest
from helpers import count_round_trips, count_statements, make_job, make_targets, refuse_each, snapshot
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from sift import dcache
from sift.dcache import db


def keys(targets: list[dcache.BatchTarget]) -> list[tuple[str, int]]:
    return [(t.job_id, t.idx) for t in targets]


def callers(targets: list[dcache.BatchTarget]) -> list[str]:
    return [t.job_id.split("/")[0] for t in targets]


def add_job(caller: str, name: str, count: int, *, created_at: int, cls: str = "fleet", **fields: Any) -> str:
    """A job ``caller/name`` of ``count`` targets; ``fields`` go to each target (url=... for its host)."""
    job_id = f"{caller}/{name}"
    dcache.create_batch_job(
        make_job(job_id, caller=caller, caller_class=cls, targets_total=count, created_at=created_at),
        make_targets(count, **fields),
    )
    return job_id


def add_hosted_job(caller: str, name: str, hosts: list[str], *, created_at: int, cls: str = "fleet") -> str:
    """A job whose target ``i`` is on ``hosts[i]``."""
    job_id = f"{caller}/{name}"
    targets = [dcache.BatchTarget(idx=i, url=f"https://{h}/{i}", options="{}") for i, h in enumerate(hosts)]
    dcache.create_batch_job(
        make_job(job_id, caller=caller, caller_class=cls, targets_total=len(hosts), created_at=created_at),
        targets,
    )
    return job_id


@pytest.mark.slow
def test_a_later_caller_is_not_starved_behind_a_flood(store: Any) -> None:
    """The flood: one caller's 200 jobs of 500 targets, then another caller's job of 5; the next claim of 10
    hands the second caller at least one target."""
    with db.atomic():
        for n in range(200):
            job = make_job(f"flood/{n}", caller="flood", targets_total=500, created_at=1 + n)
            dcache.create_batch_job(job, make_targets(500))
    add_job("small", "only", 5, created_at=10_000)
    got = dcache.claim_batch_targets(10, now=20_000)
    assert len(got) == 10
    assert "small" in callers(got)
    assert Counter(callers(got)) == {"flood": 5, "small": 5}


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [(7, 13), (1,), (400,), (3, 50, 11)])
def test_weights_split_the_claims_three_to_one(store: Any, sizes: tuple[int, ...]) -> None:
    """Weights 3:1 by caller class: 400 targets claimed in claims of various sizes split 300:100, within
    one round's turns at every point, while both callers have work."""
    for n in range(4):
        add_job("fleet-caller", f"j{n}", 150, created_at=1 + n, cls="fleet")
        add_job("restricted-caller", f"j{n}", 150, created_at=1 + n, cls="restricted")
    weights = {"fleet": 3, "restricted": 1}
    seen: Counter[str] = Counter()
    step = 0
    while sum(seen.values()) < 400:
        size = min(sizes[step % len(sizes)], 400 - sum(seen.values()))
        step += 1
        got = dcache.claim_batch_targets(size, weights=weights, now=10)
        assert len(got) == size
        seen.update(callers(got))
        total = sum(seen.values())
        # after any prefix of the turn-by-turn order, each caller is at most one turn off its share
        assert abs(seen["fleet-caller"] - 3 * total / 4) <= 3
        assert abs(seen["restricted-caller"] - total / 4) <= 1
    assert seen == {"fleet-caller": 300, "restricted-caller": 100}


def test_the_exact_order_of_a_small_case(store: Any) -> None:
    """Three callers: a (fleet, weight 2, two jobs), b and c (restricted, a class not named: weight 1);
    per_job=3. The ring starts at the first caller in byte order and carries over from claim to claim."""
    add_job("a", "old", 4, created_at=5, cls="fleet")
    add_job("a", "new", 2, created_at=6, cls="fleet")
    add_job("b", "x", 3, created_at=1, cls="restricted")
    add_job("c", "y", 2, created_at=3, cls="restricted")
    weights = {"fleet": 2}
    first = dcache.claim_batch_targets(4, per_job=3, weights=weights, now=10)
    assert keys(first) == [("a/old", 0), ("a/old", 1), ("b/x", 0), ("c/y", 0)]
    # c's turn was used up: a round from a (per_job counts within one claim), b, c; then a's next turn:
    # a/old has nothing left, so its next job
    second = dcache.claim_batch_targets(5, per_job=3, weights=weights, now=11)
    assert keys(second) == [("a/old", 2), ("a/old", 3), ("b/x", 1), ("c/y", 1), ("a/new", 0)]
    # a's turn goes on (1 of 2 used), then b; c has nothing left and leaves the ring
    third = dcache.claim_batch_targets(10, per_job=3, weights=weights, now=12)
    assert keys(third) == [("a/new", 1), ("b/x", 2)]
    assert dcache.claim_batch_targets(10, weights=weights, now=13) == []


def test_a_caller_mid_turn_keeps_its_turn_in_the_next_claim(store: Any) -> None:
    add_job("a", "j", 10, created_at=1, cls="fleet")
    add_job("b", "j", 10, created_at=1, cls="restricted")
    weights = {"fleet": 3}
    assert callers(dcache.claim_batch_targets(2, weights=weights, now=1)) == ["a", "a"]
    assert callers(dcache.claim_batch_targets(3, weights=weights, now=1)) == ["a", "b", "a"]
    assert callers(dcache.claim_batch_targets(4, weights=weights, now=1)) == ["a", "a", "b", "a"]


def test_fair_false_keeps_the_oldest_job_first_across_callers(store: Any) -> None:
    add_job("a", "late", 2, created_at=30)
    add_job("b", "early", 3, created_at=10)
    add_job("c", "middle", 2, created_at=20)
    got = dcache.claim_batch_targets(10, fair=False, now=40)
    early, middle, late = (
        [("b/early", i) for i in range(3)],
        [("c/middle", 0), ("c/middle", 1)],
        [("a/late", 0), ("a/late", 1)],
    )
    assert keys(got) == early + middle + late


def test_a_host_at_its_limit_is_skipped_and_other_work_flows(store: Any) -> None:
    add_hosted_job("a", "hot", ["hot.example"] * 6 + ["b.example", "a.example"], created_at=1)
    add_hosted_job("b", "mixed", ["hot.example", "c.example", "c.example"], created_at=2)
    got = dcache.claim_batch_targets(20, per_host=2, now=5)
    hosts = Counter(t.url.split("/")[2] for t in got)
    assert hosts == {"hot.example": 2, "a.example": 1, "b.example": 1, "c.example": 2}
    # within a job, host by host in byte order, lowest idx first within a host
    # turn by turn: a's a.example, b's c.example, a's b.example, b's c.example, a's hot.example, b's
    # hot.example (now full); then a's job has only hot.example left, at its limit
    assert keys(got) == [
        ("a/hot", 7),
        ("b/mixed", 1),
        ("a/hot", 6),
        ("b/mixed", 2),
        ("a/hot", 0),
        ("b/mixed", 0),
    ]
    assert dcache.claim_batch_targets(20, per_host=2, now=6) == []  # every host left is at its limit
    dcache.update_batch_target("a/hot", 0, "done", result="ok", now=7)
    again = dcache.claim_batch_targets(20, per_host=2, now=8)
    assert keys(again) == [("a/hot", 1)]


@pytest.mark.parametrize("fair", [True, False])
@pytest.mark.parametrize("per_host", [None, 10])
def test_within_a_job_targets_go_host_by_host_then_by_idx(
    store: Any, fair: bool, per_host: int | None
) -> None:
    """With or without a host limit, fair or oldest first: a job's targets host by host (byte order: "B"
    sorts before "a" in a URL, but url_host lower-cases it), lowest idx first within a host."""
    hosts = ["b.example", "a.example", "B.example", "c.example", "a.example", "b.example"]
    add_hosted_job("a", "j", hosts, created_at=1)
    got = dcache.claim_batch_targets(4, per_host=per_host, fair=fair, now=5)
    assert keys(got) == [("a/j", 1), ("a/j", 4), ("a/j", 0), ("a/j", 2)]
    again = dcache.claim_batch_targets(4, per_host=per_host, fair=fair, now=6)
    assert keys(again) == [("a/j", 5), ("a/j", 3)]


def test_per_host_counts_targets_running_from_earlier_claims(store: Any) -> None:
    add_hosted_job("a", "j", ["h.example"] * 5, created_at=1)
    assert len(dcache.claim_batch_targets(1, now=1)) == 1  # no limit: one running on h.example
    assert keys(dcache.claim_batch_targets(5, per_host=3, now=2)) == [("a/j", 1), ("a/j", 2)]


BAD_CLAIM_ARGUMENTS: list[tuple[dict[str, Any], str]] = [
    ({"weights": {"fleet": 0}}, "weights"),
    ({"weights": {"fleet": 1.5}}, "weights"),
    ({"weights": {"fleet": True}}, "weights"),
    ({"weights": {1: 2}}, "weights"),
    ({"weights": [("fleet", 2)]}, "weights"),
    ({"weights": {f"c{i}": 1 for i in range(1001)}}, "weights"),
    ({"weights": {"fleet": 2}, "fair": False}, "weights"),
    ({"per_host": 0}, "per_host"),
    ({"per_host": -1}, "per_host"),
    ({"per_host": "2"}, "per_host"),
    ({"fair": 1}, "fair"),
]


def test_bad_weights_and_per_host_name_the_field_and_change_nothing(store: Any) -> None:
    add_job("a", "j", 3, created_at=1)
    refuse_each(
        (repr(kwargs), functools.partial(dcache.claim_batch_targets, 2, now=5, **kwargs), field)
        for kwargs, field in BAD_CLAIM_ARGUMENTS
    )


def test_every_insert_records_the_targets_host(store: Any) -> None:
    urls = ["https://User@Example.COM.:8443/x", "mailto:someone", "http://[::1]:80/"]
    targets = [dcache.BatchTarget(idx=i, url=u, options="{}") for i, u in enumerate(urls)]
    dcache.create_batch_job(make_job("j", targets_total=3), targets)
    rows = db.execute_sql("SELECT idx, host FROM batch_target ORDER BY idx").fetchall()
    assert [tuple(r) for r in rows] == [(0, "example.com"), (1, ""), (2, "::1")]


def test_check_store_reports_a_host_that_is_not_the_urls(store: Any) -> None:
    add_hosted_job("a", "j", ["a.example", "b.example", "c.example"], created_at=1)
    assert dcache.check_store().ok
    # as another program would write it: the column's default, and a host of another URL
    db.execute_sql("UPDATE batch_target SET host = '' WHERE idx = 1")
    db.execute_sql("UPDATE batch_target SET host = 'x.example' WHERE idx = 2")
    report = dcache.check_store()
    assert [(v.kind, v.job_id) for v in report.violations] == [("target_host", "a/j")]
    assert "2 targets whose host is not its URL's (idx 1: '', not 'b.example')" in report.violations[0].detail


def test_check_store_leaves_a_finished_targets_host_alone(store: Any) -> None:
    """Only claims read a host (of pending and running targets): a finished target's is not checked."""
    add_hosted_job("a", "j", ["a.example", "b.example", "c.example"], created_at=1)
    dcache.update_batch_target("a/j", 0, "done", result="r")
    dcache.claim_batch_targets(1, runner="r1")  # target 1 running, target 2 pending
    db.execute_sql("UPDATE batch_target SET host = 'x.example'")
    report = dcache.check_store()
    assert [(v.kind, v.job_id) for v in report.violations] == [("target_host", "a/j")]
    assert "2 targets whose host is not its URL's (idx 1: 'x.example', not 'b.example')" in (
        report.violations[0].detail
    )


# -- The per-host limit from 8 runner processes at once, watched by a reader ---------------------------------

HOSTS = [f"h{n}.example" for n in range(6)]
PER_HOST = 2
RUNNING_BY_HOST = "SELECT host, COUNT(*) FROM batch_target WHERE status = 'running' GROUP BY host"
UNFINISHED = "SELECT COUNT(*) FROM batch_target WHERE status IN ('pending', 'running')"


def _busiest(db_: Any) -> int:
    return max((row[1] for row in db_.execute_sql(RUNNING_BY_HOST).fetchall()), default=0)


def _polite_runner(target: str, name: str, barrier: Any) -> dict[str, Any]:
    """Claim with the host limit, check the store right after each claim, write each result; until every
    target is done."""
    import time

    dcache.open_db(target)
    done = {"written": 0, "claims": 0, "busiest": 0, "empty": 0}
    barrier.wait()
    while True:
        claimed = dcache.claim_batch_targets(3, per_host=PER_HOST, weights={"fleet": 2}, runner=name)
        done["claims"] += 1
        done["busiest"] = max(done["busiest"], _busiest(db))
        if not claimed:
            if db.execute_sql(UNFINISHED).fetchone()[0] == 0:
                break
            done["empty"] += 1
            time.sleep(0.005)  # every host with pending work is at its limit: the others' results free it
            continue
        for t in claimed:
            dcache.update_batch_target(t.job_id, t.idx, "done", result=name, runner=name)
            done["written"] += 1
    dcache.close_db()
    return done


def _reader(target: str, barrier: Any) -> dict[str, Any]:
    """Poll the running targets by host until nothing is left to do; report the most seen on one host."""
    dcache.open_db(target, readonly=True)
    seen = {"busiest": 0, "polls": 0}
    barrier.wait()
    while True:
        seen["busiest"] = max(seen["busiest"], _busiest(db))
        seen["polls"] += 1
        if db.execute_sql(UNFINISHED).fetchone()[0] == 0:
            break
    dcache.close_db()
    return seen


def _polite_worker(kind: str, *args: Any) -> dict[str, Any]:
    return _polite_runner(*args) if kind == "runner" else _reader(*args)


@pytest.mark.slow
def test_per_host_holds_with_8_runner_processes_claiming_at_once(shared_store: str) -> None:
    from helpers import run_processes

    for c in range(3):
        for j in range(2):
            hosts = [HOSTS[(c + j + i) % len(HOSTS)] if i % 3 else HOSTS[0] for i in range(30)]
            add_hosted_job(f"caller-{c}", f"j{j}", hosts, created_at=j, cls="fleet" if c else "restricted")
    args: list[tuple[Any, ...]] = [("runner", shared_store, f"runner-{r}") for r in range(8)]
    args.append(("reader", shared_store))
    reports = run_processes(_polite_worker, args)
    assert not [r for r in reports if "errors" in r], reports
    runners = [r for r in reports if "written" in r]
    assert sum(r["written"] for r in runners) == 180  # every target done, each once
    assert max(r["busiest"] for r in reports) == PER_HOST, reports  # reached, never passed
    assert next(r["polls"] for r in reports if "polls" in r) > 0
    assert db.execute_sql("SELECT COUNT(*) FROM batch_target WHERE status <> 'done'").fetchone()[0] == 0
    assert dcache.check_store().ok


# -- The claim's cost: statements by targets handed out and callers served, not by pending targets -------


#: Every claim starts with the ring's row, the move of the delayed targets come due, and whether any host
#: has a policy row (none here): 3 statements.
#: 1 caller: then the first caller with its job, a turn's take, the walk round the ring (next: none, first:
#: known), the other 9 as rounds in one take, the jobs claimed from, the cursor: 3 + 1 + 1 + 2 + 1 + 1 + 1.
#: 5 callers: 3 + 1 + 1, then for each other caller the next caller with its job and a take: 4 x 2, the
#: walk round, one round of 5 takes, the jobs, the cursor: 5 + 8 + 2 + 5 + 1 + 1. 50 callers, a claim of
#: 50: 3 + 50 x 2 (the first caller, then each next one, with its job, and a take), the jobs, the cursor;
#: the claim is full, so the walk looks for no member after the last.
#: On PostgreSQL the same walk runs inside the claim's server function: three round trips (BEGIN, the call,
#: COMMIT), and its own cost stays flat (test_claim_round_trips.py, by its buffers).
@pytest.mark.slow
@pytest.mark.parametrize(("callers_", "limit", "expected"), [(1, 10, 10), (5, 10, 22), (50, 50, 105)])
def test_a_claims_statements_do_not_grow_with_pending_targets(
    store: Any, monkeypatch: pytest.MonkeyPatch, callers_: int, limit: int, expected: int
) -> None:
    """A claim: the ring's row, the walk to each caller with its job, one take per turn, whole rounds in one
    take once the ring is known, the jobs taken from in one statement, the cursor. The same with 1,000 or
    100,000 pending targets."""
    on_postgres = store.backend.statement_key == "postgres"
    counts = []
    for pending in (1_000, 100_000):
        db.execute_sql("DELETE FROM batch_target")
        db.execute_sql("DELETE FROM batch_job")
        with db.atomic():
            for c in range(callers_):
                add_job(f"c{c}", "j", pending // callers_, created_at=1)
        db.execute_sql("UPDATE batch_claim_ring SET caller = NULL, turns = 0")
        seen = count_round_trips(monkeypatch) if on_postgres else count_statements(monkeypatch)
        assert len(dcache.claim_batch_targets(limit, now=5)) == limit
        counts.append(len(seen))
        monkeypatch.undo()
    assert counts == ([3, 3] if on_postgres else [expected, expected])


def test_a_claim_marks_each_job_it_took_from_once(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Turns in several jobs of two callers, a job taken from in two turns: one statement at the claim's end
    makes each job it took from running with the claim's lease, and leaves the others alone."""
    for caller in ("a", "b"):
        for n in range(3):
            add_job(caller, f"j{n}", 2, created_at=n)
    on_postgres = store.backend.statement_key == "postgres"
    seen = count_statements(monkeypatch)
    with db.atomic():  # PostgreSQL: the rows this transaction updated, the claim's savepoint's included
        got = dcache.claim_batch_targets(7, per_job=2, weights={"fleet": 3}, now=5)
        updated = (
            db.execute_sql(
                "SELECT n_tup_upd FROM pg_stat_xact_user_tables "
                "WHERE relname = 'batch_job' AND schemaname = current_schema()"
            ).fetchone()[0]
            if on_postgres
            else None
        )
    monkeypatch.undo()
    assert keys(got) == [
        ("a/j0", 0),
        ("a/j0", 1),
        ("a/j1", 0),
        ("b/j0", 0),
        ("b/j0", 1),
        ("b/j1", 0),
        ("a/j1", 1),
    ]
    jobs = {j.id: (j.status, j.lease) for j in dcache.BatchJob.select()}
    touched = {"a/j0", "a/j1", "b/j0", "b/j1"}
    assert jobs == {job: ("running", 5) if job in touched else ("queued", 1_000) for job in jobs}
    if on_postgres:  # inside the claim's server function: each job it took from updated once, not per turn
        assert updated == len(touched)
    else:
        assert sum(sql.startswith('UPDATE "batch_job"') for sql in seen) == 1


# -- A state machine of claims alone: submits, claims, results and releases against the model's ring ---------


class FairClaimMachine(RuleBasedStateMachine):
    """Claims among three callers of two classes, checked claim by claim against the state machine's model
    of the ring (tests/test_state_machine.py ``ModelClaim``), with results and releases between them."""

    def __init__(self) -> None:
        super().__init__()
        dcache.open_db(":memory:")
        self.jobs: dict[str, Any] = {}
        self.seq = 0
        self.ring: tuple[str | None, int] = (None, 0)
        # what the model reads of politeness: nothing paused, no host backed off, paced or capped
        self.paused_jobs: set[str] = set()
        self.paused_callers: set[str] = set()
        self.backed_off: dict[str, int] = {}
        self.policies: dict[str, tuple[int | None, int | None]] = {}
        self.next_due: dict[str, int] = {}

    def teardown(self) -> None:
        dcache.close_db()

    @rule(
        caller=st.sampled_from(["carol", "bob", "alice"]),
        cls=st.sampled_from(["fleet", "restricted"]),
        total=st.integers(min_value=1, max_value=6),
        created_at=st.integers(min_value=0, max_value=3),
    )
    def submit(self, caller: str, cls: str, total: int, created_at: int) -> None:
        from test_state_machine import MJob, target_for, url_for

        self.seq += 1
        job_id = f"{caller}-{self.seq}"
        dcache.create_batch_job(
            make_job(job_id, caller=caller, caller_class=cls, targets_total=total, created_at=created_at),
            [dcache.BatchTarget(idx=i, url=url_for(i), options='{"render":false}') for i in range(total)],
        )
        self.jobs[job_id] = MJob(caller, cls, "", "queued", "", total, created_at, 1_000, self.seq)
        self.jobs[job_id].targets = {i: target_for(i) for i in range(total)}

    @rule(
        limit=st.integers(min_value=1, max_value=9),
        per_job=st.sampled_from([None, 1, 2]),
        per_host=st.sampled_from([None, 1, 2, 3]),
        order=st.sampled_from(["fair", "weighted", "weighted the other way", "oldest first"]),
    )
    def claim(self, limit: int, per_job: int | None, per_host: int | None, order: str) -> None:
        from test_state_machine import CLAIM_WEIGHTS, ModelClaim

        weights = CLAIM_WEIGHTS[order]
        expected = ModelClaim(self, limit, per_job, per_host, weights, 5).run(order != "oldest first")  # type: ignore[arg-type]
        for job_id, idx in expected:
            self.jobs[job_id].targets[idx].status = "running"
            self.jobs[job_id].status = "running"
        got = dcache.claim_batch_targets(
            limit, per_job=per_job, per_host=per_host, weights=weights, fair=order != "oldest first", now=5
        )
        assert keys(got) == expected
        event(f"claim from {len({t.job_id.split('-')[0] for t in got})} callers")

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        running = sorted(
            (j, i) for j, job in self.jobs.items() for i, t in job.targets.items() if t.status == "running"
        )
        if running:
            job_id, idx = data.draw(st.sampled_from(running))
            dcache.update_batch_target(job_id, idx, "done", result="r", now=6)
            self.jobs[job_id].targets[idx].status = "done"
            job = self.jobs[job_id]
            if all(t.status == "done" for t in job.targets.values()):
                job.status = "done"

    @rule()
    def release(self) -> None:
        held = [t for job in self.jobs.values() for t in job.targets.values() if t.status == "running"]
        assert dcache.release_claims(dcache.runner_name()) == len(held)
        for t in held:
            t.status = "pending"


FairClaimMachine.TestCase.settings = settings(stateful_step_count=40, max_examples=300)
TestFairClaimMachine = pytest.mark.slow(FairClaimMachine.TestCase)


def test_a_model_write_of_a_url_moves_its_host(store: Any) -> None:
    add_hosted_job("a", "j", ["a.example", "b.example"], created_at=1)
    T = dcache.BatchTarget
    T.update(url="https://C.example:81/x").where(T.idx == 0).execute()
    stored = T.get((T.job_id == "a/j") & (T.idx == 1))
    stored.url = "https://d.example/y"
    stored.save()
    rows = db.execute_sql("SELECT idx, host FROM batch_target ORDER BY idx").fetchall()
    assert [tuple(r) for r in rows] == [(0, "c.example"), (1, "d.example")]
    before = snapshot()
    with pytest.raises(dcache.ModelWriteRefused) as caught:
        T.update(url=T.url.concat("/more")).execute()
    assert caught.value.field == "url"
    assert snapshot() == before
    assert dcache.check_store().ok
