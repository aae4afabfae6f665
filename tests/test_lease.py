"""Rule 1: the sliding lease. Writes set it to their ``now``; create and put leave it; reads never write."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from helpers import TargetWriter, create_partial, job_with_bytes, make_job, make_targets, snapshot

from sift import dcache


def lease(job_id: str) -> int:
    job = dcache.batch_job(job_id)
    assert job is not None
    return int(job.lease)


def leases() -> dict[str, int]:
    return dict(dcache.db.execute_sql("SELECT id, lease FROM batch_job").fetchall())


def total_changes() -> int:
    """Rows changed on the store's connection since it opened, triggers included (SQLite's count)."""
    return int(dcache.db.execute_sql("SELECT total_changes()").fetchone()[0])


def writes_of(call: Callable[[], object]) -> object:
    """Whether ``call`` wrote: SQLite's total_changes() moved, or PostgreSQL gave its transaction an id
    (which it does at a transaction's first write)."""
    if not isinstance(dcache.db.backend, dcache.SerializedSqliteDatabase):
        with dcache.db.atomic():
            call()
            return dcache.db.execute_sql("SELECT pg_current_xact_id_if_assigned()").fetchone()[0]
    changes = total_changes()
    call()
    return total_changes() - changes


def setup_jobs() -> None:
    dcache.create_batch_job(make_job("job-1", lease=1_000, created_at=900), make_targets(3))
    create_partial(make_job("job-2", lease=1_500, created_at=950, status="running"), make_targets(2))
    dcache.create_batch_job(make_job("job-3", lease=700, created_at=700, status="done"))


def test_create_stores_the_lease_as_given(store: Any) -> None:
    dcache.create_batch_job(make_job("a", lease=123, created_at=999_999))
    dcache.create_batch_job(make_job("b", lease=0, created_at=0), make_targets(3))
    dcache.create_batch_job(make_job("c", lease=2**63 - 1, created_at=5))
    assert leases() == {"a": 123, "b": 0, "c": 2**63 - 1}


def test_put_leaves_the_lease(store: Any) -> None:
    dcache.create_batch_job(make_job("job-1", lease=1_234, targets_total=5))
    dcache.put_batch_targets("job-1", make_targets(2))
    dcache.put_batch_targets("job-1", make_targets(3, start=2))
    assert lease("job-1") == 1_234


@pytest.mark.parametrize("now", [5_000, 1_000, 999, 0])
@pytest.mark.parametrize(
    "write",
    [
        lambda now: dcache.update_batch_target("job-1", 0, "running", now=now),
        lambda now: dcache.update_batch_target("job-1", 0, "pending", now=now),
        lambda now: dcache.update_batch_target("job-1", 1, "done", result="r", now=now),
        lambda now: dcache.update_batch_target("job-1", 2, "failed", error="e", hint="h", now=now),
        lambda now: dcache.update_batch_targets(
            "job-1", [{"idx": 1, "status": "done", "result": "r"}, {"idx": 2, "status": "failed"}], now=now
        ),
        lambda now: dcache.set_batch_job_status("job-1", "running", now=now),
        lambda now: dcache.set_batch_job_status("job-1", "cancelled", "stop", now=now),
        lambda now: dcache.touch_batch_job("job-1", now=now),
    ],
    ids=[
        "update-running",
        "update-pending",
        "update-done",
        "update-failed",
        "update-many",
        "set-status-running",
        "set-status-cancelled",
        "touch",
    ],
)
def test_write_sets_the_lease_to_now(store: Any, write: Callable[[int], None], now: int) -> None:
    """Exactly ``now``, even when it is earlier than the stored lease; no other job moves."""
    setup_jobs()
    before = leases()
    write(now)
    assert leases() == {**before, "job-1": now}


def test_lease_follows_each_write_in_turn(store: Any, write: TargetWriter) -> None:
    setup_jobs()
    write("job-1", 0, "running", now=2_000)
    assert lease("job-1") == 2_000
    write("job-1", 0, "done", result="x", now=2_001)
    assert lease("job-1") == 2_001
    write("job-1", 0, "done", result="y", now=2_001)
    assert lease("job-1") == 2_001
    dcache.touch_batch_job("job-1", now=3_000)
    assert lease("job-1") == 3_000
    dcache.set_batch_job_status("job-1", "done", now=2_500)
    assert lease("job-1") == 2_500
    dcache.put_batch_targets("job-3", [])
    assert leases() == {"job-1": 2_500, "job-2": 1_500, "job-3": 700}


def test_mark_in_flight_failed_sets_the_lease_of_the_jobs_it_marks(store: Any) -> None:
    setup_jobs()
    assert dcache.mark_in_flight_failed("restart", now=4_000) == 2
    # job-1 (queued) and job-2 (running) are marked; job-3 (done) keeps its lease.
    assert leases() == {"job-1": 4_000, "job-2": 4_000, "job-3": 700}


def test_rejected_writes_leave_the_lease(store: Any, write: TargetWriter) -> None:
    setup_jobs()
    write("job-1", 0, "done", result="x", now=1_100)
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput):
        write("job-1", 0, "pending", now=9_000)
    with pytest.raises(dcache.InvalidBatchInput):
        dcache.set_batch_job_status("job-1", "bogus", now=9_000)
    with pytest.raises(dcache.TargetNotFound):
        write("job-3", 0, "done", now=9_000)
    with pytest.raises(dcache.JobNotFound):
        dcache.touch_batch_job("nope", now=9_000)
    assert snapshot() == before
    assert lease("job-1") == 1_100


READS: list[tuple[str, Callable[[], object]]] = [
    ("batch_job-hit", lambda: dcache.batch_job("job-1")),
    ("batch_job-miss", lambda: dcache.batch_job("nope")),
    ("batch_targets-hit", lambda: dcache.batch_targets("job-1")),
    ("batch_targets-empty", lambda: dcache.batch_targets("job-3")),
    ("batch_targets-miss", lambda: dcache.batch_targets("nope")),
    ("batch_job_by_idem-hit", lambda: dcache.batch_job_by_idem("alice", "key", 100, now=1_050)),
    (
        "batch_job_by_idem-timedelta-default-now",
        lambda: dcache.batch_job_by_idem("alice", "key", timedelta(hours=1)),
    ),
    ("batch_job_by_idem-expired", lambda: dcache.batch_job_by_idem("alice", "key", 10, now=5_000)),
    ("batch_job_by_idem-miss", lambda: dcache.batch_job_by_idem("alice", "other", 100, now=1_050)),
    ("batch_job_by_idem-empty-key", lambda: dcache.batch_job_by_idem("alice", "", 100, now=1_050)),
    ("live_batch_jobs", lambda: dcache.live_batch_jobs("alice")),
    ("live_batch_jobs-unknown", lambda: dcache.live_batch_jobs("nobody")),
    ("live_batch_jobs_total", lambda: dcache.live_batch_jobs_total()),
    ("batch_nbytes", lambda: dcache.batch_nbytes()),
]


@pytest.mark.parametrize("read", [r for _, r in READS], ids=[name for name, _ in READS])
def test_reads_never_write(store: Any, read: Callable[[], object], write: TargetWriter) -> None:
    dcache.create_batch_job(make_job("job-1", idem_key="key", lease=1_000), make_targets(3))
    write("job-1", 1, "done", result="abc", now=1_000)
    create_partial(make_job("job-2", status="running", lease=800), make_targets(2))
    job_with_bytes("job-3", 5, status="done", lease=600)
    before = snapshot()
    assert writes_of(lambda: (read(), read())) in (0, None)
    assert snapshot() == before
