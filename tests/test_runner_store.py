"""The store's calls for retries: a runner's retry of a target it holds (``retry_batch_target``, pending
again and not claimed before its ``not_before``), an operator's reopening of a job's failed targets
(``retry_failed_targets``), and ``finish_complete_jobs``; on every backend."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import POSTGRES_URL, drop_schema, postgres_target
from helpers import ListedKeys, count_statements, make_job, make_targets, refuse_each, snapshot

from sift import dcache
from sift.dcache import db
from sift.dcache.tables import SCHEMA_VERSION


def claim_all(runner: str = "r1", now: int = 2_000, limit: int = 100) -> list[tuple[str, int]]:
    return [(t.job_id, t.idx) for t in dcache.claim_batch_targets(limit, runner=runner, now=now)]


def not_before(job_id: str, idx: int) -> Any:
    return db.execute_sql(
        f"SELECT not_before FROM batch_target WHERE job_id = '{job_id}' AND idx = {idx}"
    ).fetchone()[0]


def target(job_id: str, idx: int) -> dcache.BatchTarget:
    targets = dcache.batch_targets(job_id)
    assert targets is not None
    return targets[idx]


def job(job_id: str) -> dcache.BatchJob:
    found = dcache.batch_job(job_id)
    assert found is not None
    return found


def test_a_retried_target_waits_pending_until_its_time_then_is_claimed_again(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=2), make_targets(2))
    assert claim_all(now=2_000) == [("a", 0), ("a", 1)]
    dcache.retry_batch_target("a", 0, runner="r1", error="503 busy", not_before=2_010, now=2_001)
    retried = target("a", 0)
    assert (retried.status, retried.error, retried.runner, retried.heartbeat, retried.attempts) == (
        "pending",
        "503 busy",
        None,
        None,
        1,
    )
    assert not_before("a", 0) == 2_010
    assert (job("a").targets_done, job("a").lease, job("a").status) == (0, 2_001, "running")
    assert claim_all(now=2_009) == []  # its time has not come
    assert claim_all(now=2_010) == [("a", 0)]
    again = target("a", 0)
    assert (again.status, again.attempts, again.runner) == ("running", 2, "r1")
    assert not_before("a", 0) is None
    dcache.update_batch_targets("a", [{"idx": 0, "status": "done", "result": "ok"}], runner="r1", now=2_011)
    dcache.update_batch_targets("a", [{"idx": 1, "status": "done", "result": "ok"}], runner="r1", now=2_011)
    assert dcache.finish_batch_job("a", now=2_012) == dcache.JobStatus.DONE
    assert job("a").targets_done == 2
    assert dcache.check_store().ok


def test_a_retry_without_a_time_is_claimable_at_once(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=1), make_targets(1))
    claim_all()
    dcache.retry_batch_target("a", 0, runner="r1", error="reset", not_before=None)
    assert claim_all(runner="r2") == [("a", 0)]
    assert target("a", 0).attempts == 2


def test_a_target_given_back_untried_keeps_its_error_and_gets_its_attempt_back(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=1), make_targets(1))
    claim_all()
    dcache.retry_batch_target("a", 0, runner="r1", error="reset", not_before=None)
    claim_all(runner="r2")
    dcache.retry_batch_target("a", 0, runner="r2", error=None, not_before=None, attempted=False)
    given_back = target("a", 0)
    assert (given_back.status, given_back.attempts, given_back.error) == ("pending", 1, "reset")
    assert claim_all(runner="r3") == [("a", 0)]
    assert target("a", 0).attempts == 2
    assert dcache.check_store().ok


def test_a_job_whose_targets_all_wait_is_skipped_and_others_are_served(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=2, created_at=1), make_targets(2))
    dcache.create_batch_job(make_job("b", targets_total=1, created_at=2), make_targets(1))
    assert claim_all(limit=2) == [("a", 0), ("a", 1)]
    for idx in (0, 1):
        dcache.retry_batch_target("a", idx, runner="r1", error="later", not_before=5_000, now=2_000)
    assert claim_all(now=2_001) == [("b", 0)]
    assert claim_all(now=4_999) == []
    assert sorted(claim_all(now=5_000)) == [("a", 0), ("a", 1)]


def test_waiting_targets_count_as_pending_work(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=3, caller="alice"), make_targets(3))
    claim_all(limit=2)
    dcache.retry_batch_target("a", 0, runner="r1", error="later", not_before=9_000, now=2_000)
    load = dcache.store_load()
    assert [(c.caller, c.pending, c.running) for c in load.callers] == [("alice", 2, 1)]
    assert dcache.finish_batch_job("a") is None  # a waiting target is not final
    assert dcache.finish_complete_jobs() == 0
    assert dcache.check_store().ok


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
def test_a_retry_by_a_runner_that_lost_the_claim_writes_nothing(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=1), make_targets(1))
    claim_all(runner="r1", now=2_000)
    dcache.requeue_stale_claims(60, now=3_000)
    claim_all(runner="r2", now=3_001)
    before = snapshot()
    with pytest.raises(dcache.ClaimLost) as lost:
        dcache.retry_batch_target("a", 0, runner="r1", error="late", not_before=4_000, now=3_002)
    assert (lost.value.runner, lost.value.holder) == ("r1", "r2")
    assert snapshot() == before
    with pytest.raises(dcache.TargetNotFound):
        dcache.retry_batch_target("a", 7, runner="r2", error="x", not_before=None)
    with pytest.raises(dcache.JobNotFound):
        dcache.retry_batch_target("zz", 0, runner="r2", error="x", not_before=None)
    assert snapshot() == before


#: retry_batch_target with one bad argument, and the field it names.
BAD_RETRIES: list[tuple[str, dict[str, Any]]] = [
    ("job_id", {"job_id": ""}),
    ("idx", {"idx": -1}),
    ("idx", {"idx": "0"}),
    ("runner", {"runner": ""}),
    ("runner", {"runner": 5}),
    ("error", {"error": 5}),
    ("attempted", {"attempted": 0}),
    ("error", {"error": "x" * 100_000}),
    ("not_before", {"not_before": -5}),
    ("not_before", {"not_before": 1.5}),
    ("now", {"now": "soon"}),
]


def retry_with(arguments: dict[str, Any]) -> Callable[[], object]:
    """retry_batch_target("a", 0, runner="r1", error="e", not_before=3_000) with ``arguments`` in place."""
    call = {"job_id": "a", "idx": 0, "runner": "r1", "error": "e", "not_before": 3_000, **arguments}
    return lambda: dcache.retry_batch_target(call.pop("job_id"), call.pop("idx"), **call)


def test_retry_refuses_bad_input_naming_the_field(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=1), make_targets(1))
    claim_all()
    refuse_each((repr(arguments)[:80], retry_with(arguments), field) for field, arguments in BAD_RETRIES)


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
def test_retry_batch_targets_puts_each_back_as_retry_batch_target_does(store: Any) -> None:
    """Job "a" put back in one call, job "b" target by target with the same arguments: the same rows."""
    retries: list[dict[str, Any]] = [
        {"idx": 0, "error": "503 busy", "not_before": 2_010},
        {"idx": 2, "attempted": False},
        {"idx": 3, "error": "reset", "not_before": None, "attempted": True},
    ]
    for job_id in ("a", "b"):
        dcache.create_batch_job(make_job(job_id, targets_total=4), make_targets(4))
    claim_all(now=2_000)
    assert dcache.retry_batch_targets("a", retries, runner="r1", now=2_001) == 3
    for retry in retries:
        arguments = {"error": None, "not_before": None, **retry}
        dcache.retry_batch_target("b", arguments.pop("idx"), runner="r1", now=2_001, **arguments)

    def rows(job_id: str) -> list[tuple[Any, ...]]:
        return [
            (t.idx, t.status, t.error, t.runner, t.heartbeat, t.attempts, not_before(job_id, int(t.idx)))
            for t in dcache.batch_targets(job_id) or []
        ]

    assert rows("a") == rows("b")
    assert rows("a") == [
        (0, "pending", "503 busy", None, None, 1, 2_010),
        (1, "running", None, "r1", 2_000, 1, None),
        (2, "pending", None, None, None, 0, None),
        (3, "pending", "reset", None, None, 1, None),
    ]
    assert [(job(j).targets_done, job(j).lease, job(j).status) for j in "ab"] == [(0, 2_001, "running")] * 2
    assert dcache.retry_batch_targets("a", [], runner="r1", now=2_002) == 0
    assert job("a").lease == 2_001  # nothing put back: nothing written
    assert dcache.check_store().ok


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
def test_retry_batch_targets_refuses_the_whole_call_for_one_lost_or_missing_target(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=3), make_targets(3))
    claim_all(runner="r1", now=2_000, limit=2)
    claim_all(runner="r2", now=2_000, limit=1)
    before = snapshot()
    with pytest.raises(dcache.ClaimLost) as lost:
        dcache.retry_batch_targets("a", [{"idx": 0}, {"idx": 2}, {"idx": 1}], runner="r1", now=2_001)
    assert (lost.value.idx, lost.value.runner, lost.value.holder) == (2, "r1", "r2")
    assert snapshot() == before  # target 0, put back before, is not
    with pytest.raises(dcache.TargetNotFound) as missing:
        dcache.retry_batch_targets("a", [{"idx": 0}, {"idx": 7}], runner="r1", now=2_001)
    assert missing.value.idx == 7
    with pytest.raises(dcache.JobNotFound):
        dcache.retry_batch_targets("zz", [{"idx": 0}], runner="r1", now=2_001)
    assert snapshot() == before


#: retry_batch_targets with one bad argument, and the field it names.
BAD_BATCH_RETRIES: list[tuple[str, dict[str, Any]]] = [
    ("job_id", {"job_id": ""}),
    ("retries", {"retries": 5}),
    ("retries", {"retries": "idx"}),
    ("retries", {"retries": {"idx": 0}}),
    ("retries[1]", {"retries": [{"idx": 0}, 1]}),
    ("retries[0].idx", {"retries": [{"error": "e"}]}),
    ("retries[0].result", {"retries": [{"idx": 0, "result": "page"}]}),
    ("retries[1].result", {"retries": [{"idx": 0}, ListedKeys(idx=1, result="page")]}),
    ("retries[1].idx", {"retries": [{"idx": 0}, {"idx": -1}]}),
    ("retries[1].idx", {"retries": [{"idx": 0}, {"idx": 0}]}),
    ("retries[0].error", {"retries": [{"idx": 0, "error": 5}]}),
    ("retries[0].error", {"retries": [{"idx": 0, "error": "x" * 100_000}]}),
    ("retries[1].not_before", {"retries": [{"idx": 0}, {"idx": 1, "not_before": 1.5}]}),
    ("retries[0].attempted", {"retries": [{"idx": 0, "attempted": 0}]}),
    ("runner", {"runner": ""}),
    ("now", {"now": "soon"}),
]


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
def test_retry_batch_targets_refuses_bad_input_naming_the_field(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=2), make_targets(2))
    claim_all()

    def call(arguments: dict[str, Any]) -> Callable[[], object]:
        given = {"job_id": "a", "retries": [{"idx": 0}, {"idx": 1}], "runner": "r1", **arguments}
        return lambda: dcache.retry_batch_targets(given.pop("job_id"), given.pop("retries"), **given)

    refuse_each((repr(arguments)[:80], call(arguments), field) for field, arguments in BAD_BATCH_RETRIES)


def finished_partial_job() -> None:
    """Job "a" of 4 targets: two done (results "ok", "fine"), two failed (one holding a result), partial."""
    dcache.create_batch_job(make_job("a", targets_total=4), make_targets(4))
    claim_all()
    writes = [
        {"idx": 0, "status": "done", "result": "ok"},
        {"idx": 1, "status": "failed", "error": "404", "hint": "gone", "result": "body"},
        {"idx": 2, "status": "done", "result": "fine"},
        {"idx": 3, "status": "failed", "error": "boom"},
    ]
    dcache.update_batch_targets("a", writes, runner="r1", now=2_001)
    assert dcache.finish_batch_job("a", now=2_002) == dcache.JobStatus.PARTIAL


def test_retry_failed_targets_reopens_them_counted_once(store: Any) -> None:
    finished_partial_job()
    assert (job("a").targets_done, job("a").nbytes) == (4, len("okbodyfine"))
    assert dcache.retry_failed_targets("a", now=3_000) == 2
    reopened = [
        (t.idx, t.status, t.result, t.error, t.hint, t.attempts) for t in dcache.batch_targets("a") or []
    ]
    assert reopened == [
        (0, "done", "ok", None, None, 1),
        (1, "pending", None, None, None, 1),
        (2, "done", "fine", None, None, 1),
        (3, "pending", None, None, None, 1),
    ]
    assert (job("a").status, job("a").targets_done, job("a").nbytes, job("a").lease) == (
        "running",
        2,
        len("okfine"),
        3_000,
    )
    assert dcache.batch_nbytes() == len("okfine")
    assert dcache.check_store().ok
    assert dcache.retry_failed_targets("a", now=3_001) == 0  # none failed now: counted once
    assert job("a").targets_done == 2
    assert sorted(claim_all(runner="r2", now=3_002)) == [("a", 1), ("a", 3)]
    dcache.update_batch_targets(
        "a", [{"idx": 1, "status": "done", "result": "x"}, {"idx": 3, "status": "done"}], runner="r2"
    )
    assert dcache.finish_complete_jobs(now=3_005) == 1
    assert (job("a").status, job("a").targets_done) == ("done", 4)
    assert dcache.check_store().ok


def test_retry_failed_targets_reopens_a_failed_job(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=1), make_targets(1))
    claim_all()
    dcache.update_batch_targets("a", [{"idx": 0, "status": "failed", "error": "e"}], runner="r1")
    assert dcache.finish_batch_job("a") == dcache.JobStatus.FAILED
    assert dcache.retry_failed_targets("a") == 1
    assert (job("a").status, job("a").targets_done, job("a").error) == ("running", 0, "")
    assert claim_all(runner="r2") == [("a", 0)]


def test_retry_failed_targets_refuses_a_cancelled_job_and_an_unknown_one(store: Any) -> None:
    finished_partial_job()
    dcache.set_batch_job_status("a", "cancelled", "stopped by its caller")
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as refused:
        dcache.retry_failed_targets("a")
    assert refused.value.field == "job_id"
    assert "cancelled" in str(refused.value)
    with pytest.raises(dcache.JobNotFound):
        dcache.retry_failed_targets("nope")
    with pytest.raises(dcache.InvalidBatchInput) as bad:
        dcache.retry_failed_targets("a", now=-1)
    assert bad.value.field == "now"
    with pytest.raises(dcache.InvalidBatchInput) as empty:
        dcache.retry_failed_targets("")
    assert empty.value.field == "job_id"
    assert snapshot() == before


@pytest.mark.parametrize("left", ["a target left", "finished already"])
def test_finishing_a_job_that_is_not_complete_reads_once_and_writes_nothing(
    store: Any, monkeypatch: pytest.MonkeyPatch, left: str
) -> None:
    """A runner finishes a job after each of its writes, and most find targets left: one read, then no
    write transaction (nor, on PostgreSQL, a lock on the job's row, which its writers wait for)."""
    dcache.create_batch_job(make_job("a", targets_total=2), make_targets(2))
    dcache.update_batch_target("a", 0, "done", result="x", now=2_000)
    if left == "finished already":
        dcache.update_batch_target("a", 1, "failed", error="e", now=2_000)
        assert dcache.finish_batch_job("a", now=2_001) == dcache.JobStatus.PARTIAL
    before = snapshot()
    seen = count_statements(monkeypatch)
    assert dcache.finish_batch_job("a", now=2_002) is None
    assert len(seen) == 1 and "batch_job" in seen[0], seen
    assert snapshot() == before
    with pytest.raises(dcache.JobNotFound):  # no job at all: refused, as a write of it is
        dcache.finish_batch_job("gone", now=2_002)
    assert snapshot() == before


def test_finish_complete_jobs_finishes_what_a_dead_writer_left(store: Any) -> None:
    dcache.create_batch_job(make_job("done", targets_total=2, created_at=1), make_targets(2))
    dcache.create_batch_job(make_job("failed", targets_total=1, created_at=2), make_targets(1))
    dcache.create_batch_job(make_job("open", targets_total=2, created_at=3), make_targets(2))
    claim_all()
    dcache.update_batch_targets("done", [{"idx": 0, "status": "done"}, {"idx": 1, "status": "done"}])
    dcache.update_batch_targets("failed", [{"idx": 0, "status": "failed", "error": "e"}])
    dcache.update_batch_targets("open", [{"idx": 0, "status": "done"}])
    # their writer died before finish_batch_job: the jobs are running, every target final
    assert (job("done").status, job("failed").status) == ("running", "running")
    assert dcache.finish_complete_jobs(now=5_000) == 2
    assert [(job(j).status, job(j).lease) for j in ("done", "failed")] == [("done", 5_000), ("failed", 5_000)]
    assert job("open").status == "running"
    assert dcache.finish_complete_jobs(now=5_001) == 0
    with pytest.raises(dcache.InvalidBatchInput) as bad:
        dcache.finish_complete_jobs(now="later")  # type: ignore[arg-type]
    assert bad.value.field == "now"


def test_a_claim_moves_due_targets_back_once_each(store: Any) -> None:
    """Due targets leave the waiting ones (not_before cleared) in the claim that comes after their time;
    the others keep waiting, and a claim with nothing due moves nothing."""
    dcache.create_batch_job(make_job("a", targets_total=6), make_targets(6))
    claim_all()
    for idx in range(6):
        dcache.retry_batch_target("a", idx, runner="r1", error="e", not_before=3_000 + idx, now=2_500)
    assert dcache.claim_batch_targets(1, runner="r2", now=3_002)[0].idx == 0
    assert [not_before("a", idx) for idx in range(6)] == [None, None, None, 3_003, 3_004, 3_005]
    assert [t.idx for t in dcache.claim_batch_targets(10, runner="r2", now=3_002)] == [1, 2]


# -- The upgrade from version 6 ---------------------------------------------------------------------------

V6_HOST_INDEX = "CREATE INDEX batch_target_host ON batch_target(job_id, host, idx) WHERE status = 'pending'"


def test_a_version_6_file_is_upgraded_and_its_targets_claimable(tmp_path: Path) -> None:
    path = tmp_path / "v6.db"
    dcache.open_db(path)
    dcache.create_batch_job(make_job("a", targets_total=2), make_targets(2))
    dcache.close_db()
    with sqlite3.connect(path) as conn:  # as version 6 left it
        conn.execute("DROP INDEX batch_target_delayed")
        conn.execute("DROP INDEX batch_target_host")
        conn.execute("DROP INDEX batch_target_pending_host")
        conn.execute("ALTER TABLE batch_target DROP COLUMN not_before")
        conn.execute(V6_HOST_INDEX)
        conn.execute("PRAGMA user_version = 6")
    conn.close()
    dcache.open_db(path, readonly=True)  # read as it is
    assert [t.idx for t in dcache.batch_targets("a") or []] == [0, 1]
    dcache.open_db(path)
    try:
        assert db.execute_sql("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        index = db.execute_sql("SELECT sql FROM sqlite_master WHERE name = 'batch_target_host'").fetchone()[0]
        assert index.endswith("WHERE status = 'pending' AND not_before IS NULL")
        assert claim_all() == [("a", 0), ("a", 1)]
        dcache.retry_batch_target("a", 1, runner="r1", error="e", not_before=2_100, now=2_000)
        assert claim_all(now=2_100) == [("a", 1)]
        assert dcache.check_store().ok
    finally:
        dcache.close_db()


@pytest.mark.postgres
def test_a_version_6_postgres_store_is_upgraded(postgres_schema: str) -> None:
    schema = f"{postgres_schema}_v6"
    drop_schema(schema)
    target_url = postgres_target(schema)
    try:
        dcache.open_db(target_url)
        dcache.create_batch_job(make_job("a", targets_total=2), make_targets(2))
        dcache.close_db()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"SET search_path = {schema}")
            conn.execute("ALTER TABLE batch_target DROP COLUMN not_before")  # and the indexes on it
            conn.execute(
                'CREATE INDEX batch_target_host ON batch_target(job_id, host COLLATE "C", idx) '
                "WHERE status = 'pending'"
            )
            conn.execute("UPDATE sift_schema SET version = 6")
        dcache.open_db(target_url, readonly=True)
        assert [t.idx for t in dcache.batch_targets("a") or []] == [0, 1]
        dcache.open_db(target_url)
        assert db.execute_sql("SELECT version FROM sift_schema").fetchone()[0] == SCHEMA_VERSION
        definition = db.execute_sql(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "AND indexname = 'batch_target_host'"
        ).fetchone()[0]
        assert "not_before IS NULL" in definition
        assert claim_all() == [("a", 0), ("a", 1)]
        dcache.retry_batch_target("a", 1, runner="r1", error="e", not_before=2_100, now=2_000)
        assert claim_all(now=2_099) == []
        assert claim_all(now=2_100) == [("a", 1)]
        assert dcache.check_store().ok
    finally:
        dcache.close_db()
        drop_schema(schema)
