"""Rule 5: sweep deletes every job, whatever its status, whose lease + ttl <= now, with its targets."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from helpers import create_partial, make_job, make_targets

from sift import dcache
from sift.dcache import manager
from sift.dcache.manager import JOBS_PER_TRANSACTION, ROWS_PER_TRANSACTION

STATUSES = ["queued", "running", "done", "partial", "failed", "cancelled"]


def job_ids() -> set[str]:
    return {row[0] for row in dcache.db.execute_sql("SELECT id FROM batch_job").fetchall()}


def target_job_ids() -> set[str]:
    return {row[0] for row in dcache.db.execute_sql("SELECT DISTINCT job_id FROM batch_target").fetchall()}


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize(("now", "swept"), [(1_099, False), (1_100, True), (1_101, True), (0, False)])
def test_boundary_and_every_status(store: Any, status: str, now: int, swept: bool) -> None:
    dcache.create_batch_job(make_job("job-1", status=status, lease=1_000), make_targets(3))
    assert dcache.sweep_batch(100, now=now) == int(swept)
    assert (dcache.batch_job("job-1") is None) == swept
    assert (dcache.batch_targets("job-1") is None) == swept
    assert target_job_ids() == (set() if swept else {"job-1"})


@pytest.mark.parametrize(
    ("ttl", "now", "swept"),
    [
        (0, 999, False),
        (0, 1_000, True),
        (0.5, 1_000, False),
        (0.5, 1_001, True),
        (99.5, 1_099, False),
        (99.5, 1_100, True),
        (timedelta(0), 1_000, True),
        (timedelta(seconds=100), 1_099, False),
        (timedelta(seconds=100), 1_100, True),
        (timedelta(milliseconds=1), 1_000, False),
        (timedelta(seconds=99, microseconds=999_999), 1_100, True),
        (timedelta(seconds=100, microseconds=1), 1_100, False),
        (timedelta(seconds=100, microseconds=1), 1_101, True),
        (timedelta(hours=1), 4_599, False),
        (timedelta(hours=1), 4_600, True),
    ],
)
def test_ttl_forms(store: Any, ttl: Any, now: int, swept: bool) -> None:
    create_partial(make_job("job-1", lease=1_000), make_targets(2))
    assert dcache.sweep_batch(ttl, now=now) == int(swept)
    assert job_ids() == (set() if swept else {"job-1"})


def test_sweep_deletes_exactly_the_due_jobs_and_their_targets(store: Any) -> None:
    for i, status in enumerate(STATUSES):
        dcache.create_batch_job(make_job(f"due-{status}", status=status, lease=900 + i), make_targets(3))
        create_partial(make_job(f"kept-{status}", status=status, lease=1_001 + i), make_targets(2))
    dcache.update_batch_target("due-done", 0, "done", result="abcdef", now=950)
    dcache.update_batch_target("kept-done", 0, "done", result="xyz", now=1_050)
    dcache.create_batch_job(make_job("no-targets", lease=0))
    assert dcache.batch_nbytes() == 9
    assert dcache.sweep_batch(100, now=1_100) == 7
    assert job_ids() == {f"kept-{s}" for s in STATUSES}
    assert target_job_ids() == {f"kept-{s}" for s in STATUSES}
    count = dcache.db.execute_sql("SELECT COUNT(*) FROM batch_target").fetchone()[0]
    assert count == 2 * len(STATUSES)
    assert dcache.batch_nbytes() == 3
    assert dcache.stats()["jobs_swept"] == 7
    # Nothing more is due: a second sweep deletes nothing.
    assert dcache.sweep_batch(100, now=1_100) == 0


def test_sweep_uses_the_sliding_lease(store: Any) -> None:
    create_partial(make_job("job-1", lease=1_000), make_targets(2))
    dcache.update_batch_target("job-1", 0, "running", now=1_080)
    assert dcache.sweep_batch(100, now=1_100) == 0
    dcache.touch_batch_job("job-1", now=1_090)
    assert dcache.sweep_batch(100, now=1_189) == 0
    assert dcache.sweep_batch(100, now=1_190) == 1


def test_sweep_of_an_empty_store(store: Any) -> None:
    assert dcache.sweep_batch(0, now=0) == 0
    assert dcache.sweep_batch(timedelta(0), now=2**62) == 0


@pytest.mark.slow
def test_sweep_in_many_chunks_deletes_everything_due(store: Any) -> None:
    """More due jobs than one transaction takes, and more due rows, plus one job bigger than a chunk."""
    due_jobs = JOBS_PER_TRANSACTION * 2 + 37
    per_job = 8
    assert due_jobs * (per_job + 1) > 2 * ROWS_PER_TRANSACTION
    for i in range(due_jobs):
        lease = 500 + i % 7  # many jobs share a lease
        dcache.create_batch_job(
            make_job(f"due-{i:04d}", lease=lease, targets_total=per_job), make_targets(per_job)
        )
        if i % 50 == 0:
            create_partial(make_job(f"kept-{i:04d}", lease=1_000), make_targets(2))
    big = ROWS_PER_TRANSACTION + 500
    dcache.create_batch_job(make_job("due-big", lease=0, targets_total=big), make_targets(big))
    kept = {f"kept-{i:04d}" for i in range(0, due_jobs, 50)}
    assert dcache.sweep_batch(100, now=999) == due_jobs + 1
    assert job_ids() == kept
    assert target_job_ids() == kept
    assert dcache.stats()["jobs_swept"] == due_jobs + 1


@pytest.mark.parametrize("status", STATUSES)
def test_sweep_leaves_other_rows_untouched(store: Any, status: str) -> None:
    dcache.create_batch_job(make_job("gone", lease=10, status=status), make_targets(3))
    dcache.create_batch_job(make_job("stays", lease=500, status=status), make_targets(3))
    dcache.update_batch_target("stays", 0, "done", result="four", now=500)
    dcache.update_batch_target("stays", 1, "done", result="é", now=500)
    before = _rows()
    assert dcache.sweep_batch(10, now=100) == 1
    after = _rows()
    assert after["batch_job"] == [r for r in before["batch_job"] if r[0] != "gone"]
    assert after["batch_target"] == [r for r in before["batch_target"] if r[0] != "gone"]


def _rows() -> dict[str, list[tuple[Any, ...]]]:
    return {
        t: dcache.db.execute_sql(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
        for t in ("batch_job", "batch_target")
    }


def test_counter_grows_after_each_chunk(
    store: dcache.SerializedSqliteDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3 * JOBS_PER_TRANSACTION):
        dcache.create_batch_job(make_job(f"j{i:04}", targets_total=0, lease=10))
    seen: list[int] = []
    delete = manager._delete_jobs

    def recording(rows: list[Any]) -> int:
        seen.append(dcache.stats()["jobs_swept"])
        return delete(rows)

    monkeypatch.setattr(manager, "_delete_jobs", recording)
    assert dcache.sweep_batch(0, now=10) == 3 * JOBS_PER_TRANSACTION
    assert seen[:3] == [0, JOBS_PER_TRANSACTION, 2 * JOBS_PER_TRANSACTION]  # then one empty chunk
    assert dcache.stats()["jobs_swept"] == 3 * JOBS_PER_TRANSACTION
