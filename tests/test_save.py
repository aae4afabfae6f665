"""A Peewee ``save()`` of a model instance writes only the fields the caller set (``only_save_dirty``).

A shell user reads a job, a runner writes a result, then the user saves a status change: the counters
the runner moved must survive, as a second connection sees them.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from freezegun import freeze_time
from helpers import make_job, make_targets

from sift import dcache
from sift.dcache import BatchJob, BatchTarget


def stored_job(path: Path, job_id: str) -> tuple[str, int, int, int]:
    with closing(sqlite3.connect(path)) as conn:
        row = conn.execute(
            "SELECT status, targets_done, nbytes, lease FROM batch_job WHERE id = ?", (job_id,)
        ).fetchone()
        total = conn.execute("SELECT nbytes FROM batch_totals").fetchone()[0]
    assert total == row[2]
    return row  # type: ignore[no-any-return]


def test_stale_save_keeps_the_counts_a_result_moved(file_store: Path) -> None:
    dcache.create_batch_job(make_job("j", targets_total=2, lease=100), make_targets(2))
    job = BatchJob.get_by_id("j")
    dcache.update_batch_target("j", 0, "done", result="x" * 2_000, now=200)  # between read and save
    job.status = "cancelled"
    with freeze_time("2030-01-01"):
        job.save()  # a status change moves the lease to now, as set_batch_job_status does
        assert stored_job(file_store, "j") == ("cancelled", 1, 2_000, dcache.unix_now())


def test_a_lease_set_explicitly_is_saved(file_store: Path) -> None:
    dcache.create_batch_job(make_job("j", targets_total=2, lease=100), make_targets(2))
    job = BatchJob.get_by_id("j")
    dcache.update_batch_target("j", 0, "done", result="abc", now=200)
    job.lease = 1
    job.save()
    assert stored_job(file_store, "j") == ("queued", 1, 3, 1)


@pytest.mark.parametrize("field", ["targets_done", "nbytes"])
def test_a_count_set_by_hand_is_refused(file_store: Path, field: str) -> None:
    dcache.create_batch_job(make_job("j", targets_total=2, lease=100), make_targets(2))
    job = BatchJob.get_by_id("j")
    dcache.update_batch_target("j", 0, "done", result="abc", now=200)
    setattr(job, field, 1)
    with pytest.raises(dcache.ModelWriteRefused) as info:
        job.save()
    assert info.value.field == field and "update_batch_target" in str(info.value)
    assert stored_job(file_store, "j") == ("queued", 1, 3, 200)


def test_save_without_changes_writes_nothing(file_store: Path) -> None:
    dcache.create_batch_job(make_job("j", targets_total=1, lease=100), make_targets(1))
    job = BatchJob.get_by_id("j")
    dcache.update_batch_target("j", 0, "done", result="abc", now=200)
    assert job.save() is False
    assert stored_job(file_store, "j") == ("queued", 1, 3, 200)


def test_stale_target_save_keeps_the_result(file_store: Path) -> None:
    dcache.create_batch_job(make_job("j", targets_total=1), make_targets(1))
    target = BatchTarget.get((BatchTarget.job_id == "j") & (BatchTarget.idx == 0))
    dcache.update_batch_target("j", 0, "done", result="kept", now=200)
    target.hint = "checked by hand"
    target.save()
    with closing(sqlite3.connect(file_store)) as conn:
        row = conn.execute("SELECT status, result, hint FROM batch_target WHERE job_id = 'j'").fetchone()
    assert row == ("done", "kept", "checked by hand")
    assert stored_job(file_store, "j")[1:3] == (1, 4)
