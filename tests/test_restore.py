"""restore_store holds every copied row to the rules the store's functions write by, on either destination:
a row with a NUL in any text, an unknown status or caller_class, options that are not JSON, or a value of
the wrong type is InvalidBatchInput (field ``source``) naming the table, the row and the column, and the
destination is left exactly as it was, even after earlier batches of rows were written."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from helpers import (
    assert_target_still_waits,
    make_job,
    make_targets,
    one_of_two_targets_waiting,
    run_on_file,
    snapshot,
)
from test_upgrade import original_file

from sift import dcache
from sift.dcache import restore, tables


@pytest.fixture
def dest(new_store: str) -> str:
    """An empty destination store: a new SQLite file, or a new PostgreSQL schema (not open yet)."""
    return new_store


def source_store(path: Path, *statements: str) -> Path:
    """Three jobs of three targets (job-2's finished: a result, an error and a hint), then ``statements``
    run on the file as another program would."""
    dcache.open_db(path)
    for n in (1, 2, 3):
        dcache.create_batch_job(make_job(f"job-{n}", created_at=n, lease=n), make_targets(3))
    dcache.update_batch_target("job-2", 1, "done", result="fine", now=5)
    dcache.update_batch_target("job-2", 2, "failed", error="boom", hint="retry", now=5)
    dcache.close_db()
    run_on_file(path, *statements)
    return path


NUL = "char(0)"
JOB_2 = "WHERE id = 'job-2'"
TARGET = "WHERE job_id = 'job-2' AND idx = 2"

BAD_ROWS = [
    ("job-id", f"UPDATE batch_job SET id = id || {NUL} {JOB_2}", "batch_job", "id"),
    ("job-caller", f"UPDATE batch_job SET caller = 'a' || {NUL} {JOB_2}", "batch_job", "caller"),
    ("job-caller-empty", f"UPDATE batch_job SET caller = '' {JOB_2}", "batch_job", "caller"),
    ("job-caller-class", f"UPDATE batch_job SET caller_class = 'vip' {JOB_2}", "batch_job", "caller_class"),
    ("job-idem-key", f"UPDATE batch_job SET idem_key = 'k' || {NUL} {JOB_2}", "batch_job", "idem_key"),
    ("job-status", f"UPDATE batch_job SET status = 'paused' {JOB_2}", "batch_job", "status"),
    ("job-error", f"UPDATE batch_job SET error = 'e' || {NUL} {JOB_2}", "batch_job", "error"),
    ("job-created-at-real", f"UPDATE batch_job SET created_at = 1.5 {JOB_2}", "batch_job", "created_at"),
    ("job-lease-text", f"UPDATE batch_job SET lease = 'soon' {JOB_2}", "batch_job", "lease"),
    ("target-job-id", f"UPDATE batch_target SET job_id = job_id || {NUL} {TARGET}", "batch_target", "job_id"),
    ("target-idx-text", f"UPDATE batch_target SET idx = 'two' {TARGET}", "batch_target", "idx"),
    ("target-url", f"UPDATE batch_target SET url = 'a' || {NUL} || 'b' {TARGET}", "batch_target", "url"),
    ("target-url-blob", f"UPDATE batch_target SET url = x'68747470' {TARGET}", "batch_target", "url"),
    ("target-url-empty", f"UPDATE batch_target SET url = '' {TARGET}", "batch_target", "url"),
    ("target-options", f"UPDATE batch_target SET options = '{{oops' {TARGET}", "batch_target", "options"),
    (
        "target-options-nul",
        f"UPDATE batch_target SET options = '{{}}' || {NUL} {TARGET}",
        "batch_target",
        "options",
    ),
    (
        "target-options-deep",
        f"UPDATE batch_target SET options = '{'[' * 2001}{']' * 2001}' {TARGET}",
        "batch_target",
        "options",
    ),
    ("target-status", f"UPDATE batch_target SET status = 'lost' {TARGET}", "batch_target", "status"),
    ("target-result", f"UPDATE batch_target SET result = 'r' || {NUL} {TARGET}", "batch_target", "result"),
    ("target-error", f"UPDATE batch_target SET error = 'e' || {NUL} {TARGET}", "batch_target", "error"),
    ("target-hint", f"UPDATE batch_target SET hint = 'h' || {NUL} {TARGET}", "batch_target", "hint"),
    ("target-runner", f"UPDATE batch_target SET runner = 'r' || {NUL} {TARGET}", "batch_target", "runner"),
    ("target-runner-blob", f"UPDATE batch_target SET runner = x'7231' {TARGET}", "batch_target", "runner"),
    (
        "target-heartbeat-real",
        f"UPDATE batch_target SET heartbeat = 1.5 {TARGET}",
        "batch_target",
        "heartbeat",
    ),
    (
        "target-heartbeat-text",
        f"UPDATE batch_target SET heartbeat = 'now' {TARGET}",
        "batch_target",
        "heartbeat",
    ),
    (
        "target-attempts-below-0",
        f"UPDATE batch_target SET attempts = -1 {TARGET}",
        "batch_target",
        "attempts",
    ),
    (
        "target-attempts-text",
        f"UPDATE batch_target SET attempts = 'one' {TARGET}",
        "batch_target",
        "attempts",
    ),
]


def test_a_row_the_rules_refuse_is_named_and_the_destination_left_as_it_was(
    dest: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each row of BAD_ROWS in turn, into the one destination, which each refusal leaves as it was."""
    sources = {name: source_store(tmp_path / f"{name}.db", statement) for name, statement, _, _ in BAD_ROWS}
    monkeypatch.setattr(restore, "ROWS_PER_STEP", 1)  # rows before the bad one are written first
    dcache.open_db(dest)
    before = snapshot()
    for name, _, table, column in BAD_ROWS:
        with pytest.raises(dcache.InvalidBatchInput) as info:
            dcache.restore_store(sources[name])
        assert info.value.field == "source", name
        row = "job 'job-2" + (
            "' idx 2" if table == "batch_target" and column not in ("job_id", "idx") else ""
        )
        shown = str(sources[name])
        assert f"a row of {table} in {shown!r} cannot be stored here: {row}" in info.value.problem, name
        assert f": {column}: " in info.value.problem, name
        assert snapshot() == before, name
        assert not dcache.db.in_transaction(), name


def test_what_the_rules_allow_is_restored_on_either_destination(dest: str, tmp_path: Path) -> None:
    """A NUL escaped inside a JSON string (six characters), non-ASCII text, empty idem_key and error."""
    source = source_store(
        tmp_path / "source.db",
        "UPDATE batch_target SET options = '{\"a\":\"\\u0000\"}', url = 'https://例え.jp/ü' WHERE idx = 0",
    )
    with closing(sqlite3.connect(source)) as conn:
        expected = conn.execute(
            f"SELECT {tables.TARGET_COLUMN_LIST} FROM batch_target ORDER BY job_id, idx"
        ).fetchall()
    dcache.open_db(dest)
    report = dcache.restore_store(source)
    assert (report.jobs, report.targets) == (3, 9)
    query = f"SELECT {tables.TARGET_COLUMN_LIST} FROM batch_target ORDER BY job_id, idx"
    assert dcache.db.execute_sql(query).fetchall() == expected
    assert expected[0][3] == '{"a":"\\u0000"}'
    assert dcache.check_store().ok


TARGET_ROWS = (
    f"SELECT {tables.TARGET_COLUMN_LIST}, runner, heartbeat, attempts FROM batch_target ORDER BY job_id, idx"
)


def claimed_source(path: Path) -> Path:
    """The three jobs, job-1's targets claimed: 0 and 1 by ``r1`` at 50 (1 then requeued by a stale claim, so
    pending on its first attempt), 2 by ``r2`` at 60, renewed at 70; job-3's untouched."""
    source_store(path)
    dcache.open_db(path)
    assert len(dcache.claim_batch_targets(2, per_job=2, runner="r1", now=50)) == 2
    dcache.update_batch_target("job-1", 0, "done", result="ok", runner="r1", now=55)
    assert dcache.requeue_stale_claims(10, now=65) == 1
    claimed = dcache.claim_batch_targets(1, per_job=1, runner="r2", now=60)
    assert [(t.job_id, t.idx) for t in claimed] == [("job-1", 1)]
    assert dcache.renew_claims("r2", now=70) == 1
    dcache.close_db()
    return path


def test_claims_are_restored_as_stored_on_either_destination(dest: str, tmp_path: Path) -> None:
    source = claimed_source(tmp_path / "source.db")
    with closing(sqlite3.connect(source)) as conn:
        expected = conn.execute(TARGET_ROWS).fetchall()
    assert {row[8:] for row in expected} >= {("r1", 50, 1), ("r2", 70, 2), (None, None, 0)}
    dcache.open_db(dest)
    dcache.restore_store(source)
    assert dcache.db.execute_sql(TARGET_ROWS).fetchall() == expected
    assert dcache.check_store().ok
    assert dcache.renew_claims("r2", now=80) == 1  # the restored claim is still r2's


def test_a_waiting_target_still_waits_once_restored(dest: str, tmp_path: Path) -> None:
    path = tmp_path / "source.db"
    dcache.open_db(path)
    one_of_two_targets_waiting()
    dcache.close_db()
    dcache.open_db(dest)
    dcache.restore_store(path)
    assert_target_still_waits()


def test_a_source_the_original_service_wrote_restores_unclaimed(dest: str, tmp_path: Path) -> None:
    source = original_file(tmp_path / "original.db")
    dcache.open_db(dest)
    report = dcache.restore_store(source)
    assert (report.jobs, report.targets) == (1, 3)
    rows = dcache.db.execute_sql(
        "SELECT idx, status, runner, heartbeat, attempts FROM batch_target ORDER BY idx"
    )
    assert rows.fetchall() == [
        (0, "done", None, None, 0),
        (1, "running", None, None, 0),
        (2, "pending", None, None, 0),
    ]
    assert dcache.check_store().ok


def test_a_running_claim_with_no_attempt_is_refused_by_the_integrity_rules(dest: str, tmp_path: Path) -> None:
    source = claimed_source(tmp_path / "source.db")
    with closing(sqlite3.connect(source)) as conn:
        conn.execute("UPDATE batch_target SET attempts = 0 WHERE runner = 'r2'")
        conn.commit()
    dcache.open_db(dest)
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as info:
        dcache.restore_store(source)
    assert info.value.field == "source"
    assert "target_attempts" in info.value.problem
    assert snapshot() == before
