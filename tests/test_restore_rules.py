"""restore_store holds the copied rows to every rule check_store holds the store to (counts, byte sizes,
idx ranges, orphans, a result on a pending target, key lengths), refuses a source whose schema could make
data on read (generated columns, views, triggers that are not the store's own), reads in bounded memory,
and leaves the destination exactly as it was whenever it refuses. Hypothesis drives it with generated
stores, each valid or with one rule broken in one row."""

from __future__ import annotations

import os
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from helpers import snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sift import dcache
from sift.dcache import MAX_KEY_BYTES, restore, tables
from sift.dcache.backends import SQLITE_TRIGGERS
from sift.dcache.backends.sqlite.schema import BASE_SCHEMA, SPEED_SCHEMA

JOB_INSERT = f"INSERT INTO batch_job ({tables.JOB_COLUMN_LIST}) VALUES ({', '.join('?' * 11)})"
TARGET_INSERT = f"INSERT INTO batch_target ({tables.TARGET_COLUMN_LIST}) VALUES ({', '.join('?' * 8)})"


def empty_source(path: Path) -> Path:
    """A new store file with sift's schema (as open_db writes it) and no rows."""
    with closing(sqlite3.connect(path)) as conn:
        # the original columns only (a program that writes VALUES of eight): no index on the claims' runner
        # or on version 4's host, or on version 7's not_before (nor version 10's index of both)
        later = ("batch_target_host", "batch_target_running", "batch_target_delayed", "batch_target_pending")
        for statement in [*BASE_SCHEMA, *(s for s in SPEED_SCHEMA if not any(name in s for name in later))]:
            conn.execute(statement)
        conn.execute("INSERT INTO batch_totals (id, nbytes) VALUES (0, 0)")
        conn.commit()
    return path


def source_store(path: Path, *statements: str) -> Path:
    """Job ``live`` (running, two targets: one done with result 'abc', one pending) and job ``done`` (one
    failed target), written by sift; then ``statements`` run on the file as another program would."""
    empty_source(path)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(JOB_INSERT, ("live", "c", "fleet", "", "running", "", 2, 1, 1, 1, 3))
        conn.execute(TARGET_INSERT, ("live", 0, "https://x/0", "{}", "done", "abc", None, None))
        conn.execute(TARGET_INSERT, ("live", 1, "https://x/1", "{}", "pending", None, None, None))
        conn.execute(JOB_INSERT, ("done", "c", "fleet", "", "failed", "", 1, 1, 1, 1, 0))
        conn.execute(TARGET_INSERT, ("done", 0, "https://x/0", "{}", "failed", None, "e", None))
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    return path


def refused(source: Path) -> dcache.InvalidBatchInput:
    """Restore ``source`` into the open store, which must refuse it and stay exactly as it was."""
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as info:
        dcache.restore_store(source)
    assert info.value.field == "source"
    assert snapshot() == before
    assert not dcache.db.in_transaction()
    return info.value


LONG_KEY = "k" * (MAX_KEY_BYTES + 1)
BROKEN = [
    ("negative-total", "UPDATE batch_job SET targets_total = -5 WHERE id = 'done'", "targets_total"),
    ("done-over-total", "UPDATE batch_job SET targets_done = 3 WHERE id = 'done'", "targets_done"),
    ("negative-done", "UPDATE batch_job SET targets_done = -1 WHERE id = 'done'", "targets_done"),
    ("nbytes-phantom", "UPDATE batch_job SET nbytes = 1000000 WHERE id = 'done'", "nbytes"),
    ("nbytes-negative", "UPDATE batch_job SET nbytes = -999999000000 WHERE id = 'live'", "nbytes"),
    ("idx-outside", "UPDATE batch_target SET idx = 7 WHERE job_id = 'live' AND idx = 1", "target_idx"),
    ("idx-negative", "UPDATE batch_target SET idx = -1 WHERE job_id = 'live' AND idx = 1", "idx: must be"),
    ("lease-negative", "UPDATE batch_job SET lease = -7 WHERE id = 'done'", "lease: must be"),
    ("created-at-float", "UPDATE batch_job SET created_at = 1.5 WHERE id = 'done'", "created_at: must be"),
    ("url-too-long", "UPDATE batch_target SET url = printf('h%.20000c', 'x') WHERE idx = 0", "url: must be"),
    ("error-too-long", "UPDATE batch_job SET error = printf('%.70000c', 'e') WHERE id = 'done'", "error:"),
    (
        "orphan",
        "INSERT INTO batch_target VALUES ('ghost', 0, 'https://x/', '{}', 'running', NULL, NULL, NULL)",
        "orphan_targets",
    ),
    (
        "result-on-pending",
        "UPDATE batch_target SET result = 'r' WHERE job_id = 'live' AND idx = 1",
        "target_result",
    ),
    (
        "missing-target",
        "DELETE FROM batch_target WHERE job_id = 'done'",
        "missing_targets",
    ),
    ("long-id", f"UPDATE batch_job SET id = '{LONG_KEY}' WHERE id = 'done'", "id"),
    ("long-caller", f"UPDATE batch_job SET caller = '{LONG_KEY}' WHERE id = 'done'", "caller"),
    ("long-idem-key", f"UPDATE batch_job SET idem_key = '{LONG_KEY}' WHERE id = 'done'", "idem_key"),
]


def test_a_row_breaking_a_rule_is_refused_and_the_destination_left_as_it_was(
    store: dcache.StoreDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each row of BROKEN in turn, into the one destination, which each refusal leaves as it was."""
    monkeypatch.setattr(restore, "ROWS_PER_STEP", 1)  # earlier rows are written before the refusal
    for name, statement, named in BROKEN:
        source = source_store(tmp_path / f"{name}.db", statement)
        problem = refused(source).problem
        assert named in problem, name


def test_the_valid_source_restores_to_a_sound_store(store: dcache.StoreDatabase, tmp_path: Path) -> None:
    source = source_store(tmp_path / "source.db")
    report = dcache.restore_store(source)
    assert (report.jobs, report.targets) == (2, 3)
    assert dcache.check_store().ok
    assert dcache.batch_nbytes() == 3


SCHEMA_TRAPS = [
    (
        "generated-virtual",
        "ALTER TABLE batch_job ADD COLUMN big TEXT GENERATED ALWAYS AS (printf('%.*c', 1000, 'x')) VIRTUAL",
        "batch_job.big is a generated or hidden column",
    ),
    ("view", "CREATE VIEW recent AS SELECT * FROM batch_job", "view ('recent')"),
    (
        "trigger",
        "CREATE TRIGGER spy AFTER INSERT ON batch_target BEGIN SELECT 1; END",
        "trigger that is not the store's own ('spy')",
    ),
    (
        "trigger-changed",
        "DROP TRIGGER batch_totals_insert; CREATE TRIGGER batch_totals_insert AFTER INSERT ON batch_job "
        "BEGIN SELECT 1; END",
        "('batch_totals_insert')",
    ),
]


@pytest.mark.parametrize(
    ("statement", "why"), [c[1:] for c in SCHEMA_TRAPS], ids=[c[0] for c in SCHEMA_TRAPS]
)
def test_a_schema_that_makes_data_on_read_is_refused(
    store: dcache.StoreDatabase, tmp_path: Path, statement: str, why: str
) -> None:
    source = source_store(tmp_path / "source.db")
    with closing(sqlite3.connect(source)) as conn:
        conn.executescript(statement)
    assert why in refused(source).problem


def test_the_store_own_triggers_are_the_ones_a_store_file_holds(tmp_path: Path) -> None:
    source = empty_source(tmp_path / "source.db")
    with closing(sqlite3.connect(source)) as conn:
        held = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall())
    assert held == SQLITE_TRIGGERS


def test_a_small_file_of_generated_columns_expanding_to_gigabytes_is_refused_before_reading(
    store: dcache.StoreDatabase, tmp_path: Path
) -> None:
    """50 rows whose caller would be 200 MB each on read: 10 GB from a file of a few KiB."""
    source = tmp_path / "bomb.db"
    with closing(sqlite3.connect(source)) as conn:
        conn.execute(
            "CREATE TABLE batch_job (id TEXT PRIMARY KEY, n INTEGER, caller_class TEXT NOT NULL, "
            "idem_key TEXT NOT NULL, status TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', "
            "targets_total INTEGER NOT NULL, targets_done INTEGER NOT NULL DEFAULT 0, "
            "created_at INTEGER NOT NULL, lease INTEGER NOT NULL, nbytes INTEGER NOT NULL DEFAULT 0)"
        )
        conn.execute(
            "CREATE TABLE batch_target (job_id TEXT NOT NULL, idx INTEGER NOT NULL, url TEXT NOT NULL, "
            "options TEXT NOT NULL, status TEXT NOT NULL, result TEXT, error TEXT, hint TEXT, "
            "PRIMARY KEY (job_id, idx))"
        )
        for n in range(50):
            conn.execute(
                "INSERT INTO batch_job (id, n, caller_class, idem_key, status, targets_total, created_at, "
                "lease) VALUES (?, ?, 'fleet', '', 'done', 0, 1, 1)",
                (f"j{n}", n),
            )
        # Added after the rows, so that nothing computes it before a read does.
        conn.execute(
            "ALTER TABLE batch_job ADD COLUMN caller TEXT "
            "GENERATED ALWAYS AS (printf('%.*c', 200000000, 'x')) VIRTUAL"
        )
        conn.commit()
    assert os.path.getsize(source) < 32 * 1024
    problem = refused(source).problem  # a read would need 10 GB: refused before it, by the schema
    assert "batch_job.caller is a generated or hidden column" in problem


def test_reading_is_bounded_in_bytes_whatever_the_rows_hold(
    store: dcache.StoreDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 results of 1 MiB each, read at most about 2 MiB at a time: each step holds two rows at most."""
    monkeypatch.setattr(restore, "BYTES_PER_STEP", 2 * 2**20)
    source = empty_source(tmp_path / "big.db")
    with closing(sqlite3.connect(source)) as conn:
        for n in range(8):
            conn.execute(JOB_INSERT, (f"job-{n}", "c", "fleet", "", "done", "", 1, 1, 5, 5, 2**20))
            result = chr(97 + n) * 2**20
            conn.execute(TARGET_INSERT, (f"job-{n}", 0, "https://x/", "{}", "done", result, None, None))
        conn.commit()
    seen: list[int] = []
    report = dcache.restore_store(source, progress=lambda done, total: seen.append(done))
    assert (report.jobs, report.targets) == (8, 8)
    steps = [b - a for a, b in zip([0, *seen], seen, strict=False)]
    assert steps[0] == 8  # the jobs: small rows, one step
    assert steps[1:] == [2, 2, 2, 2]  # the targets: a step ends at the row that passes 2 MiB
    assert dcache.batch_nbytes() == 8 * 2**20


# -- Generated sources ---------------------------------------------------------------------------------


@st.composite
def stores(draw: st.DrawFn) -> list[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]:
    """Valid jobs with their targets: counts and byte sizes as the store's functions keep them."""
    jobs = []
    for n in range(draw(st.integers(1, 4))):
        total = draw(st.integers(0, 4))
        statuses = draw(
            st.lists(
                st.sampled_from(["pending", "running", "done", "failed"]), min_size=total, max_size=total
            )
        )
        targets = []
        for idx, status in enumerate(statuses):
            result = draw(st.text("aé☃", max_size=5)) if status == "done" else None
            error = draw(st.sampled_from([None, "boom"])) if status == "failed" else None
            targets.append((f"j{n}", idx, f"https://x/{idx}", "{}", status, result, error, None))
        done = sum(status in ("done", "failed") for status in statuses)
        nbytes = sum(len(t[5].encode()) for t in targets if t[5] is not None)
        status = draw(st.sampled_from(["queued", "running", "done", "partial", "failed", "cancelled"]))
        key = draw(st.sampled_from(["", "k", "κ" * (MAX_KEY_BYTES // 2)]))
        jobs.append(((f"j{n}", "c", "fleet", key, status, "", total, done, 5, 5, nbytes), targets))
    return jobs


#: One rule broken in one row: (what it breaks, the statement, the row it needs: a job or a target).
BREAKS = [
    ("negative total", "UPDATE batch_job SET targets_total = -1 - targets_total WHERE id = :job", "job"),
    ("done over total", "UPDATE batch_job SET targets_done = targets_total + 1 WHERE id = :job", "job"),
    ("nbytes", "UPDATE batch_job SET nbytes = nbytes + 1 WHERE id = :job", "job"),
    ("negative nbytes", "UPDATE batch_job SET nbytes = -1 WHERE id = :job", "job"),
    ("job status", "UPDATE batch_job SET status = 'paused' WHERE id = :job", "job"),
    ("long id", f"UPDATE batch_job SET id = id || '{'x' * MAX_KEY_BYTES}' WHERE id = :job", "job"),
    ("long caller", f"UPDATE batch_job SET caller = '{'c' * (MAX_KEY_BYTES + 1)}' WHERE id = :job", "job"),
    ("idx outside", "UPDATE batch_target SET idx = idx + 100 WHERE job_id = :job AND idx = :idx", "target"),
    ("idx negative", "UPDATE batch_target SET idx = -1 - idx WHERE job_id = :job AND idx = :idx", "target"),
    ("orphan", "UPDATE batch_target SET job_id = 'gone' WHERE job_id = :job AND idx = :idx", "target"),
    ("target status", "UPDATE batch_target SET status = 'lost' WHERE job_id = :job AND idx = :idx", "target"),
    (
        "result on pending",
        "UPDATE batch_target SET status = 'pending', result = 'r' WHERE job_id = :job AND idx = :idx",
        "target",
    ),
    ("missing target", "DELETE FROM batch_target WHERE job_id = :job AND idx = :idx", "target"),
    ("options", "UPDATE batch_target SET options = '{' WHERE job_id = :job AND idx = :idx", "target"),
    ("url nul", "UPDATE batch_target SET url = url || char(0) WHERE job_id = :job AND idx = :idx", "target"),
]


@st.composite
def sources(draw: st.DrawFn) -> tuple[list[Any], tuple[str, str, dict[str, Any]] | None]:
    """A valid store, and None or one break applied to one of its rows."""
    jobs = draw(stores())
    rows = [("job", {"job": job[0]}) for job, _ in jobs]
    rows += [("target", {"job": t[0], "idx": t[1]}) for _, targets in jobs for t in targets]
    if draw(st.booleans()):
        return jobs, None
    kind, params = draw(st.sampled_from(rows))
    name, statement, _ = draw(st.sampled_from([b for b in BREAKS if b[2] == kind]))
    return jobs, (name, statement, params)


def write_source(path: Path, jobs: list[Any], broken: tuple[str, str, dict[str, Any]] | None) -> None:
    with closing(sqlite3.connect(path)) as conn:
        for job, targets in jobs:
            conn.execute(JOB_INSERT, job)
            conn.executemany(TARGET_INSERT, targets)
        if broken is not None:
            conn.execute(broken[1], broken[2])
        conn.commit()


@pytest.fixture
def blank_source(tmp_path: Path) -> Path:
    """A store file with the schema and no rows, made once per test and copied per example."""
    return empty_source(tmp_path / "blank.db")


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=sources())
def test_generated_sources_are_refused_when_broken_and_restored_sound_when_valid(
    store: dcache.StoreDatabase, blank_source: Path, source: tuple[list[Any], Any]
) -> None:
    jobs, broken = source
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "source.db"
        path.write_bytes(blank_source.read_bytes())
        write_source(path, jobs, broken)
        if broken is not None:
            refused(path)
            assert snapshot()["batch_job"] == [] and dcache.batch_nbytes() == 0
            return
        report = dcache.restore_store(path)
        assert report.jobs == len(jobs)
        try:
            assert dcache.check_store().ok
        finally:  # empty again for the next example
            with dcache.db.atomic():
                dcache.db.execute_sql("DELETE FROM batch_target")
                dcache.db.execute_sql("DELETE FROM batch_job")


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("attempts", 2**63 - 1),
        ("attempts", dcache.MAX_ATTEMPTS + 1),
        ("heartbeat", -1),
        ("runner", "r" * 1025),
    ],
)
def test_a_claim_past_the_stores_bounds_is_refused(
    store: dcache.StoreDatabase, tmp_path: Path, column: str, value: Any
) -> None:
    """A claim column past what the functions could write: the claims' ``attempts + 1`` would leave a
    64-bit integer, a runner would pass the key bound."""
    claims = (
        "ALTER TABLE batch_target ADD COLUMN runner TEXT",
        "ALTER TABLE batch_target ADD COLUMN heartbeat INTEGER",
        "ALTER TABLE batch_target ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0",
        f"UPDATE batch_target SET {column} = {value!r} WHERE job_id = 'live' AND idx = 1",
    )
    assert f"{column}: must be" in refused(source_store(tmp_path / "claimed.db", *claims)).problem
