"""Rule 6: the byte budget. Evict whole finished jobs holding bytes: oldest lease, created_at, then id."""

from __future__ import annotations

import random
from typing import Any

import pytest
from helpers import job_with_bytes, make_job, stored_job

from sift import dcache
from sift.dcache import manager
from sift.dcache.manager import JOBS_PER_TRANSACTION, ROWS_PER_TRANSACTION

FINISHED = ["done", "partial", "failed", "cancelled"]
ACTIVE = ["queued", "running"]


def job_ids() -> set[str]:
    return {row[0] for row in dcache.db.execute_sql("SELECT id FROM batch_job").fetchall()}


def target_job_ids() -> set[str]:
    return {row[0] for row in dcache.db.execute_sql("SELECT DISTINCT job_id FROM batch_target").fetchall()}


# (id, lease, created_at) in eviction order: lease first, then created_at, then id.
ORDER = [
    ("z", 1, 9),
    ("m", 2, 1),
    ("b", 2, 5),
    ("c", 2, 5),
    ("c0", 2, 5),
    ("a", 3, 0),
    ("job-10", 4, 4),
    ("job-9", 4, 4),
]


@pytest.mark.parametrize("seed", range(3))
def test_order_is_lease_then_created_at_then_id(store: Any, seed: int) -> None:
    shuffled = ORDER[:]
    random.Random(seed).shuffle(shuffled)
    for job_id, lease, created_at in shuffled:
        job_with_bytes(job_id, 10, lease=lease, created_at=created_at)
    total = 10 * len(ORDER)
    for k in range(1, len(ORDER) + 1):
        assert dcache.evict_batch_oldest(total - 10 * k) == 1
        assert job_ids() == {job_id for job_id, _, _ in ORDER[k:]}
        assert dcache.batch_nbytes() == total - 10 * k


def test_whole_order_in_one_call(store: Any) -> None:
    for job_id, lease, created_at in reversed(ORDER):
        job_with_bytes(job_id, 10, lease=lease, created_at=created_at)
    assert dcache.evict_batch_oldest(25) == len(ORDER) - 2
    assert job_ids() == {"job-10", "job-9"}
    assert dcache.evict_batch_oldest(10) == 1
    assert job_ids() == {"job-9"}


@pytest.mark.parametrize(
    ("max_bytes", "evicted", "left"),
    [
        (60, 0, {"a", "b", "c"}),
        (1_000, 0, {"a", "b", "c"}),
        (59, 1, {"b", "c"}),
        (50, 1, {"b", "c"}),
        (49, 2, {"c"}),
        (45, 2, {"c"}),
        (30, 2, {"c"}),
        (29, 3, set()),
        (0, 3, set()),
    ],
)
def test_stops_as_soon_as_total_is_within_budget(
    store: Any, max_bytes: int, evicted: int, left: set[str]
) -> None:
    job_with_bytes("a", 10, lease=1)
    job_with_bytes("b", 20, lease=2)
    job_with_bytes("c", 30, lease=3)
    assert dcache.evict_batch_oldest(max_bytes) == evicted
    assert job_ids() == left
    assert dcache.batch_nbytes() == sum({"a": 10, "b": 20, "c": 30}[j] for j in left)


@pytest.mark.parametrize("status", FINISHED)
def test_every_finished_status_is_evictable(store: Any, status: str) -> None:
    job_with_bytes("job-1", 5, status=status)
    assert dcache.evict_batch_oldest(4) == 1
    assert job_ids() == set()


@pytest.mark.parametrize("status", ACTIVE)
def test_active_jobs_are_never_evicted(store: Any, status: str) -> None:
    job_with_bytes("active-old", 100, status=status, lease=1)
    job_with_bytes("done-new", 10, lease=50)
    job_with_bytes("done-newer", 10, lease=60)
    assert dcache.evict_batch_oldest(100) == 2
    assert job_ids() == {"active-old"}
    assert target_job_ids() == {"active-old"}
    assert dcache.batch_nbytes() == 100
    assert dcache.evict_batch_oldest(0) == 0
    assert job_ids() == {"active-old"}


def test_active_jobs_over_budget_evicts_every_finished_job_with_bytes_and_returns(store: Any) -> None:
    job_with_bytes("queued", 60, status="queued", lease=5)
    job_with_bytes("running", 60, status="running", lease=6)
    job_with_bytes("f1", 1, lease=9)
    job_with_bytes("f2", 2, status="failed", lease=8)
    job_with_bytes("f3", 3, status="cancelled", lease=7)
    job_with_bytes("f4", 4, status="partial", lease=10)
    job_with_bytes("empty", 0, lease=1)
    assert dcache.evict_batch_oldest(100) == 4
    assert job_ids() == {"queued", "running", "empty"}
    assert dcache.batch_nbytes() == 120
    stats = dcache.stats()
    assert (stats["jobs_evicted"], stats["bytes_evicted"]) == (4, 10)


def test_zero_byte_jobs_are_not_evicted(store: Any) -> None:
    for i, status in enumerate(FINISHED):
        job_with_bytes(f"empty-{status}", 0, status=status, lease=i)
    job_with_bytes("full", 7, lease=100)
    assert dcache.evict_batch_oldest(0) == 1
    assert job_ids() == {f"empty-{s}" for s in FINISHED}
    assert dcache.evict_batch_oldest(0) == 0
    assert job_ids() == {f"empty-{s}" for s in FINISHED}


def test_a_job_that_went_back_to_zero_bytes_is_not_evicted(store: Any) -> None:
    job_with_bytes("emptied", 5, lease=1)
    dcache.update_batch_target("emptied", 0, "failed", error="gone", now=1)
    job_with_bytes("full", 5, lease=2)
    assert dcache.evict_batch_oldest(0) == 1
    assert job_ids() == {"emptied"}


def test_targets_go_with_the_job(store: Any) -> None:
    job_with_bytes("old", 5, lease=1)
    job_with_bytes("new", 5, lease=2)
    assert dcache.evict_batch_oldest(5) == 1
    assert dcache.batch_targets("old") is None
    assert target_job_ids() == {"new"}
    new_targets = dcache.batch_targets("new")
    assert new_targets is not None and len(new_targets) == 2


def test_within_budget_evicts_nothing(store: Any) -> None:
    assert dcache.evict_batch_oldest(0) == 0
    job_with_bytes("job-1", 5)
    assert dcache.evict_batch_oldest(5) == 0
    assert dcache.evict_batch_oldest(2**63 - 1) == 0
    assert job_ids() == {"job-1"}


def test_jobs_holding_nbytes_no_target_backs_are_evicted_by_it(store: Any) -> None:
    """Eviction goes by each job's nbytes as stored, even when no target backs it (a damaged store)."""
    stored_job(make_job("given", status="done", lease=1), nbytes=50)
    stored_job(make_job("live", status="queued", lease=0), nbytes=50)
    assert dcache.evict_batch_oldest(60) == 1
    assert job_ids() == {"live"}


@pytest.mark.slow
def test_eviction_in_many_chunks(store: Any) -> None:
    """More evictable jobs than one transaction takes, and more rows, all evicted in one call."""
    count = JOBS_PER_TRANSACTION * 2 + 11
    per_job = 8
    assert count * (per_job + 1) > 2 * ROWS_PER_TRANSACTION
    for i in range(count):
        job_with_bytes(f"j{i:04d}", 3, status="done", lease=i, targets_total=per_job)
    big = ROWS_PER_TRANSACTION + 100
    job_with_bytes("big", 1, status="failed", lease=0, targets_total=big)
    # newest and live hold no targets (no target row may be left): their bytes are set by SQL
    stored_job(make_job("newest", status="done", lease=10**6), nbytes=3)
    stored_job(make_job("live", status="running", lease=0), nbytes=3)
    assert dcache.evict_batch_oldest(6) == count + 1
    assert job_ids() == {"newest", "live"}
    assert target_job_ids() == set()
    assert dcache.batch_nbytes() == 6
    stats = dcache.stats()
    assert (stats["jobs_evicted"], stats["bytes_evicted"]) == (count + 1, 3 * count + 1)


@pytest.mark.slow
def test_counters_grow_after_each_chunk(
    store: dcache.SerializedSqliteDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3 * JOBS_PER_TRANSACTION):  # jobs of no target: their bytes are set by SQL
        stored_job(make_job(f"j{i:04}", status="done", targets_total=0, lease=10), nbytes=2)
    seen: list[tuple[int, int]] = []
    delete = manager._delete_jobs

    def recording(rows: list[Any]) -> int:
        seen.append((dcache.stats()["jobs_evicted"], dcache.stats()["bytes_evicted"]))
        return delete(rows)

    monkeypatch.setattr(manager, "_delete_jobs", recording)
    assert dcache.evict_batch_oldest(0) == 3 * JOBS_PER_TRANSACTION
    n = JOBS_PER_TRANSACTION
    assert seen == [(0, 0), (n, 2 * n), (2 * n, 4 * n)]
