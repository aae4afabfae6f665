"""sweep_candidates and evict_candidates name exactly the jobs the real call removes, and write nothing."""

from __future__ import annotations

import pytest
from helpers import job_with_bytes, snapshot

from sift import dcache

# (id, status, lease, created_at, nbytes)
JOBS = [
    ("a", "done", 100, 5, 10),
    ("b", "failed", 100, 4, 20),
    ("c", "queued", 50, 1, 0),
    ("d", "partial", 300, 1, 30),
    ("e", "running", 40, 1, 40),
    ("f", "cancelled", 100, 4, 5),
    ("g", "done", 90, 9, 0),
]


def fill() -> None:
    for job_id, status, lease, created_at, nbytes in JOBS:
        job_with_bytes(job_id, nbytes, status=status, lease=lease, created_at=created_at)


def remaining() -> set[str]:
    return {job.id for job in dcache.BatchJob.select(dcache.BatchJob.id)}


@pytest.mark.parametrize("now", [0, 139, 140, 150, 340, 10_000])
def test_sweep_candidates_are_what_sweep_deletes(store: dcache.SerializedSqliteDatabase, now: int) -> None:
    fill()
    before = snapshot()
    candidates = dcache.sweep_candidates(40, now=now)
    assert snapshot() == before
    assert [job.lease for job in candidates] == sorted(job.lease for job in candidates)
    ids = {job.id for job in candidates}
    assert dcache.sweep_batch(40, now=now) == len(ids)
    assert remaining() == {j[0] for j in JOBS} - ids


@pytest.mark.parametrize("max_bytes", [0, 14, 15, 50, 60, 65, 104, 105, 1_000])
def test_evict_candidates_are_what_evict_removes(
    store: dcache.SerializedSqliteDatabase, max_bytes: int
) -> None:
    fill()
    before = snapshot()
    candidates = [job.id for job in dcache.evict_candidates(max_bytes)]
    assert snapshot() == before
    assert dcache.evict_batch_oldest(max_bytes) == len(candidates)
    assert remaining() == {j[0] for j in JOBS} - set(candidates)


def test_evict_candidates_order(store: dcache.SerializedSqliteDatabase) -> None:
    fill()
    # lease, then created_at, then id; queued, running and 0-byte jobs never
    assert [job.id for job in dcache.evict_candidates(0)] == ["b", "f", "a", "d"]
    assert [job.id for job in dcache.evict_candidates(105 - 25)] == ["b", "f"]


def test_candidates_reject_bad_input(store: dcache.SerializedSqliteDatabase) -> None:
    with pytest.raises(dcache.InvalidBatchInput, match=r"^max_bytes: "):
        dcache.evict_candidates(-1)
    with pytest.raises(dcache.InvalidBatchInput, match=r"^ttl: "):
        dcache.sweep_candidates(-1, now=5)
