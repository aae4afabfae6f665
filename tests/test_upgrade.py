"""The schema's upgrade to version 3 (the claims' columns): a file the original DDL wrote, and a store an
earlier sift wrote, are upgraded by their first writable open in one transaction; a read-only open reads
them as they are; the original service's own statements, which name their columns, keep working."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
from helpers import make_job, make_targets
from test_schema import DDL

from sift import dcache
from sift.dcache import db
from sift.dcache.tables import SCHEMA_VERSION

ORIGINAL_ROWS = """
INSERT INTO batch_job (id, caller, caller_class, idem_key, status, error, targets_total, targets_done,
    created_at, lease, nbytes) VALUES ('old', 'alice', 'fleet', '', 'running', '', 3, 1, 100, 100, 3);
INSERT INTO batch_target (job_id, idx, url, options, status, result, error, hint)
    VALUES ('old', 0, 'u0', '{}', 'done', 'abc', NULL, NULL);
INSERT INTO batch_target (job_id, idx, url, options, status, result, error, hint)
    VALUES ('old', 1, 'u1', '{}', 'running', NULL, NULL, NULL);
INSERT INTO batch_target (job_id, idx, url, options, status, result, error, hint)
    VALUES ('old', 2, 'u2', '{}', 'pending', NULL, NULL, NULL);
"""


def original_file(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(DDL + ORIGINAL_ROWS)
    conn.close()
    return path


#: What version 4 added: the ring's indexes and cursor, and the targets' host (and version 10's index on it).
DROP_VERSION_4 = (
    "DROP INDEX batch_job_ring; DROP INDEX batch_target_host; DROP TABLE batch_claim_ring; "
    "DROP INDEX batch_target_pending_host; "
    "ALTER TABLE batch_target DROP COLUMN host; "
)


def version_3_file(path: Path) -> Path:
    """A store as version 3 made it: today's schema without version 4's host, indexes and ring."""
    dcache.open_db(path)
    dcache.create_batch_job(make_job("old", targets_total=3, created_at=100, lease=100), make_targets(3))
    dcache.close_db()
    conn = sqlite3.connect(path)
    conn.executescript(DROP_VERSION_4 + "PRAGMA user_version = 3;")
    conn.close()
    return path


def earlier_sift_file(path: Path) -> Path:
    """A store as the release before claims made it: version 3's schema without its columns and index."""
    version_3_file(path)
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP INDEX batch_target_running; ALTER TABLE batch_target DROP COLUMN runner; "
        "ALTER TABLE batch_target DROP COLUMN heartbeat; ALTER TABLE batch_target DROP COLUMN attempts; "
        "PRAGMA user_version = 0;"
    )
    conn.close()
    return path


def columns(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute("PRAGMA table_info(batch_target)")]
    finally:
        conn.close()


def user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


MAKERS = {"original DDL": original_file, "earlier sift": earlier_sift_file, "version 3": version_3_file}


def test_a_read_only_open_of_an_original_file_still_asks_for_one_writable_open(tmp_path: Path) -> None:
    # It lacks the byte total as well as the claims, which only a writable open can add.
    path = original_file(tmp_path / "old.db")
    before = path.read_bytes()
    with pytest.raises(dcache.StoreUnavailable, match=r"batch_totals.*open it once without readonly=True"):
        dcache.open_db(path, readonly=True)
    assert path.read_bytes() == before


def test_a_read_only_open_reads_an_earlier_sifts_store_as_unclaimed(tmp_path: Path) -> None:
    path = earlier_sift_file(tmp_path / "old.db")
    before = path.read_bytes()
    dcache.open_db(path, readonly=True)
    try:
        targets = dcache.batch_targets("old")
        assert targets is not None and [(t.idx, t.runner, t.heartbeat, t.attempts) for t in targets] == [
            (0, None, None, 0),
            (1, None, None, 0),
            (2, None, None, 0),
        ]
        assert dcache.batch_job("old") is not None
        with pytest.raises(dcache.StoreReadOnly):
            dcache.renew_claims("a")
    finally:
        dcache.close_db()
    assert path.read_bytes() == before
    assert "attempts" not in columns(path)


@pytest.mark.parametrize("maker", MAKERS)
def test_the_first_writable_open_upgrades_it_and_the_claims_work(tmp_path: Path, maker: str) -> None:
    path = MAKERS[maker](tmp_path / "old.db")
    dcache.open_db(path)
    try:
        # version 7's column comes where the maker's schema left room for it (an earlier sift made it already)
        assert [name for name in columns(path) if name != "not_before"][-4:] == [
            "runner",
            "heartbeat",
            "attempts",
            "host",
        ]
        assert "not_before" in columns(path)
        assert user_version(path) == SCHEMA_VERSION
        # every stored target's host filled in from its URL
        hosts = db.execute_sql("SELECT url, host FROM batch_target").fetchall()
        assert len(hosts) == 3 and all(host == dcache.url_host(url) for url, host in hosts)
        assert {host for _, host in hosts} == ({""} if maker == "original DDL" else {"example.com"})
        claimed = dcache.claim_batch_targets(5, runner="new", now=1_000)
        pending = [2] if maker == "original DDL" else [0, 1, 2]
        assert [(t.idx, t.runner, t.attempts) for t in claimed] == [(i, "new", 1) for i in pending]
        # A target the original service left running has no heartbeat: stale at once.
        assert [t.idx for t in dcache.stale_claims(60, now=1_000)] == ([1] if maker == "original DDL" else [])
    finally:
        dcache.close_db()


def test_the_upgrade_is_one_transaction(tmp_path: Path) -> None:
    # A table named like the new index makes the upgrade fail after it added the columns: all of it goes.
    path = original_file(tmp_path / "old.db")
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE batch_target_running (x)")
    conn.close()
    with pytest.raises(dcache.StoreUnavailable, match="batch_target_running"):
        dcache.open_db(path)
    assert "attempts" not in columns(path)
    assert user_version(path) == 0
    conn = sqlite3.connect(path)
    assert {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")} == {
        "batch_job_idem",
        "batch_job_lease",
        "sqlite_autoindex_batch_job_1",
        "sqlite_autoindex_batch_target_1",
    }
    conn.close()


def test_the_original_services_statements_work_on_an_upgraded_store(tmp_path: Path) -> None:
    path = original_file(tmp_path / "old.db")
    dcache.open_db(path)
    dcache.claim_batch_targets(1, runner="sift", now=1_000)
    dcache.close_db()
    conn = sqlite3.connect(path)  # the original service's statements, naming their columns
    conn.executescript(ORIGINAL_ROWS.replace("'old'", "'again'"))
    conn.execute(
        "UPDATE batch_target SET status = 'done', result = 'x' WHERE job_id = ? AND idx = ?", ("again", 1)
    )
    rows = conn.execute(
        "SELECT job_id, idx, url, options, status, result, error, hint FROM batch_target "
        "WHERE job_id = 'again' ORDER BY idx"
    ).fetchall()
    assert [row[4] for row in rows] == ["done", "done", "pending"]
    conn.execute("DELETE FROM batch_target WHERE job_id = 'again'")
    conn.execute("DELETE FROM batch_job WHERE id = 'again'")
    conn.commit()
    conn.close()
    dcache.open_db(path)
    try:
        assert [(t.idx, t.status, t.attempts) for t in dcache.batch_targets("old") or []] == [
            (0, "done", 0),
            (1, "running", 0),
            (2, "running", 1),
        ]
        assert dcache.batch_job("again") is None
    finally:
        dcache.close_db()


@pytest.mark.postgres
def test_a_postgres_store_of_version_2_is_read_read_only_then_upgraded(postgres_schema: str) -> None:
    from conftest import open_empty_postgres, postgres_target

    open_empty_postgres(postgres_schema)
    dcache.create_batch_job(make_job("old", targets_total=2), make_targets(2))
    db.execute_sql("DROP INDEX batch_target_running")
    db.execute_sql("ALTER TABLE batch_target DROP COLUMN runner, DROP COLUMN heartbeat, DROP COLUMN attempts")
    db.execute_sql("UPDATE sift_schema SET version = 2")
    target = postgres_target(postgres_schema)
    dcache.open_db(target, readonly=True)
    assert [(t.idx, t.attempts) for t in dcache.batch_targets("old") or []] == [(0, 0), (1, 0)]
    dcache.open_db(target)
    assert db.execute_sql("SELECT version FROM sift_schema").fetchone()[0] == SCHEMA_VERSION
    # The original service's insert, naming its columns, on the upgraded store.
    db.execute_sql(
        "INSERT INTO batch_target (job_id, idx, url, options, status) VALUES ('x', 0, 'u', '{}', 'pending')"
    )
    assert [(t.idx, t.attempts, t.runner) for t in dcache.claim_batch_targets(5, runner="r", now=5)] == [
        (0, 1, "r"),
        (1, 1, "r"),
    ]
    dcache.close_db()


def wal_frames_not_copied(path: Path) -> int:
    """Frames of the -wal file not yet checkpointed into the store file, from the WAL index header
    (sqlite.org/walformat: ``mxFrame`` at byte 16, ``nBackfill`` at byte 96, native byte order)."""
    header = Path(f"{path}-shm").read_bytes()[:100]
    return int.from_bytes(header[16:20], sys.byteorder) - int.from_bytes(header[96:100], sys.byteorder)


@pytest.mark.parametrize("maker", MAKERS)
def test_the_upgrade_is_copied_back_into_the_file_by_the_open_that_made_it(
    tmp_path: Path, maker: str
) -> None:
    """An upgrade rewrites every target (its host): its checkpoint belongs to the open, not to the lock hold
    of the first write after it."""
    path = MAKERS[maker](tmp_path / "old.db")
    dcache.open_db(path)
    try:
        assert user_version(path) == SCHEMA_VERSION
        assert wal_frames_not_copied(path) == 0
        assert Path(f"{path}-wal").stat().st_size == 0  # emptied: no later write cuts it down
    finally:
        dcache.close_db()
