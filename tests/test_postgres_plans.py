"""PostgreSQL's plans for the hot reads: through an index, never a scan of batch_job or batch_target, under
custom plans and under the generic plan psycopg's prepared statements get after 5 runs (where the planner
guesses a third of the rows match an inequality). SQLite's plans are pinned in test_query_plans.py; the
claim's and the rescue's PostgreSQL plans in test_claim.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import open_empty_postgres
from helpers import make_job, make_targets, rule_statements

from sift import dcache
from sift.dcache import db

pytestmark = pytest.mark.postgres

#: Each statement, the values of its slots, and the indexes its plan may read (it must read one at least).
HOT_READS: dict[str, tuple[dict[str, Any], set[str]]] = {
    "_ANY_EXPIRED": ({"cutoff": 10}, {"batch_job_lease"}),  # the runner's no-op sweep
    "_EXPIRED": ({"cutoff": 10}, {"batch_job_lease"}),
    "_EVICTABLE": ({}, {"batch_job_evictable"}),
    "_IDEM": ({"caller": "caller-7", "idem_key": "key-7", "cutoff": 10}, {"batch_job_idem"}),
    "_LIVE": ({"caller": "caller-7"}, {"batch_job_live"}),
    "_LIVE_TOTAL": ({}, {"batch_job_live", "batch_job_live_lease", "batch_job_claim"}),  # all live jobs
    "_SELECT_JOB": ({"job_id": "old-7"}, {"batch_job_pkey"}),
    "_SELECT_TARGETS": ({"job_id": "job-3"}, {"batch_job_pkey", "batch_target_pkey"}),
    "_TOUCH": ({"job_id": "job-3", "now": 5}, {"batch_job_pkey"}),
    # a page of a job's targets: one range of the target's primary key
    "_PAGE": ({"job_id": "old-7", "after_idx": 3, "limit": 5}, {"batch_target_pkey"}),
    # the client's calls: a key hit's comparison, and a cancel (writes: planned, rolled back)
    "_STORED_CLASS": ({"job_id": "old-7"}, {"batch_job_pkey"}),
    "_STORED_TARGETS": ({"job_id": "old-7"}, {"batch_target_pkey"}),
    "_CANCEL_JOB": ({"job_id": "job-3", "reason": "r", "now": 5}, {"batch_job_pkey", "batch_target_pkey"}),
    "_FAIL_OPEN_TARGETS": ({"job_id": "job-3", "reason": "r"}, {"batch_target_pkey"}),
    # store_load (a metrics scrape): the live jobs by caller, and the running targets with their jobs
    "_OUTSTANDING": ({}, {"batch_job_live", "batch_job_live_lease", "batch_job_claim", "batch_job_ring"}),
    "_RUNNING": ({}, {"batch_target_running", "batch_job_pkey"}),
    # every claim first moves the delayed targets come due back: only the waiting ones are read
    # each due target's host probed by the policy's key (a host still backed off keeps it waiting)
    "_PROMOTE_DUE": ({"now": 5}, {"batch_target_delayed", "batch_host_policy_pkey"}),
    # a runner's heartbeat: its claims no other transaction holds, locked, then each read by address
    "_RENEW": ({"runner": "r", "now": 5}, {"batch_target_running"}),
    # a runner's keeper: the live jobs whose targets are all final
    "_COMPLETE_JOBS": ({}, {"batch_job_live", "batch_job_live_lease", "batch_job_claim", "batch_job_ring"}),
}


@pytest.fixture(scope="module")
def history(postgres_schema: str) -> None:
    """100,000 finished jobs of 100 callers holding bytes (the first 5,000 with 10 targets each), and 20 live
    jobs of 10 targets each, analyzed."""
    open_empty_postgres(postgres_schema)
    with db.atomic():  # the byte total's trigger fires per row: 10 bytes a job
        db.execute_sql(
            "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, error, targets_total, "
            "targets_done, created_at, lease, nbytes) SELECT 'old-' || g, 'caller-' || mod(g, 100), 'fleet', "
            "'key-' || g, 'done', '', 10, 10, 1000 + g, 1000 + g, 10 FROM generate_series(0, 99999) g"
        )
        db.execute_sql(
            "INSERT INTO batch_target (job_id, idx, url, options, status, result) "
            "SELECT 'old-' || g, i, 'u', '{}', 'done', 'r' FROM generate_series(0, 4999) g, "
            "generate_series(0, 9) i"
        )
    for j in range(20):
        dcache.create_batch_job(make_job(f"job-{j}", targets_total=10, lease=10**6), make_targets(10))
    db.execute_sql("ANALYZE batch_job")
    db.execute_sql("ANALYZE batch_target")


@pytest.mark.slow
@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("name", list(HOT_READS))
def test_hot_reads_use_their_index(history: None, name: str, plan_mode: str) -> None:
    values, indexes = HOT_READS[name]
    sql, params = rule_statements()[name].bind(dict(values))
    db.execute_sql(f"SET plan_cache_mode = {plan_mode}")
    try:
        with db.atomic() as transaction:  # EXPLAIN of an UPDATE plans it only; rolled back all the same
            db.execute_sql(f"PREPARE hot AS {sql.replace('%s', '${}').format(*range(1, len(params) + 1))}")
            try:
                lines = [row[0] for row in db.execute_sql(f"EXPLAIN EXECUTE hot{args(params)}").fetchall()]
            finally:
                db.execute_sql("DEALLOCATE hot")
            transaction.rollback()
    finally:
        db.execute_sql("SET plan_cache_mode = auto")
    plan = "\n".join(lines)
    assert not re.search(r"Seq Scan on batch_(job|target)\b", plan), plan
    used = set(re.findall(r"(?:Index (?:Only )?Scan(?: Backward)? using|Bitmap Index Scan on) (\w+)", plan))
    assert used and used <= indexes, plan


#: Left out of the generic-plan test: _EXPIRED runs once per chunk of 256 expired jobs, never on the runner's
#: path, and is planned on every run all the same (its generic plan guesses a third of the jobs expired; its
#: LIMIT is written in only like the others'): one planning per 256 jobs swept. _TOUCH is a write (its plan,
#: by primary key, is pinned above), as are the cancel's two, the claim's move of due targets and the renewal.
NOT_SETTLED = {"_EXPIRED", "_TOUCH", "_CANCEL_JOB", "_FAIL_OPEN_TARGETS", "_PROMOTE_DUE", "_RENEW"}
#: The claim's searches (the ring's next caller with its oldest job, a caller's next job, a job's next host;
#: fair=False's next job), as ClaimOrder runs them (their plans: test_claim.py). On PostgreSQL a claim runs
#: the same queries inside its server function (claim.sql): test_claim_round_trips.py reads those plans.
CLAIM_READS: dict[str, dict[str, Any]] = {
    "_NEXT_JOB": {"after_created": -1, "after_order": -1},
    "_CALLER_JOB": {"caller": "alice", "after_created": -1, "after_order": -1},
    "_NEXT_CALLER_JOB": {"after": "a"},
    "_FIRST_CALLER_JOB": {},
    "_HOST_FROM": {"job_id": "job-3", "host": "", "now_ms": 5_000},
    "_HOST_AFTER": {"job_id": "job-3", "host": "a.example", "now_ms": 5_000},
    # the claim's updates, on a job of their own: 15 runs claim its 10 targets, then find none
    "_CLAIM_TARGETS": {"job_id": "job-19", "take": 1, "runner": "r", "now": 5},
    "_CLAIM_HOST_TARGETS": {"job_id": "job-18", "host": "example.com", "take": 1, "runner": "r", "now": 5},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in HOT_READS if name not in NOT_SETTLED] + list(CLAIM_READS))
def test_hot_reads_settle_on_their_generic_plan(history: None, name: str) -> None:
    """Once psycopg prepares a hot read (after 5 runs), PostgreSQL runs its generic plan instead of planning
    every run again. It chooses so only when the generic plan costs no more than the custom ones: with a
    bound ``LIMIT $1``, guessed at a tenth of the rows, the no-op sweep's check was planned on every run,
    which made it 1.3x slower at 100,000 jobs than at 1,000 (bench: pg/flat/sweep_batch_noop)."""
    values = CLAIM_READS[name] if name in CLAIM_READS else HOT_READS[name][0]
    statement = rule_statements()[name]
    sql, _ = statement.bind(dict(values))
    # Committed, not rolled back: psycopg forgets every prepared statement of a connection on ROLLBACK.
    # psycopg prepares on the 6th run, and PostgreSQL plans the first 5 runs of a prepared statement for
    # their values: 15 runs leave 5 where it may choose the generic plan.
    with db.atomic():  # some lock the rows they read, until the COMMIT; nothing is changed
        for _ in range(15):
            statement.rows(**values)
    numbers = iter(range(1, 100))
    numbered = re.sub("%s", lambda _: f"${next(numbers)}", sql)  # the text psycopg prepares
    plans = db.execute_sql(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = %s", (numbered,)
    ).fetchall()
    assert len(plans) == 1, f"psycopg did not prepare {sql}"
    generic, custom = plans[0]
    assert generic > 0, f"planned on every run ({custom} custom plans, no generic one): {sql}"


def args(params: tuple[Any, ...]) -> str:
    """``(v1, v2, …)`` as SQL literals for EXECUTE (the values are the test's own ints and plain strings)."""
    if not params:
        return ""
    return "(" + ", ".join(str(p) if isinstance(p, int) else f"'{p}'" for p in params) + ")"
