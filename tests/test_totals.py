"""Rule 8: batch_nbytes sums nbytes over every job; live_batch_jobs counts queued and running jobs."""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from helpers import job_with_bytes, make_job, make_targets, stored_job

from sift import dcache

STATUSES = ["queued", "running", "done", "partial", "failed", "cancelled"]


def column_sum() -> int:
    return int(dcache.db.execute_sql("SELECT COALESCE(SUM(nbytes), 0) FROM batch_job").fetchone()[0])


def test_empty_store_holds_zero_bytes(store: Any) -> None:
    assert dcache.batch_nbytes() == 0


def test_total_over_every_job_whatever_its_status(store: Any) -> None:
    for i, status in enumerate(STATUSES):
        job_with_bytes(f"job-{status}", 10**i, status=status)
    assert dcache.batch_nbytes() == 111_111
    dcache.create_batch_job(make_job("zero"))
    assert dcache.batch_nbytes() == 111_111


def test_total_follows_every_kind_of_write(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=3, lease=10), make_targets(3))
    dcache.create_batch_job(make_job("b", targets_total=2, lease=20, status="running"), make_targets(2))
    job_with_bytes("c", 1_000, lease=5, status="done")
    assert dcache.batch_nbytes() == 1_000
    dcache.update_batch_target("a", 0, "done", result="héllo", now=10)
    assert dcache.batch_nbytes() == 1_006
    dcache.update_batch_target("a", 0, "done", result="hi", now=10)
    assert dcache.batch_nbytes() == 1_002
    dcache.update_batch_target("b", 1, "failed", result="😀😀", now=20)
    assert dcache.batch_nbytes() == 1_010
    dcache.update_batch_target("b", 1, "failed", now=20)
    assert dcache.batch_nbytes() == 1_002
    dcache.update_batch_target("b", 0, "done", result="x" * 50, now=20)
    assert dcache.batch_nbytes() == 1_052 == column_sum()
    dcache.set_batch_job_status("a", "done", now=30)
    assert dcache.evict_batch_oldest(1_000) == 1  # c (lease 5) goes
    assert dcache.batch_nbytes() == 52 == column_sum()
    dcache.mark_in_flight_failed("restart", now=40)
    assert dcache.batch_nbytes() == 52
    assert dcache.sweep_batch(10, now=45) == 1  # a (lease 30) goes
    assert dcache.batch_nbytes() == 50 == column_sum()
    assert dcache.sweep_batch(0, now=45) == 1
    assert dcache.batch_nbytes() == 0 == column_sum()


def test_failed_writes_leave_the_total(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=2), make_targets(2))
    dcache.update_batch_target("a", 0, "done", result="abc", now=1)
    with pytest.raises(dcache.InvalidBatchInput):
        dcache.update_batch_target("a", 0, "running", now=2)
    with pytest.raises(dcache.DuplicateJob):
        dcache.create_batch_job(make_job("a"))
    with pytest.raises(dcache.InvalidBatchInput):
        dcache.create_batch_job(make_job("b"), make_targets(1, start=5))
    with pytest.raises(dcache.InvalidBatchInput):
        dcache.create_batch_job(make_job("b", nbytes=99))
    assert dcache.batch_nbytes() == 3 == column_sum()


def test_large_totals(store: Any) -> None:
    """Byte counts no result could reach, set by SQL: the running total holds them exactly."""
    stored_job(make_job("a"), nbytes=2**62)
    stored_job(make_job("b"), nbytes=2**62 - 1)
    assert dcache.batch_nbytes() == 2**63 - 1


@pytest.mark.parametrize("status", STATUSES)
def test_live_counts_by_status(store: Any, status: str) -> None:
    dcache.create_batch_job(make_job("job-1", status=status))
    live = int(status in ("queued", "running"))
    assert dcache.live_batch_jobs("alice") == live
    assert dcache.live_batch_jobs_total() == live
    assert dcache.live_batch_jobs("bob") == 0


def test_live_counts_per_caller_and_total(store: Any) -> None:
    layout = {
        "alice": ["queued", "running", "running", "done"],
        "bob": ["queued", "failed"],
        "carol": ["partial"],
    }
    for caller, statuses in layout.items():
        for i, status in enumerate(statuses):
            dcache.create_batch_job(make_job(f"{caller}-{i}", caller=caller, status=status))
    assert dcache.live_batch_jobs("alice") == 3
    assert dcache.live_batch_jobs("bob") == 1
    assert dcache.live_batch_jobs("carol") == 0
    assert dcache.live_batch_jobs("nobody") == 0
    assert dcache.live_batch_jobs("Alice") == 0
    assert dcache.live_batch_jobs_total() == 4
    dcache.set_batch_job_status("alice-1", "done", now=5)
    dcache.set_batch_job_status("carol-0", "running", now=5)
    assert dcache.live_batch_jobs("alice") == 2
    assert dcache.live_batch_jobs("carol") == 1
    assert dcache.live_batch_jobs_total() == 4


def test_live_counts_ignore_caller_class(store: Any) -> None:
    dcache.create_batch_job(make_job("a", caller_class="fleet"))
    dcache.create_batch_job(make_job("b", caller_class="restricted"))
    assert dcache.live_batch_jobs("alice") == 2
    assert dcache.live_batch_jobs_total() == 2


@pytest.mark.sqlite_only  # INSERT OR REPLACE with recursive triggers
def test_replace_by_another_writer_keeps_the_total(store: dcache.SerializedSqliteDatabase) -> None:
    job_with_bytes("a", 100, status="done")
    job_with_bytes("b", 200, status="done")
    row = {
        **dcache.BatchJob.get_by_id("a").__data__,
        "nbytes": 50,
    }  # another writer's SQL (the models refuse)
    columns, marks = ", ".join(row), ", ".join("?" * len(row))
    dcache.db.execute_sql(
        f"INSERT OR REPLACE INTO batch_job ({columns}) VALUES ({marks})", tuple(row.values())
    )
    assert dcache.batch_nbytes() == 250
    assert dcache.evict_batch_oldest(250) == 0


def test_a_total_that_drifted_is_left_to_check_repair(file_store: Path) -> None:
    """Opening reads no job row, so it cannot see a drifted total: check_store finds it and mends it."""
    dcache.create_batch_job(make_job("a", targets_total=1), make_targets(1))
    dcache.update_batch_target("a", 0, "done", result="x" * 100, now=5)
    dcache.close_db()
    with closing(sqlite3.connect(file_store)) as conn, conn:  # a writer without recursive triggers
        conn.execute("INSERT OR REPLACE INTO batch_job SELECT * FROM batch_job")
        assert conn.execute("SELECT nbytes FROM batch_totals").fetchone() == (200,)
    dcache.open_db(file_store)
    assert dcache.batch_nbytes() == 200
    report = dcache.check_store(repair=True)
    assert [v.kind for v in report.violations] == ["total"]
    assert dcache.batch_nbytes() == 100
    assert dcache.check_store().ok


def test_a_missing_total_row_is_rebuilt_at_open(file_store: Path) -> None:
    job_with_bytes("a", 100, status="done")
    dcache.close_db()
    with closing(sqlite3.connect(file_store)) as conn, conn:
        conn.execute("DELETE FROM batch_totals")
    dcache.open_db(file_store)
    assert dcache.batch_nbytes() == 100


def test_open_reads_no_job_or_target_row(file_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What keeps opening O(1) in the size of the store (the bench measures it): only the schema and the
    total's row are read."""
    dcache.create_batch_job(make_job("a", targets_total=2), make_targets(2))
    dcache.close_db()
    seen: list[str] = []
    original = dcache.SerializedSqliteDatabase.execute_sql

    def logged(self: Any, sql: str, params: Any = None) -> Any:
        seen.append(sql)
        return original(self, sql, params)

    monkeypatch.setattr(dcache.SerializedSqliteDatabase, "execute_sql", logged)
    dcache.open_db(file_store)
    assert seen, "open_db ran no statement through execute_sql: this test no longer watches it"
    assert [sql for sql in seen if re.search(r"\bFROM\s+batch_(job|target)\b", sql, re.I)] == []
