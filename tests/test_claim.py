"""claim_batch_targets: pending targets of live jobs move to running and are handed out exactly once, the
oldest job first, at most ``per_job`` from each job; on every backend, and from 8 processes at once."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import pytest
from helpers import make_job, make_targets, refuse_each, rule_statements, run_processes, snapshot

from sift import dcache
from sift.dcache import claimorder, db

STATUSES = ["queued", "running", "done", "partial", "failed", "cancelled"]


def keys(targets: list[dcache.BatchTarget]) -> list[tuple[str, int]]:
    return [(t.job_id, t.idx) for t in targets]


def job_row(job_id: str) -> tuple[Any, ...]:
    job = dcache.batch_job(job_id)
    assert job is not None
    return (job.status, job.lease, job.targets_done, job.nbytes, job.error)


def test_oldest_job_first_then_insertion_order_then_idx(store: Any) -> None:
    # Inserted out of claim order: created_at decides, then the insertion order among equal created_at.
    dcache.create_batch_job(make_job("c-late", targets_total=2, created_at=300), make_targets(2))
    dcache.create_batch_job(make_job("b-second", targets_total=3, created_at=100), make_targets(3))
    dcache.create_batch_job(make_job("a-third", targets_total=2, created_at=100), make_targets(2))
    dcache.create_batch_job(make_job("z-first", targets_total=2, created_at=50, status="running"))
    dcache.put_batch_targets("z-first", reversed(make_targets(2)))  # stored idx 1 before idx 0
    claimed = []
    while batch := dcache.claim_batch_targets(3, now=2_000):
        assert len(batch) <= 3
        claimed += keys(batch)
    assert claimed == [
        ("z-first", 0),
        ("z-first", 1),
        ("b-second", 0),
        ("b-second", 1),
        ("b-second", 2),
        ("a-third", 0),
        ("a-third", 1),
        ("c-late", 0),
        ("c-late", 1),
    ]


def test_a_claim_spans_jobs_and_returns_whole_targets(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=2, created_at=1), make_targets(2))
    options = '{"b": 1,  "a": [1, 2]}'
    dcache.create_batch_job(
        make_job("b", targets_total=2, created_at=2),
        [dcache.BatchTarget(idx=i, url=f"https://b.example/{i}", options=options) for i in range(2)],
    )
    got = dcache.claim_batch_targets(3, now=5_000)
    assert [(t.job_id, t.idx, t.url, t.options, t.status, t.result, t.error, t.hint) for t in got] == [
        ("a", 0, "https://example.com/0", '{"render":false}', "running", None, None, None),
        ("a", 1, "https://example.com/1", '{"render":false}', "running", None, None, None),
        ("b", 0, "https://b.example/0", options, "running", None, None, None),
    ]
    assert all(isinstance(t, dcache.BatchTarget) for t in got)
    stored = dcache.batch_targets("b")
    assert stored is not None and [t.status for t in stored] == ["running", "pending"]


def test_per_job_caps_each_job_and_moves_on(store: Any) -> None:
    for n, job_id in enumerate(["a", "b", "c"]):
        dcache.create_batch_job(make_job(job_id, targets_total=5, created_at=n), make_targets(5))
    first = dcache.claim_batch_targets(7, per_job=2, now=10)
    assert keys(first) == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)]
    second = dcache.claim_batch_targets(5, per_job=2, now=11)
    assert keys(second) == [("a", 2), ("a", 3), ("b", 2), ("b", 3), ("c", 2)]
    third = dcache.claim_batch_targets(100, per_job=4, now=12)
    assert keys(third) == [("a", 4), ("b", 4), ("c", 3), ("c", 4)]


def test_without_per_job_one_huge_job_fills_the_claim(store: Any) -> None:
    dcache.create_batch_job(make_job("huge", targets_total=50, created_at=1), make_targets(50))
    dcache.create_batch_job(make_job("small", targets_total=1, created_at=2), make_targets(1))
    assert {t.job_id for t in dcache.claim_batch_targets(10, now=5)} == {"huge"}
    assert keys(dcache.claim_batch_targets(10, per_job=1, now=6)) == [("huge", 10), ("small", 0)]


def test_queued_becomes_running_and_touched_jobs_get_the_lease(store: Any) -> None:
    dcache.create_batch_job(
        make_job("q", status="queued", targets_total=2, created_at=1, lease=7), make_targets(2)
    )
    dcache.create_batch_job(
        make_job("r", status="running", targets_total=1, created_at=2, lease=8), make_targets(1)
    )
    dcache.create_batch_job(make_job("later", targets_total=1, created_at=3, lease=9), make_targets(1))
    dcache.create_batch_job(make_job("empty", status="queued", targets_total=4, created_at=0, lease=6))
    assert keys(dcache.claim_batch_targets(3, now=4_000)) == [("q", 0), ("q", 1), ("r", 0)]
    assert job_row("q") == ("running", 4_000, 0, 0, "")
    assert job_row("r") == ("running", 4_000, 0, 0, "")
    assert job_row("later") == ("queued", 9, 0, 0, "")  # not reached: untouched
    assert job_row("empty") == ("queued", 6, 0, 0, "")  # no pending target: untouched


def test_only_pending_targets_of_live_jobs(store: Any) -> None:
    expected = []
    for n, status in enumerate(STATUSES):
        job_id = f"job-{status}"
        dcache.create_batch_job(
            make_job(job_id, status=status, targets_total=4, created_at=n), make_targets(4)
        )
        dcache.update_batch_target(job_id, 1, "running", now=1)
        dcache.update_batch_target(job_id, 2, "done", result="r", now=1)
        dcache.update_batch_target(job_id, 3, "failed", error="e", now=1)
        dcache.set_batch_job_status(job_id, status, now=1)
        if status in ("queued", "running"):
            expected.append((job_id, 0))
    before = {row[0]: row for row in db.execute_sql("SELECT * FROM batch_job").fetchall()}
    assert keys(dcache.claim_batch_targets(100, now=50)) == expected
    assert dcache.claim_batch_targets(100, now=51) == []
    after = {row[0]: row for row in db.execute_sql("SELECT * FROM batch_job").fetchall()}
    for status in ("done", "partial", "failed", "cancelled"):
        assert after[f"job-{status}"] == before[f"job-{status}"]
    for status in STATUSES:
        targets = dcache.batch_targets(f"job-{status}")
        assert targets is not None
        live = status in ("queued", "running")
        assert [t.status for t in targets] == ["running" if live else "pending", "running", "done", "failed"]


def test_nothing_pending_returns_empty_and_writes_nothing(store: Any) -> None:
    assert dcache.claim_batch_targets(5, now=1) == []
    dcache.create_batch_job(make_job("a", targets_total=1, lease=3), make_targets(1))
    dcache.update_batch_target("a", 0, "done", result="x", now=3)
    before = snapshot()
    assert dcache.claim_batch_targets(5, per_job=1, now=99) == []
    assert snapshot() == before
    assert dcache.stats()["claims"] == 0 and dcache.stats()["targets_claimed"] == 0


def test_claimed_targets_take_results_and_count_once(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=3), make_targets(3))
    for target in dcache.claim_batch_targets(3, now=10):
        dcache.update_batch_target(target.job_id, target.idx, "done", result="é" * (target.idx + 1), now=11)
    assert job_row("a") == ("running", 11, 3, 2 + 4 + 6, "")
    assert dcache.claim_batch_targets(3, now=12) == []
    assert dcache.stats()["claims"] == 1 and dcache.stats()["targets_claimed"] == 3


BAD_INPUT: list[tuple[str, dict[str, Any]]] = [
    ("limit", {"limit": 0}),
    ("limit", {"limit": -1}),
    ("limit", {"limit": True}),
    ("limit", {"limit": 2.0}),
    ("limit", {"limit": "3"}),
    ("limit", {"limit": None}),
    ("limit", {"limit": 2**63}),
    ("per_job", {"per_job": 0}),
    ("per_job", {"per_job": -5}),
    ("per_job", {"per_job": False}),
    ("per_job", {"per_job": 1.5}),
    ("per_job", {"per_job": "1"}),
    ("now", {"now": -1}),
    ("now", {"now": 1.5}),
    ("now", {"now": True}),
]


def claim_with(bad: dict[str, Any]) -> Callable[[], object]:
    """claim_batch_targets(2, now=5) with ``bad`` in place of its arguments."""
    args: dict[str, Any] = {"limit": 2, "per_job": None, "now": 5, **bad}
    return lambda: dcache.claim_batch_targets(args.pop("limit"), **args)


def test_bad_input_names_the_field_and_changes_nothing(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=3), make_targets(3))
    refuse_each((repr(bad), claim_with(bad), field) for field, bad in BAD_INPUT)


# -- 8 processes x 200 claims -----------------------------------------------------------------------------

PROCESSES = 8
CLAIMS = 200
JOBS = 40
TARGETS_PER_JOB = 100


def _claimer(target: str, seed: int, barrier: Any) -> dict[str, Any]:
    """200 claims of 1-10 targets (sometimes capped per job); a result written for about a third of the
    targets claimed, between the claims."""
    rng = random.Random(seed)
    dcache.open_db(target)
    claimed: list[tuple[str, int]] = []
    written: dict[str, list[int]] = {}  # job -> sizes of the results written
    errors: list[str] = []
    barrier.wait()
    for n in range(CLAIMS):
        try:
            batch = dcache.claim_batch_targets(
                rng.randint(1, 10), per_job=rng.choice([None, 1, 3]), now=10_000 + n
            )
        except Exception as exc:
            errors.append(f"claim: {type(exc).__name__}: {exc}")
            continue
        if any(t.status != "running" for t in batch):
            errors.append(f"claim returned {[t.status for t in batch]}")
        claimed += keys(batch)
        for t in batch:
            if rng.random() < 0.35:
                size = rng.randint(0, 30)
                try:
                    dcache.update_batch_target(t.job_id, t.idx, "done", result="ß" * size, now=20_000 + n)
                except Exception as exc:
                    errors.append(f"write: {type(exc).__name__}: {exc}")
                    continue
                written.setdefault(t.job_id, []).append(2 * size)
    dcache.close_db()
    return {"errors": errors, "claimed": claimed, "written": written}


@pytest.mark.slow
def test_8_processes_claim_each_target_exactly_once(shared_store: str) -> None:
    for j in range(JOBS):
        dcache.create_batch_job(
            make_job(f"job-{j:02d}", targets_total=TARGETS_PER_JOB, created_at=j % 7, lease=1),
            make_targets(TARGETS_PER_JOB),
        )
    # Finished targets and a finished job's pending targets are never claimed.
    dcache.update_batch_target("job-00", 0, "done", result="old", now=2)
    dcache.create_batch_job(make_job("cancelled", status="cancelled", targets_total=5), make_targets(5))
    pending = {(f"job-{j:02d}", i) for j in range(JOBS) for i in range(TARGETS_PER_JOB)} - {("job-00", 0)}

    reports = run_processes(_claimer, [(shared_store, seed) for seed in range(PROCESSES)])
    assert [r["errors"] for r in reports] == [[]] * PROCESSES
    claimed = [key for r in reports for key in r["claimed"]]
    assert len(claimed) == len(set(claimed))  # no target handed out twice
    assert set(claimed) <= pending
    rest = keys(dcache.claim_batch_targets(10**6, now=99_999))  # what the 200 claims each left
    assert not set(rest) & set(claimed)
    assert set(claimed) | set(rest) == pending and len(claimed) + len(rest) == len(pending)
    assert len(claimed) > len(pending) // 2  # the processes did the claiming, not the drain

    # Exact counts after: each job counts the results written to it (and job-00 its old one), once.
    rows = db.execute_sql("SELECT job_id, status, result FROM batch_target").fetchall()
    assert {r[1] for r in rows if r[0] == "cancelled"} == {"pending"}
    for j in range(JOBS):
        job_id = f"job-{j:02d}"
        sizes = [size for r in reports for size in r["written"].get(job_id, [])]
        mine = [r for r in rows if r[0] == job_id]
        old = 1 if j == 0 else 0
        assert sum(r[1] == "done" for r in mine) == len(sizes) + old
        assert sum(r[1] == "running" for r in mine) == TARGETS_PER_JOB - len(sizes) - old
        job = dcache.batch_job(job_id)
        assert job is not None
        assert (job.status, job.targets_done, job.nbytes) == (
            "running",
            len(sizes) + old,
            sum(sizes) + 3 * old,
        )
    assert dcache.batch_nbytes() == db.execute_sql("SELECT SUM(nbytes) FROM batch_job").fetchone()[0]


# -- PostgreSQL: claims take turns, and wait for a job's short write rather than skip it --------------------

#: What another transaction holds while the claim runs: a target write's locks (job, then target, as
#: postgres.py's lock_target takes them), or another claim's (the ring's row, which every claim locks first).
HOLDERS = {
    "target writer": "SELECT 1 FROM batch_job j JOIN batch_target t ON t.job_id = j.id WHERE j.id = 'a' "
    "AND t.idx = 1 FOR NO KEY UPDATE OF j FOR UPDATE OF t",
    "another claimer": "SELECT 1 FROM batch_claim_ring FOR UPDATE",
}


@pytest.mark.postgres
@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_claim_waits_for_a_job_or_a_claim_another_transaction_holds(
    postgres_schema: str, holder: str
) -> None:
    """A claim that skipped a job held by a result write came back empty while work was pending (several
    runner processes saw it): a claim now waits for the holder, then hands out the job's targets."""
    import threading

    import psycopg
    from conftest import POSTGRES_URL, open_empty_postgres

    open_empty_postgres(postgres_schema)
    dcache.create_batch_job(make_job("a", targets_total=3, created_at=1), make_targets(3))
    dcache.create_batch_job(make_job("b", targets_total=2, created_at=2), make_targets(2))
    got: list[Any] = []
    with psycopg.connect(POSTGRES_URL) as other:
        other.execute(f"SET search_path TO {postgres_schema}")
        assert other.execute(HOLDERS[holder]).fetchall()
        claimer = threading.Thread(target=lambda: got.append(keys(dcache.claim_batch_targets(10, now=5))))
        claimer.start()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as watcher:
            waiting = 0
            while not waiting and claimer.is_alive():  # the claim's session is blocked on a row lock
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = "
                    "current_database() AND query LIKE %s",
                    ("%batch_%",),
                ).fetchone()
                waiting = row[0] if row else 0
        assert waiting and not got
        other.rollback()
        claimer.join(timeout=60)
    assert got == [[("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]]


# -- PostgreSQL: the claim's plans read the partial indexes, whatever the planner's statistics say -------


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
def test_claim_plans_on_postgres_read_the_partial_indexes(postgres_schema: str, plan_mode: str) -> None:
    from conftest import open_empty_postgres

    open_empty_postgres(postgres_schema)
    with db.atomic():  # a history of finished jobs, then 50 live jobs of 100 pending targets each
        db.backend.executemany(
            "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, error, targets_total, "
            "targets_done, created_at, lease, nbytes) "
            "VALUES (%s, 'c', 'fleet', '', 'done', '', 0, 0, %s, %s, 0)",
            [(f"old-{i}", i, i) for i in range(5_000)],
        )
    for j in range(50):
        dcache.create_batch_job(
            make_job(f"job-{j:02d}", targets_total=100, created_at=10**6 + j), make_targets(100)
        )
    # The finished jobs paused, and 5,000 paused callers with no live job, analyzed: what the server knows
    # of these tables decides their plans. A small one, or an empty one the server has analyzed (autovacuum
    # may, after earlier tests' writes to the worker's schema), is rightly read by a table scan.
    with db.atomic():
        db.backend.executemany(
            "INSERT INTO batch_paused_job (job_id, paused_at) VALUES (%s, 1)",
            [(f"old-{i}",) for i in range(5_000)],
        )
        db.backend.executemany(
            "INSERT INTO batch_paused_caller (caller, paused_at) VALUES (%s, 1)",
            [(f"gone-{i}",) for i in range(5_000)],
        )
    db.execute_sql("ANALYZE batch_job")
    db.execute_sql("ANALYZE batch_target")  # every target pending: a table scan looks cheap for LIMIT 1
    db.execute_sql("ANALYZE batch_paused_job")
    db.execute_sql("ANALYZE batch_paused_caller")
    for _ in range(10):
        dcache.claim_batch_targets(100, now=10**7)  # the 10 oldest jobs have no pending target left
    db.execute_sql(f"SET plan_cache_mode = {plan_mode}")
    try:
        plans: list[tuple[str, dict[str, Any]]] = [
            ("_NEXT_JOB", {"after_created": -1, "after_order": -1}),
            ("_CALLER_JOB", {"caller": "alice", "after_created": -1, "after_order": -1}),
            ("_NEXT_CALLER_JOB", {"after": "a"}),
            ("_FIRST_CALLER_JOB", {}),
            ("_HOST_FROM", {"job_id": "job-20", "host": "", "now_ms": 5_000}),
            ("_HOST_AFTER", {"job_id": "job-20", "host": "example.com", "now_ms": 5_000}),
            (
                "_CLAIM_HOST_TARGETS",
                {"job_id": "job-20", "host": "example.com", "take": 5, "runner": "r", "now": 5},
            ),
            ("_CLAIM_TARGETS", {"job_id": "job-20", "take": 5, "runner": "r", "now": 5}),
            ("_HOST_POLICY", {"host": "example.com"}),
            ("_SET_NEXT_DUE", {"host": "example.com", "due": 5_000}),
            ("_RENEW", {"runner": "r", "now": 5}),
            ("_RELEASE", {"runner": "r"}),
            ("_STALE_JOBS", {"cutoff": 5, "runner": None}),
            ("_FAIL_STALE", {"reason": "r", "cutoff": 5, "max_attempts": 3, "runner": "r"}),
            ("_REQUEUE_STALE", {"cutoff": 5, "runner": None}),
            ("_ANY_STALE", {"cutoff": 5, "runner": None}),
            ("_CLAIM_JOBS", {"job_ids": ["job-20", "job-21"], "now": 5}),
            ("_RESCUE", {"reason": "r", "now": 5, "cutoff": 10**6}),
        ]
        for name, values in plans:
            sql, params = rule_statements()[name].bind(values)
            with db.atomic() as transaction:
                lines = [row[0] for row in db.execute_sql(f"EXPLAIN {sql}", params).fetchall()]
                transaction.rollback()
            plan = "\n".join(lines)
            assert "Seq Scan" not in plan, (name, plan)
            # A requeue sorts the stale claims' jobs (a few rows, read by id) to lock them in id order.
            assert ("Sort" in plan) == (name == "_STALE_JOBS"), (name, plan)
            # No nested loop over the picked targets: each one is found by one index probe (idx = ANY).
            assert "Nested Loop" not in plan, (name, plan)
            used = set(re.findall(r"Index (?:Only )?Scan (?:using|on) (\w+)", plan))
            assert used == POSTGRES_INDEXES[name], (name, plan)
    finally:
        db.execute_sql("SET plan_cache_mode = auto")


@pytest.mark.postgres
@pytest.mark.parametrize("analyzed", [False, True])
def test_a_claims_update_reads_each_picked_target_once_on_postgres(
    postgres_schema: str, analyzed: bool
) -> None:
    """Claiming N targets costs O(N): the update reads the picked rows by address (a TID scan), with or
    without the planner's statistics; a filter testing each pending target against every picked one, or a
    nested loop over the picked rows, made a claim of 16,000 take minutes."""
    from conftest import open_empty_postgres

    open_empty_postgres(postgres_schema)
    dcache.create_batch_job(make_job("big", targets_total=4_000, created_at=1), make_targets(4_000))
    if analyzed:
        db.execute_sql("ANALYZE batch_target")
    sql, params = claimorder._CLAIM_TARGETS.bind({"job_id": "big", "take": 4_000, "runner": "r", "now": 5})
    with db.atomic() as transaction:
        plan = "\n".join(row[0] for row in db.execute_sql(f"EXPLAIN {sql}", params).fetchall())
        transaction.rollback()
    update = plan.split("CTE Scan on picked", 1)[1].split("\n", 1)[1]  # what the UPDATE reads, after the pick
    assert "Tid Scan on batch_target" in update and "TID Cond: (ctid = ANY" in update, plan
    assert "Nested Loop" not in plan and "Seq Scan" not in plan and "Filter" not in update, plan
    assert len(dcache.claim_batch_targets(4_000, now=5)) == 4_000


CLAIMER = {"runner": "r", "now": 5}
#: Each live job the claim's walk reaches is probed in the pause tables, by their keys.
UNPAUSED = {"batch_paused_job_pkey", "batch_paused_caller_pkey"}
POSTGRES_INDEXES = {
    "_NEXT_JOB": {"batch_job_claim", "batch_target_host", *UNPAUSED},
    "_CALLER_JOB": {"batch_job_ring", "batch_target_host", *UNPAUSED},
    "_NEXT_CALLER_JOB": {"batch_job_ring", "batch_target_host", *UNPAUSED},
    "_FIRST_CALLER_JOB": {"batch_job_ring", "batch_target_host", *UNPAUSED},
    # the host rules: each host the walk reaches, and a paced host's next due time, by the policy's key
    "_HOST_POLICY": {"batch_host_policy_pkey"},
    "_SET_NEXT_DUE": {"batch_host_policy_pkey"},
    # the walk past held hosts: each host by batch_target_host, checked and read by the policy's key
    "_HOST_FROM": {"batch_target_host", "batch_host_policy_pkey"},
    "_HOST_AFTER": {"batch_target_host", "batch_host_policy_pkey"},
    "_CLAIM_HOST_TARGETS": {"batch_target_host"},
    "_CLAIM_TARGETS": {"batch_target_host"},
    "_RENEW": {"batch_target_running"},
    "_RELEASE": {"batch_target_running"},
    "_STALE_JOBS": {"batch_target_running", "batch_job_pkey"},
    "_FAIL_STALE": {"batch_target_running"},
    "_REQUEUE_STALE": {"batch_target_running"},
    "_ANY_STALE": {"batch_target_running"},
    "_CLAIM_JOBS": {"batch_job_pkey"},
    "_RESCUE": {"batch_job_live_lease"},
}


# -- PostgreSQL: claims beside every other writer, without a deadlock ---------------------------------------


MIXED_JOBS = 10
MIXED_TARGETS = 300


def _count_conflicts(counts: dict[str, int]) -> None:
    """Count the transactions this process runs again after a deadlock or serialization failure."""
    backend = db.backend
    retry = backend.retry

    def counted(conflict: BaseException, run: Any) -> Any:
        counts["conflicts"] += 1
        return retry(conflict, run)

    backend.retry = counted  # type: ignore[method-assign]


def _mixed(kind: str, target: str, seed: int, barrier: Any) -> dict[str, Any]:
    rng = random.Random(seed)
    dcache.open_db(target)
    counts = {"conflicts": 0, "gone": 0, "claimed": 0}
    _count_conflicts(counts)
    errors: list[str] = []
    barrier.wait()
    for n in range(150):
        try:
            if kind == "claim":
                batch = dcache.claim_batch_targets(rng.randint(1, 10), per_job=3, now=50_000 + n)
                counts["claimed"] += len(batch)
                for t in batch:
                    dcache.update_batch_target(
                        t.job_id, t.idx, "done", result="r" * rng.randint(1, 20), now=50_000
                    )
                for job_id in {t.job_id for t in batch}:
                    job = dcache.batch_job(job_id)
                    if job is not None and job.targets_done == job.targets_total:
                        dcache.set_batch_job_status(job_id, "done", now=50_000 + n)
            elif kind == "write":  # writes the very targets the claims are about to take, and the jobs
                job_id = f"job-{rng.randrange(MIXED_JOBS):02d}"
                pending = [t.idx for t in dcache.batch_targets(job_id) or [] if t.status == "pending"]
                for idx in pending[:2]:
                    dcache.update_batch_target(job_id, idx, "done", result="w", now=50_000 + n)
                dcache.touch_batch_job(job_id, now=50_000 + n)
                dcache.set_batch_job_status(job_id, "running", now=50_000 + n)
            elif kind == "sweep":
                dcache.sweep_batch(100, now=1_000)  # the old jobs (lease 1..300) only
            else:
                dcache.evict_batch_oldest(dcache.batch_nbytes() - 50)
        except (dcache.JobNotFound, dcache.InvalidBatchInput):
            counts["gone"] += 1  # a finished target cannot go back to running; an evicted job is gone
        except Exception as exc:
            errors.append(f"{kind}: {type(exc).__name__}: {exc}")
    dcache.close_db()
    return {"errors": errors, **counts}


@pytest.mark.slow
@pytest.mark.postgres
def test_claims_beside_writers_sweeps_and_evictions_meet_no_deadlock(postgres_schema: str) -> None:
    from conftest import open_empty_postgres, postgres_target

    open_empty_postgres(postgres_schema)
    for j in range(MIXED_JOBS):
        dcache.create_batch_job(
            make_job(f"job-{j:02d}", targets_total=MIXED_TARGETS, created_at=j, lease=10_000),
            make_targets(MIXED_TARGETS),
        )
    for i in range(300):  # what the sweeper and the evictor take meanwhile
        dcache.create_batch_job(
            make_job(f"old-{i}", status="done", lease=1 + i, targets_total=2), make_targets(2)
        )
        dcache.update_batch_target(f"old-{i}", 0, "done", result="x" * 30, now=1 + i)
        dcache.set_batch_job_status(f"old-{i}", "done", now=1 + i)
    target = postgres_target(postgres_schema)
    kinds = ["claim"] * 4 + ["write"] * 2 + ["sweep", "evict"]
    reports = run_processes(_mixed, [(kind, target, seed) for seed, kind in enumerate(kinds)])
    assert [r["errors"] for r in reports] == [[]] * len(kinds)
    assert [r["conflicts"] for r in reports] == [0] * len(kinds)  # not one deadlock to retry
    assert sum(r["claimed"] for r in reports) > 1_000
    assert db.execute_sql("SELECT COUNT(*) FROM batch_job WHERE id LIKE 'old-%%'").fetchone()[0] == 0
    rows = db.execute_sql("SELECT id, targets_done, nbytes FROM batch_job").fetchall()
    for job_id, done, nbytes in rows:
        finished = db.execute_sql(
            "SELECT COUNT(*), COALESCE(SUM(octet_length(result)), 0) FROM batch_target "
            "WHERE job_id = %s AND status IN ('done', 'failed')",
            (job_id,),
        ).fetchone()
        assert (done, nbytes) == tuple(finished), job_id
    assert (
        dcache.batch_nbytes()
        == db.execute_sql("SELECT COALESCE(SUM(nbytes), 0) FROM batch_job").fetchone()[0]
    )


@pytest.mark.sqlite_only
@pytest.mark.parametrize(("version", "refused"), [((3, 34, 1), True), ((3, 35, 0), False)])
def test_a_sqlite_library_older_than_3_35_is_refused_by_name(
    store: Any, monkeypatch: pytest.MonkeyPatch, version: tuple[int, int, int], refused: bool
) -> None:
    """The claim's statement needs SQLite 3.35 (UPDATE … FROM, RETURNING, MATERIALIZED): an older library
    is named in the error, nothing is written, and the other functions go on working."""
    import sqlite3

    dcache.create_batch_job(make_job("a", targets_total=2, lease=3), make_targets(2))
    monkeypatch.setattr(sqlite3, "sqlite_version_info", version)
    monkeypatch.setattr(sqlite3, "sqlite_version", ".".join(map(str, version)))
    before = snapshot()
    if not refused:
        assert keys(dcache.claim_batch_targets(1, now=5)) == [("a", 0)]
        return
    message = "needs SQLite 3.35 or later; this Python's sqlite3 module uses SQLite 3.34.1"
    with pytest.raises(dcache.StoreUnavailable, match=re.escape(message)):
        dcache.claim_batch_targets(1, now=5)
    assert snapshot() == before
    dcache.update_batch_target("a", 1, "done", result="x", now=6)
    job = dcache.batch_job("a")
    assert job is not None and job.targets_done == 1
