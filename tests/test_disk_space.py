"""Disk space follows the data: a new store has incremental auto-vacuum, sweeps and evictions give the
free pages back in bounded steps, and ``vacuum_store`` converts an older file once.

Sizes and page counts are compared, never times; the lock holds are measured by the bench
(``python scripts/bench``).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import snapshot
from space_helpers import fill, old_store

from sift import dcache
from sift.dcache import manager, space
from sift.dcache.backends.sqlite.schema import BASE_SCHEMA


def file_size(path: Path) -> int:
    dcache.db.checkpoint(truncate=True)  # the file shrinks when the log is copied
    return os.path.getsize(path)


def pragma(name: str) -> int:
    return int(dcache.db.execute_sql(f"PRAGMA {name}").fetchone()[0])


def test_a_new_store_has_incremental_auto_vacuum(file_store: Path) -> None:
    assert pragma("auto_vacuum") == space.INCREMENTAL == 2
    with closing(sqlite3.connect(file_store)) as other:  # in the file itself, not the connection
        assert other.execute("PRAGMA auto_vacuum").fetchone() == (2,)
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_an_existing_file_keeps_its_auto_vacuum(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with closing(sqlite3.connect(path)) as old:
        for statement in BASE_SCHEMA:
            old.execute(statement)
    dcache.open_db(path)
    try:
        assert pragma("auto_vacuum") == 0
    finally:
        dcache.close_db()


@pytest.mark.parametrize(
    "remove",
    [
        lambda: dcache.sweep_batch(10, now=2_000),
        lambda: dcache.evict_batch_oldest(dcache.batch_nbytes() // 10),
    ],
    ids=["sweep", "evict"],
)
def test_the_file_shrinks_after_most_jobs_go(file_store: Path, remove: Callable[[], int]) -> None:
    fill(90, prefix="old", lease=1_000)
    fill(10, prefix="new", lease=10**6)
    full = file_size(file_store)
    assert full > 3_000_000
    assert remove() == 90
    assert pragma("freelist_count") == 0
    assert file_size(file_store) < full * 0.2
    assert dcache.db.execute_sql("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert len(dcache.batch_targets("new-9") or []) == 10


@contextmanager
def statements_per_transaction() -> Iterator[list[list[str]]]:
    """The statements run on the store's connection, grouped by transaction."""
    transactions: list[list[str]] = [[]]

    def trace(sql: str) -> None:
        transactions[-1].append(sql)
        if sql in ("COMMIT", "ROLLBACK"):
            transactions.append([])

    conn: sqlite3.Connection = dcache.db.connection()
    conn.set_trace_callback(trace)
    try:
        yield transactions
    finally:
        conn.set_trace_callback(None)


@pytest.mark.slow
def test_each_chunk_gives_back_a_bounded_number_of_pages(file_store: Path) -> None:
    fill(60, prefix="old", targets=50, lease=1_000)
    free_before = pragma("freelist_count")
    with statements_per_transaction() as transactions:
        assert dcache.sweep_batch(10, now=2_000) == 60
    steps = [sum(sql == "PRAGMA incremental_vacuum" for sql in t) for t in transactions]
    assert max(steps) == space.FREED_PAGES_PER_STEP  # never more pages in one transaction
    assert sum(steps) > 2 * space.FREED_PAGES_PER_STEP  # so the sweep took several steps
    assert pragma("freelist_count") == free_before == 0


@pytest.mark.slow
def test_big_results_never_leave_a_long_free_list(file_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk of big results frees more pages than one step gives back: the rest goes in transactions
    of their own before the next chunk, so every chunk starts on an empty free list (moving a page
    searches the free list, so a long one makes every step slow)."""
    fill(30, prefix="old", targets=60, lease=1_000, result="b" * 5_000)  # a chunk of 8 jobs frees ~600 pages
    free_at_each_chunk: list[int] = []
    delete_jobs = manager._delete_jobs

    def spy(rows: list[Any]) -> int:
        free_at_each_chunk.append(pragma("freelist_count"))
        return delete_jobs(rows)

    monkeypatch.setattr(manager, "_delete_jobs", spy)
    with statements_per_transaction() as transactions:
        assert dcache.sweep_batch(10, now=2_000) == 30
    assert len(free_at_each_chunk) > 3 and set(free_at_each_chunk) == {0}
    steps = [sum(sql == "PRAGMA incremental_vacuum" for sql in t) for t in transactions]
    assert max(steps) == space.FREED_PAGES_PER_STEP
    reclaim_only = [
        t for t, n in zip(transactions, steps, strict=True) if n and not any("DELETE" in q for q in t)
    ]
    assert reclaim_only  # the pages beyond the chunk's own step went in transactions of their own
    assert pragma("freelist_count") == 0


def test_store_space_reads_sqlites_own_figures(file_store: Path) -> None:
    fill(20)
    dcache.db.execute_sql("DELETE FROM batch_target WHERE job_id != 'job-0'")  # leaves free pages
    found = dcache.store_space()
    assert found.page_size == pragma("page_size")
    assert found.page_count == pragma("page_count")
    assert found.free_pages == pragma("freelist_count") > 10
    assert found.reclaimable_bytes == found.free_pages * found.page_size
    assert found.live_bytes == (found.page_count - found.free_pages) * found.page_size
    assert found.auto_vacuum == 2


def test_sweeps_leave_an_old_file_as_it_was_and_vacuum_converts_it_once(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old_store(path)
    try:
        assert pragma("auto_vacuum") == 0
        free = pragma("freelist_count")
        assert free > 100  # SQLite cannot give them back without a rewrite
        big = file_size(path)
        rows = snapshot()
        done = dcache.vacuum_store()
        assert done.converted
        assert done.before.free_pages == free and done.before.auto_vacuum == 0
        assert done.after.free_pages == 0 and done.after.auto_vacuum == 2
        assert pragma("auto_vacuum") == 2
        assert file_size(path) < big / 3
        assert snapshot() == rows
        again = dcache.vacuum_store()
        assert not again.converted and again.before.free_pages == 0
        fill(30, prefix="later", lease=1_000)
        dcache.sweep_batch(10, now=2_000)
        assert pragma("freelist_count") == 0  # from now on, sweeps give space back themselves
        assert dcache.db.execute_sql("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        dcache.close_db()


def test_vacuum_gives_back_free_pages_of_an_incremental_store(file_store: Path) -> None:
    fill(60)
    dcache.db.execute_sql("DELETE FROM batch_target WHERE job_id != 'job-0'")  # not through a sweep
    free = pragma("freelist_count")
    assert free > 2 * space.FREED_PAGES_PER_STEP
    big = file_size(file_store)
    done = dcache.vacuum_store()
    assert not done.converted
    assert (done.before.free_pages, done.after.free_pages) == (free, 0)
    assert file_size(file_store) <= big - free * done.before.page_size


def test_vacuum_on_a_read_only_store_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old_store(path)
    dcache.close_db()
    before = path.read_bytes()
    dcache.open_db(path, readonly=True)
    try:
        with pytest.raises(dcache.StoreReadOnly, match="read-only"):
            dcache.vacuum_store()
    finally:
        dcache.close_db()
    assert path.read_bytes() == before
