"""check_store: every invariant, on a WAL file corrupted the way a foreign writer would; repair fixes what is
derived, and a second check is clean."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
from contextlib import closing
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest
from helpers import make_job, make_targets, snapshot

from sift import dcache
from sift.dcache import integrity as check
from sift.dcache import reports
from sift.dcache.backends.sqlite import SerializedSqliteDatabase
from sift.dcache.reports import Repair, Violation

# check_store reads SQLite files only, so far.
pytestmark = pytest.mark.sqlite_only


def foreign(path: Path, *statements: str) -> None:
    """Run statements as another program would: its own connection, recursive triggers off (the default)."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        assert conn.execute("PRAGMA recursive_triggers").fetchone() == (0,)
        for statement in statements:
            conn.execute(statement)


def fill() -> None:
    """Three jobs through the package: non-ASCII results, so bytes and characters differ."""
    dcache.create_batch_job(make_job("job-a", targets_total=3), make_targets(3))
    dcache.update_batch_target("job-a", 0, "done", result="héllo", now=1_000)  # 6 bytes
    dcache.update_batch_target("job-a", 1, "failed", result="😀", error="x", now=1_000)  # 4 bytes
    dcache.create_batch_job(make_job("job-b", targets_total=2), make_targets(2))
    dcache.update_batch_target("job-b", 1, "done", result="ok", now=1_000)
    dcache.create_batch_job(make_job("job-c", targets_total=1), make_targets(1))


def found(report: dcache.StoreReport) -> set[tuple[str, str | None]]:
    return {(v.kind, v.job_id) for v in report.violations}


#: name: (statements of the foreign writer, what check must name)
REPAIRABLE: dict[str, tuple[list[str], set[tuple[str, str | None]]]] = {
    "insert_or_replace": (
        ["INSERT OR REPLACE INTO batch_job SELECT * FROM batch_job WHERE id = 'job-a'"],
        {("total", None)},
    ),
    "update_targets_done": (
        ["UPDATE batch_job SET targets_done = 3 WHERE id = 'job-a'"],
        {("targets_done", "job-a")},
    ),
    "update_nbytes": (["UPDATE batch_job SET nbytes = 2 WHERE id = 'job-a'"], {("nbytes", "job-a")}),
    "deleted_job": (["DELETE FROM batch_job WHERE id = 'job-b'"], {("orphan_targets", "job-b")}),
    "dropped_trigger": (
        [
            "DROP TRIGGER batch_totals_update",
            # then a write that keeps the job's own counts right, but no longer the total
            "UPDATE batch_target SET status = 'done', result = 'xyz' WHERE job_id = 'job-c'",
            "UPDATE batch_job SET targets_done = 1, nbytes = 3 WHERE id = 'job-c'",
        ],
        {("schema", None), ("total", None)},
    ),
    "missing_total_row": (["DELETE FROM batch_totals"], {("total", None)}),
    # the claims' index of running targets: without it, renewals and releases read every target
    "dropped_running_index": (["DROP INDEX batch_target_running"], {("schema", None)}),
}

UNREPAIRABLE: dict[str, tuple[list[str], set[tuple[str, str | None]]]] = {
    "job_status": (
        ["UPDATE batch_job SET status = 'finished' WHERE id = 'job-c'"],
        {("job_status", "job-c")},
    ),
    "target_status": (
        ["UPDATE batch_target SET status = 'ok' WHERE job_id = 'job-c'"],
        {("target_status", "job-c")},
    ),
    "idx_too_large": (
        ["UPDATE batch_target SET idx = 3 WHERE job_id = 'job-a' AND idx = 2"],
        {("target_idx", "job-a")},
    ),
    "idx_negative": (
        ["UPDATE batch_target SET idx = -1 WHERE job_id = 'job-b' AND idx = 0"],
        {("target_idx", "job-b")},
    ),
    "idx_text": (
        ["UPDATE batch_target SET idx = 'two' WHERE job_id = 'job-a' AND idx = 2"],
        {("target_idx", "job-a")},
    ),
}


def test_a_store_written_by_the_package_is_clean(store: Any) -> None:
    fill()
    dcache.set_batch_job_status("job-a", "done", now=2_000)
    dcache.sweep_batch(0, now=1_500)  # removes job-b and job-c (lease 1,000)
    report = dcache.check_store()
    assert report.ok and report.violations == [] and report.repairs == []
    assert (report.jobs, report.targets) == (1, 3)


def test_an_empty_store_is_clean(store: Any) -> None:
    assert dcache.check_store().as_dict() == {
        "ok": True,
        "jobs": 0,
        "targets": 0,
        "violations": [],
        "repairs": [],
    }


@pytest.mark.parametrize("name", list(REPAIRABLE))
def test_check_names_and_repair_fixes(file_store: Path, name: str) -> None:
    fill()
    statements, expected = REPAIRABLE[name]
    foreign(file_store, *statements)
    before = snapshot()
    report = dcache.check_store()
    assert found(report) == expected and not report.ok
    assert snapshot() == before  # checking changes nothing
    repaired = dcache.check_store(repair=True)
    assert found(repaired) == expected
    assert {(r.kind, r.job_id) for r in repaired.repairs} >= {v for v in expected if v[0] != "schema"}
    again = dcache.check_store()
    assert again.ok, again
    assert again.repairs == []


@pytest.mark.parametrize("name", list(UNREPAIRABLE))
def test_check_names_what_repair_leaves_to_a_person(file_store: Path, name: str) -> None:
    fill()
    statements, expected = UNREPAIRABLE[name]
    foreign(file_store, *statements)
    before = snapshot()
    report = dcache.check_store(repair=True)
    assert found(report) == expected
    assert report.repairs == []
    assert snapshot() == before
    assert found(dcache.check_store()) == expected


def test_every_corruption_at_once_is_named(file_store: Path) -> None:
    fill()  # job-a: 2 final targets, 10 bytes; job-b: 1 and 2; job-c: none; total 12
    dcache.create_batch_job(make_job("job-d", targets_total=2), make_targets(2))
    foreign(
        file_store,
        "UPDATE batch_job SET targets_done = 3 WHERE id = 'job-a'",
        "UPDATE batch_job SET nbytes = 99 WHERE id = 'job-d'",  # the trigger follows: total 111
        "DELETE FROM batch_job WHERE id = 'job-b'",  # total 109
        "UPDATE batch_job SET status = 'weird' WHERE id = 'job-c'",
        "UPDATE batch_target SET idx = 5 WHERE job_id = 'job-d' AND idx = 1",
        "DROP TRIGGER batch_totals_insert",
        "INSERT INTO batch_job SELECT 'job-e', caller, caller_class, idem_key, 'done', error, targets_total, "
        "targets_done, created_at, lease, 7 FROM batch_job WHERE id = 'job-c'",  # not counted: 109
    )
    report = dcache.check_store()
    assert [str(v) for v in report.violations] == [
        "schema: batch_totals_insert is missing",
        "total: batch_totals holds 109, but SUM(nbytes) is 116",
        "targets_done (job 'job-a'): targets_done is 3, but 2 targets are done or failed",
        "job_status (job 'job-c'): status 'weird' is not one of "
        "queued, running, done, partial, failed, cancelled",
        "nbytes (job 'job-d'): nbytes is 99, but its results hold 0 bytes (UTF-8)",
        "target_idx (job 'job-d'): target idx outside 0..1 (targets_total - 1): 5",
        "nbytes (job 'job-e'): nbytes is 7, but its results hold 0 bytes (UTF-8)",
        "missing_targets (job 'job-e'): holds 0 of its 1 targets more than 3600 s after it was created: "
        "it can never finish (put_batch_targets the rest, or delete it)",
        "orphan_targets (job 'job-b'): 2 targets without their job",
    ]
    assert (report.jobs, report.targets) == (4, 8)
    repaired = dcache.check_store(repair=True)
    assert repaired.violations == report.violations
    assert [str(r) for r in repaired.repairs] == [
        "schema: created batch_totals_insert",
        "targets_done (job 'job-a'): 3 -> 2",
        "nbytes (job 'job-d'): 99 -> 0",  # with the triggers: total 10
        "nbytes (job 'job-e'): 7 -> 0",  # total 3
        "orphan_targets (job 'job-b'): deleted 2 targets",
        "total: 3 -> 10",
    ]
    left = dcache.check_store()
    assert found(left) == {("job_status", "job-c"), ("target_idx", "job-d"), ("missing_targets", "job-e")}
    assert dcache.batch_nbytes() == 10
    foreign(  # a job of 5 bytes inserted whole, as only a foreign writer can: the recreated trigger counts it
        file_store,
        "INSERT INTO batch_job SELECT 'job-f', caller, caller_class, idem_key, status, error, targets_total, "
        "targets_done, created_at, lease, 5 FROM batch_job WHERE id = 'job-a'",
    )
    assert dcache.batch_nbytes() == 15
    assert json.loads(json.dumps(repaired.as_dict()))["repairs"][1] == {
        "kind": "targets_done",
        "job_id": "job-a",
        "detail": "3 -> 2",
    }


def test_chunks_cover_every_id_once(file_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks: list[object] = []

    class CountedChunk(check._Chunk):
        def __init__(self, low: Any, high: Any) -> None:
            chunks.append((low, high))
            super().__init__(low, high)

    monkeypatch.setattr(check, "JOBS_PER_CHUNK", 2)
    monkeypatch.setattr(check, "_Chunk", CountedChunk)
    for i in range(1, 8):
        dcache.create_batch_job(make_job(f"job-{i}", targets_total=2), make_targets(2))
    # orphans before the first id, between two chunks, inside one, and after the last id
    orphans = ["a-first", "job-2x", "job-3x", "zz-last"]
    foreign(
        file_store,
        *(
            "INSERT INTO batch_target (job_id, idx, url, options, status, result, error, hint) "
            f"VALUES ('{o}', 0, 'u', '{{}}', 'pending', NULL, NULL, NULL)"
            for o in orphans
        ),
        "UPDATE batch_job SET targets_done = 1 WHERE id IN ('job-2', 'job-3', 'job-7')",
    )
    progress: list[int] = []
    report = dcache.check_store(progress=progress.append)
    assert chunks == [(None, "job-2"), ("job-2", "job-4"), ("job-4", "job-6"), ("job-6", None)]
    assert progress == [2, 2, 2, 1]  # jobs read by each chunk
    assert (report.jobs, report.targets) == (7, 18)
    assert sorted((v.kind, v.job_id) for v in report.violations) == sorted(
        [("orphan_targets", o) for o in orphans] + [("targets_done", f"job-{i}") for i in (2, 3, 7)]
    )
    dcache.check_store(repair=True)
    assert dcache.check_store().ok


def test_a_damaged_file_is_reported_and_never_repaired(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path)
    fill()
    dcache.close_db()
    with closing(sqlite3.connect(path)) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'batch_job_lease'").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    with path.open("r+b") as f:  # the index page's cell count
        f.seek((root - 1) * page_size + 3)
        f.write(b"\xff\xff")
    dcache.open_db(path)
    try:
        before = snapshot()
        report = dcache.check_store(repair=True)
        assert [v.kind for v in report.violations] == ["quick_check"]
        assert f"Page {root}" in report.violations[0].detail
        assert report.repairs == []
        assert snapshot() == before
    finally:
        dcache.close_db()


def test_check_inside_a_transaction_reads_it(store: Any) -> None:
    fill()
    with dcache.db.atomic():
        dcache.db.execute_sql("UPDATE batch_job SET targets_done = 0 WHERE id = 'job-a'")
        assert found(dcache.check_store()) == {("targets_done", "job-a")}
        assert [str(r) for r in dcache.check_store(repair=True).repairs] == [
            "targets_done (job 'job-a'): 0 -> 2"
        ]
    assert dcache.check_store().ok


def test_details_count_in_words(store: Any) -> None:
    dcache.create_batch_job(make_job("one", targets_total=2), make_targets(2))
    dcache.update_batch_target("one", 0, "done", now=1)
    dcache.db.execute_sql("UPDATE batch_job SET targets_done = 2")
    dcache.db.execute_sql("UPDATE batch_target SET status = 'odd' WHERE idx = 1")
    assert [v.detail for v in dcache.check_store().violations] == [
        "targets_done is 2, but 1 target is done or failed",
        "1 target with a status not in pending, running, done, failed: 'odd'",
    ]


def test_check_needs_an_open_store() -> None:
    dcache.close_db()
    dcache.db.init(None)
    with pytest.raises(dcache.StoreNotOpen):
        dcache.check_store()


def test_public_names() -> None:
    assert dcache.check_store is check.check_store
    assert dcache.StoreReport is reports.StoreReport
    assert {"check_store", "StoreReport"} <= set(dcache.__all__)
    assert Violation("nbytes", "j", "x").__str__() == "nbytes (job 'j'): x"
    assert str(Repair("total", None, "1 -> 2")) == "total: 1 -> 2"


def _writer(path: str, jobs: int, targets: int, ready: Event) -> None:
    """Another process writing results through the package, job after job, as fast as it can."""
    dcache.open_db(path)
    ready.set()
    for j in range(jobs):
        for idx in range(targets):
            dcache.update_batch_target(f"job-{j:04d}", idx, "done", result="é" * (idx + 1), now=2_000)
    dcache.close_db()


@pytest.mark.slow
def test_no_false_alarm_while_another_process_writes(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each chunk reads its jobs and their targets in one snapshot, so a write landing between the two
    reads is never taken for a broken count."""
    jobs, targets = 300, 10
    for j in range(jobs):
        dcache.create_batch_job(make_job(f"job-{j:04d}", targets_total=targets), make_targets(targets))
    monkeypatch.setattr(check, "JOBS_PER_CHUNK", 3)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_writer, args=(str(file_store), jobs, targets, ready))
    child.start()
    try:
        assert ready.wait(60)
        checks = 0
        while child.is_alive():
            report = dcache.check_store()
            assert report.ok, report
            checks += 1
    finally:
        child.join(60)
    assert child.exitcode == 0
    assert checks >= 1
    final = dcache.check_store()
    assert final.ok and (final.jobs, final.targets) == (jobs, jobs * targets)
    assert dcache.batch_nbytes() == jobs * sum(2 * (idx + 1) for idx in range(targets))


@pytest.mark.parametrize(
    ("sql", "params", "index"),
    [
        (
            check._statements(SerializedSqliteDatabase).target_groups.format(
                where="job_id > ? AND job_id <= ?"
            ),
            ("a", "b"),
            "batch_target",
        ),
        (
            check._statements(SerializedSqliteDatabase).target_groups.format(where="job_id > ?"),
            ("a",),
            "batch_target",
        ),
        (
            check._statements(SerializedSqliteDatabase).jobs.format(where="id > ? AND id <= ?"),
            ("a", "b"),
            "batch_job",
        ),
        ("SELECT id FROM batch_job WHERE id > ? ORDER BY id LIMIT 1 OFFSET ?", ("a", 499), "batch_job"),
        (
            "SELECT job_id FROM batch_target WHERE job_id > ? ORDER BY job_id LIMIT 1 OFFSET ?",
            ("a", 9),
            "batch_target",
        ),
    ],
)
def test_a_chunk_searches_the_primary_keys(store: Any, sql: str, params: tuple[str, ...], index: str) -> None:
    """A chunk reads its range of ids through the primary key indexes, in their order: no scan, no sort."""
    plan = [row[3] for row in dcache.db.execute_sql(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()]
    assert len(plan) == 1 and plan[0].startswith(f"SEARCH {index} USING ")
    assert f"INDEX sqlite_autoindex_{index}_1 (" in plan[0]


def test_whole_file_reads_take_no_lock_on_a_file_store(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The integrity check and the byte total read the whole file: on a file they run on a private
    connection, so the app's threads never wait for them; in memory there is only the shared one."""
    fill()
    shared: list[str] = []
    run_sql = dcache.db.run_sql

    def recording(sql: str, params: Any) -> Any:
        shared.append(sql)
        return run_sql(sql, params)

    monkeypatch.setattr(dcache.db.obj, "run_sql", recording)
    assert dcache.check_store().ok
    whole_file = [sql for sql in shared if "quick_check" in sql or "SUM(nbytes)" in sql]
    assert len(whole_file) == (2 if dcache.db.database == ":memory:" else 0)
    assert any("FROM batch_target" in sql for sql in shared)  # the chunks do use the shared connection


def test_chunks_of_big_jobs_are_bounded_by_targets(file_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk ends early when its jobs have many targets; one job bigger than that is a chunk of its own."""
    chunks: list[object] = []

    class CountedChunk(check._Chunk):
        def __init__(self, low: Any, high: Any) -> None:
            chunks.append((low, high))
            super().__init__(low, high)

    monkeypatch.setattr(check, "TARGETS_PER_CHUNK", 5)
    monkeypatch.setattr(check, "_Chunk", CountedChunk)
    for i, n in enumerate((2, 2, 2, 9, 1), start=1):
        dcache.create_batch_job(make_job(f"job-{i}", targets_total=n), make_targets(n))
    report = dcache.check_store()
    assert report.ok and (report.jobs, report.targets) == (5, 16)
    assert chunks == [(None, "job-3"), ("job-3", "job-4"), ("job-4", None)]
