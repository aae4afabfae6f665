"""A claim on PostgreSQL is one statement, the server function of claim.sql: three round trips (BEGIN, the
call, COMMIT) whatever it walks, and the same targets, in the same order, as SQLite's in-process claim
(``ClaimOrder``), in named cases and in random ones. Its cost stays flat in the targets waiting: the
function's buffers, which count its nested statements', nearly the same with 100 times as many pending and
delayed targets; and its statements' plans read the indexes."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import pytest
from conftest import open_empty_postgres
from helpers import claim_buffers, count_round_trips, make_job

from sift import dcache
from sift.dcache import db

pytestmark = pytest.mark.postgres

HOSTS = ("a.example", "b.example", "c.example")


def add_job(caller: str, name: str, count: int, *, caller_class: str = "fleet", created_at: int = 1) -> None:
    """Job ``caller/name`` of ``count`` targets spread over three hosts (idx 0 on a.example, 1 on b, ...)."""
    targets = [
        dcache.BatchTarget(idx=i, url=f"https://{HOSTS[i % 3]}/{i}", options="{}") for i in range(count)
    ]
    job = make_job(f"{caller}/{name}", caller=caller, caller_class=caller_class, targets_total=count)
    job.created_at = created_at
    dcache.create_batch_job(job, targets)


def three_callers() -> None:
    for caller in ("carol", "alice", "bob"):
        for n in range(2):
            add_job(caller, f"j{n}", 4, created_at=n)


def classes() -> None:
    add_job("alice", "j0", 8, caller_class="restricted")
    add_job("bob", "j0", 8)
    add_job("carol", "j0", 8, caller_class="restricted")


def policies() -> None:
    three_callers()
    dcache.set_host_policy("a.example", max_running=1)
    dcache.set_host_policy("b.example", min_interval=1)
    dcache.back_off_host("c.example", 10_000, now=5)


def paused() -> None:
    three_callers()
    dcache.pause_batch_job("alice/j0", now=5)
    dcache.pause_caller("bob", now=5)


Claim = tuple[Callable[[], None], dict[str, Any]]
#: Each case: the store it starts from, and the claims' arguments (two claims: the second goes on from the
#: ring's cursor the first saved).
CASES: dict[str, Claim] = {
    "fair": (three_callers, {"per_job": 3}),
    "oldest first": (three_callers, {"fair": False, "per_job": 3}),
    "per_host": (three_callers, {"per_host": 2}),
    "weights": (classes, {"weights": {"restricted": 3}}),
    "host policies": (policies, {}),
    "paused": (paused, {}),
}


def claimed_by(make: Callable[[], None], kwargs: dict[str, Any]) -> list[list[tuple[str, int, bool]]]:
    """Two claims of 7 on the open store made by ``make``: each as (job, idx, whether it has a send_by)."""
    make()
    return [
        [
            (t.job_id, t.idx, t.send_by is not None)
            for t in dcache.claim_batch_targets(7, runner="r", now=5, **kwargs)
        ]
        for _ in range(2)
    ]


@pytest.mark.parametrize("case", list(CASES))
def test_a_claim_is_three_round_trips_and_claims_as_sqlite_does(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    make, kwargs = CASES[case]
    dcache.open_db(":memory:")
    expected = claimed_by(make, kwargs)
    dcache.close_db()
    assert expected[0], "the case claims something"
    open_empty_postgres(postgres_schema)
    make()
    got = []
    for _ in range(2):
        sent = count_round_trips(monkeypatch)
        got.append(
            [
                (t.job_id, t.idx, t.send_by is not None)
                for t in dcache.claim_batch_targets(7, runner="r", now=5, **kwargs)
            ]
        )
        monkeypatch.undo()
        assert len(sent) == 3, sent  # BEGIN, the claim, COMMIT
        assert "sift_claim_batch" in sent[1]
    assert got == expected
    dcache.close_db()


def test_the_claims_pinned_orders_on_postgres(postgres_schema: str) -> None:
    """The order itself, written out: the ring in byte order, each caller's oldest job, host by host."""
    open_empty_postgres(postgres_schema)
    three_callers()
    first, second = claimed_by(lambda: None, {"per_job": 3})
    assert [(job, idx) for job, idx, _ in first] == [
        ("alice/j0", 0),
        ("bob/j0", 0),
        ("carol/j0", 0),
        ("alice/j0", 3),
        ("bob/j0", 3),
        ("carol/j0", 3),
        ("alice/j0", 1),
    ]
    assert [(job, idx) for job, idx, _ in second][:2] == [("bob/j0", 1), ("carol/j0", 1)]
    ring = db.execute_sql("SELECT caller, turns FROM batch_claim_ring").fetchall()
    assert ring == [("bob", 1)]  # the second claim's last turn: bob's, its first of 1
    dcache.close_db()


# -- Flat cost: the function's buffers, nested statements included --------------------------------------


def fill(pending: int, delayed: int) -> None:
    """5 callers' jobs holding ``pending`` claimable targets on 7 hosts, ``delayed`` targets waiting (not
    before a time far ahead), and 10,000 finished jobs; analyzed."""
    db.execute_sql("TRUNCATE batch_job, batch_target")
    db.execute_sql(
        "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, targets_total, created_at, "
        "lease) SELECT 'old-' || g, 'c' || mod(g, 5), 'fleet', 'old-' || g, 'done', 1, 0, 0 "
        "FROM generate_series(1, 10000) g"
    )
    for c in range(5):
        db.execute_sql(
            "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, targets_total, created_at, "
            f"lease) VALUES ('c{c}', 'c{c}', 'fleet', 'k{c}', 'queued', {pending // 5}, 1, 1000)"
        )
        db.execute_sql(
            "INSERT INTO batch_target (job_id, idx, url, options, status, host) SELECT "
            f"'c{c}', g, 'u', '{{}}', 'pending', 'h' || mod(g, 7) "
            f"FROM generate_series(0, {pending // 5 - 1}) g"
        )
    db.execute_sql(
        "INSERT INTO batch_target (job_id, idx, url, options, status, host, not_before) SELECT "
        f"'c0', 10000000 + g, 'u', '{{}}', 'pending', 'h0', 999999 FROM generate_series(1, {delayed}) g"
    )
    db.execute_sql("ANALYZE batch_job")
    db.execute_sql("ANALYZE batch_target")


@pytest.mark.slow
def test_a_claims_buffers_stay_flat_with_100_times_the_waiting_targets(postgres_schema: str) -> None:
    """1,000 pending and 10,000 delayed targets, then 100,000 and 1,000,000: a scan of either would read
    100 times the pages; the claim's walk reads what it hands out, each index a level deeper at most."""
    open_empty_postgres(postgres_schema)
    try:
        fill(1_000, 10_000)
        small = claim_buffers()
        fill(100_000, 1_000_000)
        large = claim_buffers()
    finally:
        db.execute_sql("TRUNCATE batch_job, batch_target")
        dcache.close_db()
    assert small > 0
    assert large <= 1.5 * small, (small, large)


#: The claims whose nested plans are read: fair, oldest first, per_host (the hosts' walk), weights.
PLANNED_CLAIMS = (
    "10, 10, NULL, TRUE, ARRAY[]::text[], ARRAY[]::bigint[]",
    "10, 3, NULL, FALSE, ARRAY[]::text[], ARRAY[]::bigint[]",
    "10, 10, 2, TRUE, ARRAY[]::text[], ARRAY[]::bigint[]",
    "10, 10, NULL, TRUE, ARRAY['fleet']::text[], ARRAY[3]::bigint[]",
)


@pytest.mark.slow
@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
def test_the_claim_functions_statements_read_the_indexes(postgres_schema: str, plan_mode: str) -> None:
    """Every statement the function runs, as PostgreSQL plans it there (auto_explain's nested plans, sent
    to this connection as notices), under custom and generic plans: never a scan of batch_job or
    batch_target, and the picked targets updated by their address (a TID scan)."""
    import psycopg
    from conftest import POSTGRES_URL

    open_empty_postgres(postgres_schema)
    try:
        fill(1_000, 10_000)
        dcache.set_host_policy("h1", max_running=1)
        dcache.set_host_policy("h2", min_interval=1)
        dcache.back_off_host("h3", 10_000, now=5)
        dcache.pause_batch_job("c4", now=5)
        db.execute_sql("ANALYZE")
        plans: list[str] = []
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
            conn.execute(f'SET search_path TO "{postgres_schema}"')
            conn.execute("LOAD 'auto_explain'")
            conn.execute("SET auto_explain.log_min_duration = 0")
            conn.execute("SET auto_explain.log_nested_statements = on")
            conn.execute("SET auto_explain.log_level = 'notice'")
            conn.execute(f"SET plan_cache_mode = {plan_mode}")
            for args in PLANNED_CLAIMS:
                conn.execute("BEGIN")
                claimed = conn.execute(
                    f"SELECT * FROM sift_claim_batch({args}, 'r', 5, 5000, 100)"
                ).fetchall()
                conn.execute("ROLLBACK")
                assert claimed
    finally:
        db.execute_sql("TRUNCATE batch_job, batch_target")
        dcache.close_db()
    nested = [plan for plan in plans if "sift_claim_batch" not in plan]
    assert len(nested) > 4 * len(PLANNED_CLAIMS), plans
    # the ring's searches, the hosts' walk and the takes were all planned
    for text in ("ORDER BY j.caller", "WITH RECURSIVE walk", "UPDATE batch_target t SET status = 'running'"):
        assert any(text in plan for plan in nested), text
    for plan in nested:
        assert not re.search(r"Seq Scan on batch_(job|target)\b", plan), plan
        if "UPDATE batch_target t SET status = 'running'" in plan:
            assert "Tid Scan on batch_target" in plan, plan


# -- The two backends claim alike: random stores and claims, run on each -------------------------------


def random_case(seed: int) -> tuple[list[tuple[Any, ...]], list[tuple[int, dict[str, Any], int, bool]]]:
    """A store (jobs of callers and classes on a few hosts, maybe host policies, a back-off, a paused job or
    caller) and a run of claims (limit, arguments, time, whether the first target claimed is then done)."""
    draw = random.Random(seed)
    callers = [f"c{i}" for i in range(draw.randint(1, 5))]
    hosts = [f"h{i}.example" for i in range(draw.randint(1, 4))]
    steps: list[tuple[Any, ...]] = []
    for n in range(draw.randint(1, 8)):
        caller, count = draw.choice(callers), draw.randint(1, 12)
        urls = [f"https://{draw.choice(hosts)}/{i}" for i in range(count)]
        steps.append(
            ("job", f"{caller}/j{n}", caller, draw.choice(["fleet", "restricted"]), draw.randint(0, 3), urls)
        )
    if draw.random() < 0.5:
        steps.append(
            ("policy", draw.choice([*hosts, "*"]), draw.choice([None, 1, 2]), draw.choice([None, 0, 1]))
        )
    if draw.random() < 0.3:
        steps.append(("policy", draw.choice(hosts), draw.choice([None, 1, 3]), draw.choice([None, 1])))
    if draw.random() < 0.3:
        steps.append(("back off", draw.choice(hosts)))
    if draw.random() < 0.3:
        steps.append(("pause job", steps[0][1]))
    if draw.random() < 0.3:
        steps.append(("pause caller", draw.choice(callers)))
    claims, now = [], 5
    for _ in range(draw.randint(1, 5)):
        kwargs: dict[str, Any] = {"per_job": draw.choice([None, 1, 2, 5])}
        if draw.random() < 0.3:
            kwargs["per_host"] = draw.choice([1, 2, 3])
        if draw.random() < 0.2:
            kwargs["fair"] = False
        elif draw.random() < 0.5:
            kwargs["weights"] = {"fleet": draw.randint(1, 3), "restricted": draw.randint(1, 4)}
        now += draw.choice([0, 1, 2])
        claims.append((draw.randint(1, 40), kwargs, now, draw.random() < 0.3))
    return steps, claims


def run_case(steps: list[tuple[Any, ...]], claims: list[tuple[int, dict[str, Any], int, bool]]) -> list[Any]:
    """The case on the open store: each claim's targets (job, idx, send_by), then the ring, the hosts' rows
    and every target's and job's state."""
    for step in steps:
        if step[0] == "job":
            _, job_id, caller, caller_class, created_at, urls = step
            job = make_job(job_id, caller=caller, caller_class=caller_class, targets_total=len(urls))
            job.created_at = created_at
            targets = [dcache.BatchTarget(idx=i, url=url, options="{}") for i, url in enumerate(urls)]
            dcache.create_batch_job(job, targets)
        elif step[0] == "policy":
            dcache.set_host_policy(step[1], max_running=step[2], min_interval=step[3])
        elif step[0] == "back off":
            dcache.back_off_host(step[1], 10_000, now=5)
        elif step[0] == "pause job":
            dcache.pause_batch_job(step[1], now=5)
        else:
            dcache.pause_caller(step[1], now=5)
    seen: list[Any] = []
    for limit, kwargs, now, finish in claims:
        got = dcache.claim_batch_targets(limit, runner="r", now=now, **kwargs)
        seen.append([(t.job_id, t.idx, t.send_by) for t in got])
        if finish and got:
            dcache.update_batch_target(got[0].job_id, got[0].idx, "done", result="x", now=now)
    for sql in (
        "SELECT caller, turns FROM batch_claim_ring",
        "SELECT host, next_due_ms FROM batch_host_policy ORDER BY host",
        "SELECT job_id, idx, status, runner, heartbeat, attempts FROM batch_target ORDER BY job_id, idx",
        "SELECT id, status, lease FROM batch_job ORDER BY id",
    ):
        seen.append([tuple(row) for row in db.execute_sql(sql).fetchall()])
    return seen


@pytest.mark.slow
def test_random_stores_claim_alike_on_both_backends(postgres_schema: str) -> None:
    """60 random cases: the claims, and the store they leave, are the same on SQLite (ClaimOrder) and on
    PostgreSQL (the server function)."""
    for seed in range(60):
        steps, claims = random_case(seed)
        dcache.open_db(":memory:")
        expected = run_case(steps, claims)
        dcache.close_db()
        open_empty_postgres(postgres_schema)
        assert run_case(steps, claims) == expected, seed
        dcache.close_db()
