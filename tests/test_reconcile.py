"""Rule 7: restart reconciliation. Every queued or running job becomes failed, error = reason, lease = now."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import create_partial, make_job, make_targets

from sift import dcache

STATUSES = ["queued", "running", "done", "partial", "failed", "cancelled"]


def jobs() -> dict[str, tuple[Any, ...]]:
    rows = dcache.db.execute_sql(
        "SELECT id, status, error, lease, targets_done, nbytes, created_at FROM batch_job"
    ).fetchall()
    return {row[0]: row[1:] for row in rows}


@pytest.mark.parametrize("status", STATUSES)
def test_each_status(store: Any, status: str) -> None:
    dcache.create_batch_job(make_job("job-1", status=status, error="before", lease=100, created_at=50))
    marked = status in ("queued", "running")
    assert dcache.mark_in_flight_failed("restarted", now=5_000) == int(marked)
    expected = ("failed", "restarted", 5_000) if marked else (status, "before", 100)
    assert jobs()["job-1"][:3] == expected


def test_marks_every_live_job_and_nothing_else(store: Any) -> None:
    for i, status in enumerate(STATUSES):
        for caller in ("alice", "bob"):
            job_id = f"{caller}-{status}"
            dcache.create_batch_job(
                make_job(job_id, caller=caller, status=status, lease=100 + i), make_targets(3)
            )
            if i:  # i result bytes, written at the job's lease
                dcache.update_batch_target(job_id, 2, "done", result="x" * i, now=100 + i)
    dcache.update_batch_target("alice-running", 0, "done", result="abc", now=200)
    before = jobs()
    targets_before = dcache.db.execute_sql("SELECT * FROM batch_target ORDER BY 1, 2").fetchall()
    assert dcache.live_batch_jobs_total() == 4
    assert dcache.mark_in_flight_failed("worker restarted: état perdu", now=9_000) == 4
    after = jobs()
    for job_id, row in before.items():
        if job_id.endswith(("-queued", "-running")):
            assert after[job_id] == ("failed", "worker restarted: état perdu", 9_000, *row[3:])
        else:
            assert after[job_id] == row
    assert dcache.db.execute_sql("SELECT * FROM batch_target ORDER BY 1, 2").fetchall() == targets_before
    assert dcache.live_batch_jobs_total() == 0
    assert dcache.live_batch_jobs("alice") == 0
    assert dcache.stats()["jobs_marked_failed"] == 4


def test_second_call_marks_nothing(store: Any) -> None:
    dcache.create_batch_job(make_job("a", status="queued"))
    dcache.create_batch_job(make_job("b", status="running"))
    assert dcache.mark_in_flight_failed("first", now=10) == 2
    assert dcache.mark_in_flight_failed("second", now=20) == 0
    assert jobs()["a"][:3] == ("failed", "first", 10)
    assert jobs()["b"][:3] == ("failed", "first", 10)
    assert dcache.stats()["jobs_marked_failed"] == 2


def test_empty_store(store: Any) -> None:
    assert dcache.mark_in_flight_failed("nothing", now=1) == 0


def test_marked_jobs_leave_idempotency_and_become_evictable(store: Any) -> None:
    create_partial(make_job("job-1", idem_key="k", status="running", lease=100), make_targets(1))
    dcache.update_batch_target("job-1", 0, "done", result="xyz", now=100)
    assert dcache.batch_job_by_idem("alice", "k", 1_000, now=150) == "job-1"
    assert dcache.evict_batch_oldest(0) == 0
    dcache.mark_in_flight_failed("restart", now=150)
    assert dcache.batch_job_by_idem("alice", "k", 1_000, now=150) is None
    assert dcache.evict_batch_oldest(0) == 1
