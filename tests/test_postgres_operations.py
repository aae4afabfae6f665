"""Operating a PostgreSQL store: backup_store writes a SQLite store file from one snapshot (row for row,
options verbatim, insertion order kept), relation_space and vacuum_relations give the server's space."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import POSTGRES_URL
from helpers import (
    assert_target_still_waits,
    make_job,
    make_target,
    make_targets,
    one_of_two_targets_waiting,
    run_on_file,
    snapshot,
)
from test_backup import Writers
from test_postgres import make_version_1, make_version_3

from sift import dcache
from sift.dcache import backup
from sift.dcache.tables import CLAIM_COLUMNS, SCHEMA_VERSION
from sift.dcache.tables import JOB_COLUMN_LIST as JOB_COLUMNS
from sift.dcache.tables import TARGET_COLUMN_LIST as TARGET_COLUMNS

#: A target's columns and its claim's, as the backup copies them.
CLAIMED_TARGET_COLUMNS = ", ".join((TARGET_COLUMNS, *CLAIM_COLUMNS))

pytestmark = pytest.mark.postgres

BIG = 2**63 - 1


@pytest.fixture
def pg(pg_target: str) -> Iterator[str]:
    """A store of the test's own, open; yields its target."""
    dcache.open_db(pg_target)
    yield pg_target
    dcache.close_db()


def fill() -> None:
    """Jobs as varied as the columns allow: every status, NULLs, non-ASCII text, JSON text with odd spacing,
    the largest integers, ties in created_at inserted against id order, and a claimed target."""
    dcache.create_batch_job(
        make_job("job-z", created_at=BIG, lease=BIG, targets_total=2, idem_key="k"),
        [make_target(i, options='{ "b" : [1, 2.50,  {}],"a":"\\u00e9" }') for i in range(2)],
    )
    dcache.create_batch_job(make_job("job-a", created_at=BIG, lease=BIG - 5, idem_key="k"), make_targets(3))
    dcache.create_batch_job(
        make_job("tie-z", created_at=5_000, lease=5_000, idem_key="t", targets_total=1), make_targets(1)
    )
    dcache.create_batch_job(
        make_job("tie-a", created_at=5_000, lease=5_000, idem_key="t", targets_total=1), make_targets(1)
    )
    dcache.update_batch_target("job-z", 0, "done", result="東京 🙂\nline", now=7)
    dcache.update_batch_target("job-z", 1, "failed", error="timeout", hint="retry later", now=7)
    dcache.set_batch_job_status("job-z", "partial", "1 of 2 failed", now=7)
    for n, status in enumerate(["queued", "running", "done", "failed", "cancelled"]):
        dcache.create_batch_job(
            make_job(f"s-{n}", status=status, caller="bob", targets_total=1), make_targets(1)
        )
    # a target held by a runner: its claim (runner, heartbeat, attempts) is copied too
    (claimed,) = dcache.claim_batch_targets(1, runner="runner-1", now=5_000)
    assert (claimed.runner, claimed.heartbeat, claimed.attempts) == ("runner-1", 5_000, 1)


def pg_rows() -> dict[str, list[tuple[Any, ...]]]:
    """The open PostgreSQL store's rows: jobs in insertion order (seq), targets by key."""
    return {
        "batch_job": dcache.db.execute_sql(f"SELECT {JOB_COLUMNS} FROM batch_job ORDER BY seq").fetchall(),
        "batch_target": dcache.db.execute_sql(
            f"SELECT {CLAIMED_TARGET_COLUMNS} FROM batch_target ORDER BY job_id, idx"
        ).fetchall(),
    }


def file_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """The same, read from the SQLite file with plain sqlite3: jobs in insertion order (_rowid_)."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return {
            "batch_job": conn.execute(f"SELECT {JOB_COLUMNS} FROM batch_job ORDER BY _rowid_").fetchall(),
            "batch_target": conn.execute(
                f"SELECT {CLAIMED_TARGET_COLUMNS} FROM batch_target ORDER BY job_id, idx"
            ).fetchall(),
        }


def test_backup_is_the_store_row_for_row(pg: str, tmp_path: Path) -> None:
    fill()
    before, expected, nbytes = snapshot(), pg_rows(), dcache.batch_nbytes()
    assert dcache.batch_job_by_idem("alice", "t", 60, now=5_010) == "tie-a"  # the later insert wins the tie
    dest = tmp_path / "copy.db"
    seen: list[tuple[int, int]] = []
    report = dcache.backup_store(dest, progress=lambda done, total: seen.append((done, total)))
    assert snapshot() == before  # the store is only read
    assert [p.name for p in tmp_path.iterdir()] == ["copy.db"]  # no temporary file left
    assert file_rows(dest) == expected
    assert seen[-1] == (len(expected["batch_job"]) + len(expected["batch_target"]),) * 2
    assert report.dest == str(dest) and report.nbytes == dest.stat().st_size
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    with closing(sqlite3.connect(f"file:{dest}?mode=ro", uri=True)) as conn:
        # a current file: its first open has nothing to upgrade (no pass over every target)
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    dcache.open_db(dest)
    assert dcache.check_store().ok and dcache.batch_nbytes() == nbytes
    assert dcache.batch_job_by_idem("alice", "t", 60, now=5_010) == "tie-a"  # the tiebreak survives the move
    assert dcache.store_space().auto_vacuum == 2
    with closing(sqlite3.connect(dest)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_backup_during_a_four_thread_write_load_is_one_snapshot(
    pg: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backup, "ROWS_PER_STEP", 40)
    for n in range(50):
        dcache.create_batch_job(make_job(f"base-{n}", targets_total=4), make_targets(4))
    dest = tmp_path / "copy.db"
    seen: list[tuple[int, int]] = []
    with Writers(4, budget=10**9) as writers:
        assert writers.wait_for_more(10)

        def progress(done: int, total: int) -> None:
            if not seen:  # the copy has begun: let the writers commit more before it goes on
                assert writers.wait_for_more(20)
            seen.append((done, total))

        dcache.backup_store(dest, progress=progress)
        assert writers.wait_for_more(5)
    assert len(seen) > 5 and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1][0] == seen[-1][1]
    in_store = dcache.BatchJob.select().count()
    dcache.open_db(dest)
    report = dcache.check_store()
    assert report.ok, report  # consistent: every job with exactly its targets and bytes
    assert report.jobs + report.targets == seen[-1][1]
    assert report.jobs < in_store  # the snapshot: later commits are not in it


@pytest.mark.parametrize(
    ("dest", "message"),
    [("", "must be a non-empty str"), ("{tmp}", "is a directory"), ("{tmp}/no/copy.db", "does not exist")],
)
def test_bad_dest_is_refused_and_nothing_is_written(pg: str, tmp_path: Path, dest: str, message: str) -> None:
    fill()
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput, match=message) as info:
        dcache.backup_store(dest.format(tmp=tmp_path))
    assert info.value.field == "dest"
    assert snapshot() == before and list(tmp_path.iterdir()) == []


def test_a_waiting_target_still_waits_in_the_backup(pg: str, tmp_path: Path) -> None:
    one_of_two_targets_waiting()
    dest = tmp_path / "copy.db"
    dcache.backup_store(dest)
    dcache.open_db(dest)
    assert_target_still_waits()


def test_inside_a_transaction_backup_is_refused(pg: str, tmp_path: Path) -> None:
    fill()
    with dcache.db.atomic(), pytest.raises(dcache.StoreUnavailable, match="inside a transaction"):
        dcache.backup_store(tmp_path / "copy.db")
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_store_is_backed_up_and_an_old_backup_keeps_its_mode(pg: str, tmp_path: Path) -> None:
    fill()
    expected = pg_rows()
    dest = tmp_path / "copy.db"
    dest.write_text("an older backup")
    dest.chmod(0o640)
    dcache.open_db(pg, readonly=True)
    dcache.backup_store(dest)
    assert file_rows(dest) == expected and stat.S_IMODE(dest.stat().st_mode) == 0o640


@pytest.mark.parametrize("version", [1, 3])
def test_an_older_store_open_read_only_is_backed_up_as_a_current_file(
    pg: str, tmp_path: Path, version: int
) -> None:
    """A store an earlier sift made (version 3 keeps no hosts, version 1 no claims either), open read-only:
    its backup is a current store file, each target's host computed from its URL, unclaimed where the
    store keeps no claims."""
    fill()
    expected = pg_rows()
    if version < 3:
        unclaimed = (None, None, 0)
        expected["batch_target"] = [row[: -len(unclaimed)] + unclaimed for row in expected["batch_target"]]
    {1: make_version_1, 3: make_version_3}[version](pg)
    dcache.open_db(pg, readonly=True)
    dest = tmp_path / "copy.db"
    dcache.backup_store(dest)
    assert file_rows(dest) == expected
    with closing(sqlite3.connect(f"file:{dest}?mode=ro", uri=True)) as conn:
        assert conn.execute("SELECT DISTINCT host FROM batch_target").fetchall() == [("example.com",)]
    dcache.open_db(dest)
    assert dcache.check_store().ok


# -- Space ------------------------------------------------------------------------------------------------


def test_relation_space_is_the_servers_figures(pg: str) -> None:
    fill()
    schema = pg.rpartition("schema=")[2]
    space = dcache.relation_space()
    with psycopg.connect(POSTGRES_URL) as conn:
        for table in ("batch_job", "batch_target", "batch_totals", "sift_schema", "batch_claim_ring"):
            row = conn.execute(
                "SELECT pg_total_relation_size(%s::regclass)", (f'"{schema}".{table}',)
            ).fetchone()
            assert row is not None and space.table_bytes[table] == row[0] > 0
    assert space.total_bytes == sum(space.table_bytes.values())
    assert set(space.dead_rows) == set(space.table_bytes)


def test_vacuum_relations_vacuums_and_analyzes_each_table(pg: str) -> None:
    fill()
    dcache.sweep_batch(0, now=BIG)
    schema = pg.rpartition("schema=")[2]
    query = "SELECT relname, vacuum_count, analyze_count FROM pg_stat_all_tables WHERE schemaname = %s"
    with psycopg.connect(POSTGRES_URL) as conn:
        before = {name: (v, a) for name, v, a in conn.execute(query, (schema,)).fetchall()}
    before_rows = snapshot()
    report = dcache.vacuum_relations()
    with psycopg.connect(POSTGRES_URL) as conn:
        after = {name: (v, a) for name, v, a in conn.execute(query, (schema,)).fetchall()}
    assert set(after) == set(dcache.tables.STORE_TABLES)
    assert all(after[t][0] == before[t][0] + 1 and after[t][1] == before[t][1] + 1 for t in after)
    assert snapshot() == before_rows
    assert set(report.before.table_bytes) == set(report.after.table_bytes) == set(after)


def test_vacuum_relations_refuses_what_it_cannot_do(pg: str, tmp_path: Path) -> None:
    with dcache.db.atomic(), pytest.raises(dcache.StoreUnavailable, match="inside a transaction"):
        dcache.vacuum_relations()
    dcache.open_db(pg, readonly=True)
    with pytest.raises(dcache.StoreReadOnly):
        dcache.vacuum_relations()
    dcache.open_db(tmp_path / "store.db")
    for call in (dcache.relation_space, dcache.vacuum_relations):
        with pytest.raises(dcache.StoreUnavailable, match="a SQLite file has"):
            call()
    assert os.listdir(tmp_path) == ["store.db"] or "store.db" in os.listdir(tmp_path)


# -- Restore: a SQLite store file into an empty store (the way from SQLite to PostgreSQL) -------------------


def test_a_backup_restored_is_the_store_again(pg: str, pg_target: str, tmp_path: Path) -> None:
    fill()
    expected, nbytes = pg_rows(), dcache.batch_nbytes()
    dest = tmp_path / "copy.db"
    dcache.backup_store(dest)
    dcache.open_db(f"{pg_target}_again")
    try:
        seen: list[tuple[int, int]] = []
        report = dcache.restore_store(dest, progress=lambda done, total: seen.append((done, total)))
        assert (report.jobs, report.targets) == (len(expected["batch_job"]), len(expected["batch_target"]))
        assert seen[-1] == (report.jobs + report.targets,) * 2
        assert pg_rows() == expected  # row for row, jobs in their insertion order
        assert dcache.batch_nbytes() == nbytes and dcache.check_store().ok
        assert dcache.batch_job_by_idem("alice", "t", 60, now=5_010) == "tie-a"
    finally:
        dcache.close_db()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{pg_target.rpartition("schema=")[2]}_again" CASCADE')


def sqlite_store(path: Path, *statements: str) -> Path:
    """A SQLite store file made by open_db, then written by another program's statements."""
    dcache.open_db(path)
    dcache.create_batch_job(make_job("job-1", targets_total=2), make_targets(2))
    dcache.update_batch_target("job-1", 0, "done", result="fine", now=5)
    dcache.close_db()
    run_on_file(path, *statements)
    return path


def not_a_database(path: Path) -> Path:
    path.write_text("not a database " * 100)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: "", "must be a non-empty str"),
        (lambda tmp: tmp / "none.db", "no store file at"),
        (
            lambda tmp: (tmp / "text.db").write_text("not a database " * 100) and tmp / "text.db",
            "cannot read",
        ),
        (lambda tmp: sqlite_store(tmp / "other.db", "DROP TABLE batch_target"), "is not a batch store"),
        (
            lambda tmp: sqlite_store(
                tmp / "nul.db", "UPDATE batch_target SET result = 'a' || char(0) || 'b'"
            ),
            "a row of batch_target in .* cannot be stored here",
        ),
        (
            lambda tmp: sqlite_store(
                tmp / "json.db", "UPDATE batch_target SET options = '{oops' WHERE idx = 1"
            ),
            "a row of batch_target in .* cannot be stored here",
        ),
    ],
    ids=["empty", "missing", "not-sqlite", "no-targets-table", "nul", "bad-json"],
)
def test_a_source_that_cannot_be_restored_is_named_and_nothing_is_written(
    pg: str, tmp_path: Path, make: Any, message: str
) -> None:
    source = make(tmp_path)
    dcache.open_db(pg)
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput, match=message) as info:
        dcache.restore_store(source)
    assert info.value.field == "source"
    assert snapshot() == before


def test_restore_into_a_store_with_jobs_is_refused(pg: str, tmp_path: Path) -> None:
    source = sqlite_store(tmp_path / "store.db")
    dcache.open_db(pg)
    dcache.create_batch_job(make_job("mine"))
    before = snapshot()
    with pytest.raises(dcache.StoreUnavailable, match="already holds 1 rows"):
        dcache.restore_store(source)
    assert snapshot() == before


def test_sift_restore_moves_a_sqlite_store_to_postgresql(
    pg_target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli_helpers import populate, run

    source = tmp_path / "store.db"
    populate(source)
    code, out, err = run(capsys, "--db", pg_target, "restore", source)
    assert (code, err) == (0, "")
    assert out == f"restored 5 jobs and 10 targets from {source} into {pg_target}\n"
    code, out, err = run(capsys, "--db", pg_target, "restore", source)
    assert (code, out) == (1, "") and "already holds 15 rows" in err
    with closing(sqlite3.connect(source)) as conn:
        expected = conn.execute(f"SELECT {JOB_COLUMNS} FROM batch_job ORDER BY id").fetchall()
    dcache.open_db(pg_target)
    assert dcache.db.execute_sql(f"SELECT {JOB_COLUMNS} FROM batch_job ORDER BY id").fetchall() == expected


def test_restore_into_an_empty_sqlite_store_too(tmp_path: Path) -> None:
    source = sqlite_store(tmp_path / "source.db")
    expected = file_rows(source)
    dcache.open_db(tmp_path / "new.db")
    try:
        report = dcache.restore_store(source)
        assert (report.jobs, report.targets) == (1, 2)
        dcache.close_db()
        assert file_rows(tmp_path / "new.db") == expected
        dcache.open_db(tmp_path / "new.db")
        assert dcache.check_store().ok and dcache.batch_nbytes() == 4
    finally:
        dcache.close_db()


def test_a_server_store_is_copied_by_its_rows_never_by_pages(pg: str, tmp_path: Path) -> None:
    with pytest.raises(dcache.StoreUnavailable, match="row by row"):
        dcache.db.backend.copy_into(str(tmp_path / "pages.db"), None, pages_per_step=10)
    assert list(tmp_path.iterdir()) == []
