"""``open_db(path, readonly=True)``: inspect a store without ever writing to it.

Reads work; every write raises ``StoreReadOnly`` (a ``StoreUnavailable``) and the file is left byte for
byte as it was. A missing file, a file without the whole schema, and paths that cannot be a store file
are refused with a message that says which.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from helpers import make_job, make_targets

from sift import dcache
from sift.dcache import BatchJob
from sift.dcache.backends.sqlite.schema import BASE_SCHEMA

pytestmark = pytest.mark.sqlite_only


@pytest.fixture
def populated(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "store.db"
    dcache.open_db(path)
    dcache.create_batch_job(make_job("a", targets_total=2, lease=100, idem_key="k"), make_targets(2))
    dcache.update_batch_target("a", 0, "done", result="ok", now=100)
    dcache.create_batch_job(make_job("b", status="done", lease=50))
    dcache.close_db()
    yield path
    dcache.close_db()


def contents(path: Path) -> dict[str, list[Any]]:
    with closing(sqlite3.connect(path)) as conn:
        return {
            table: sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
            for table in ("batch_job", "batch_target", "batch_totals")
        }


WRITES: dict[str, Callable[[], object]] = {
    "create_batch_job": lambda: dcache.create_batch_job(make_job("new")),
    "submit_batch_job": lambda: dcache.submit_batch_job(make_job("new", idem_key="n"), None, 10, now=100),
    "submit": lambda: dcache.submit("alice", ["https://example.com/"], idem_key="n", now=100),
    "cancel_batch_job": lambda: dcache.cancel_batch_job("a", now=200),
    "put_batch_targets": lambda: dcache.put_batch_targets("b", make_targets(1)),
    "update_batch_target": lambda: dcache.update_batch_target("a", 1, "done", result="x", now=200),
    "set_batch_job_status": lambda: dcache.set_batch_job_status("a", "done", now=200),
    "touch_batch_job": lambda: dcache.touch_batch_job("a", now=200),
    "mark_in_flight_failed": lambda: dcache.mark_in_flight_failed("restart", now=200),
    "claim_batch_targets": lambda: dcache.claim_batch_targets(5, now=200),
    "rescue_stale_jobs": lambda: dcache.rescue_stale_jobs(0, "host lost", now=200),
    "sweep_batch": lambda: dcache.sweep_batch(0, now=10**6),
    "evict_batch_oldest": lambda: dcache.evict_batch_oldest(0),
    "model save": lambda: BatchJob.update(status="cancelled").where(BatchJob.id == "a").execute(),
    "model delete": lambda: BatchJob.delete().execute(),
}


@pytest.mark.parametrize("name", list(WRITES))
def test_every_write_raises_store_read_only_and_changes_nothing(populated: Path, name: str) -> None:
    before_bytes, before = populated.read_bytes(), contents(populated)
    dcache.open_db(populated, readonly=True)
    with pytest.raises(dcache.StoreReadOnly):
        WRITES[name]()
    dcache.close_db()
    assert contents(populated) == before
    assert populated.read_bytes() == before_bytes


def test_reads_work(populated: Path) -> None:
    before = populated.read_bytes()
    dcache.open_db(populated, readonly=True)
    job = dcache.batch_job("a")
    assert job is not None and (job.targets_done, job.nbytes) == (1, 2)
    targets = dcache.batch_targets("a")
    assert targets is not None and [t.status for t in targets] == ["done", "pending"]
    assert dcache.batch_job_by_idem("alice", "k", 10**6, now=200) == "a"
    assert (dcache.live_batch_jobs("alice"), dcache.live_batch_jobs_total(), dcache.batch_nbytes()) == (
        1,
        1,
        2,
    )
    assert [j.id for j in dcache.sweep_candidates(0, now=10**6)] == ["b", "a"]
    assert [j.id for j in dcache.evict_candidates(0)] == []
    assert dcache.sweep_batch(0, now=10) == 0  # nothing due: a read, no write
    assert dcache.evict_batch_oldest(10) == 0  # within budget: a read, no write
    assert dcache.finish_batch_job("a") is None  # a target left: a read, no write
    assert dcache.finish_complete_jobs() == 0  # none complete: a read, no write
    assert dcache.requeue_stale_claims(0) == dcache.requeue_in_flight() == 0  # no claim: a read, no write
    assert BatchJob.select().count() == 2
    dcache.close_db()
    assert populated.read_bytes() == before


def test_a_version_4_store_opens_read_only_as_it_is(populated: Path) -> None:
    """A store of schema version 4, with its index of pending targets by idx: a read-only open reads it,
    claims are refused, and the file is left byte for byte as it was (the index is dropped by a writable
    open only)."""
    with closing(sqlite3.connect(populated)) as conn:
        conn.execute(
            "CREATE INDEX batch_target_pending ON batch_target(job_id, idx) WHERE status = 'pending'"
        )
        conn.execute("PRAGMA user_version = 4")
        conn.commit()
    before = populated.read_bytes()
    dcache.open_db(populated, readonly=True)
    assert [(t.idx, t.status) for t in dcache.batch_targets("a") or []] == [(0, "done"), (1, "pending")]
    kinds = {violation.kind for violation in dcache.check_store().violations}
    assert not kinds & {"schema", "schema_version"}, kinds  # the extra index is no fault of the schema
    with pytest.raises(dcache.StoreReadOnly):
        dcache.claim_batch_targets(1)
    dcache.close_db()
    assert populated.read_bytes() == before


def test_a_store_made_before_the_claim_indexes_opens_read_only_as_it_is(populated: Path) -> None:
    with closing(sqlite3.connect(populated)) as conn:
        for index in ("batch_job_claim", "batch_target_host", "batch_target_running"):
            conn.execute(f"DROP INDEX {index}")
    before = populated.read_bytes()
    dcache.open_db(populated, readonly=True)
    job = dcache.batch_job("a")
    assert job is not None and job.targets_done == 1
    assert dcache.live_batch_jobs_total() == 1
    with pytest.raises(dcache.StoreReadOnly):
        dcache.claim_batch_targets(1)
    dcache.close_db()
    assert populated.read_bytes() == before


def test_a_read_only_store_sees_another_writer(populated: Path) -> None:
    dcache.open_db(populated, readonly=True)
    with closing(sqlite3.connect(populated)) as writer:
        writer.execute("UPDATE batch_job SET status = 'done' WHERE id = 'a'")
        writer.commit()
    job = dcache.batch_job("a")
    assert job is not None and job.status == "done"


def test_a_missing_file_is_refused_and_not_created(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    with pytest.raises(dcache.StoreUnavailable, match=r"^path: no store at '.*typo\.db'$"):
        dcache.open_db(path, readonly=True)
    assert list(tmp_path.iterdir()) == []
    assert dcache.db.deferred


def test_a_file_without_the_whole_schema_is_refused(tmp_path: Path) -> None:
    """A file written by the Go service lacks the speed schema; read-only, open_db cannot add it."""
    path = tmp_path / "go.db"
    with closing(sqlite3.connect(path)) as conn:
        for statement in BASE_SCHEMA:
            conn.execute(statement)
        conn.commit()
    before = path.read_bytes()
    with pytest.raises(
        dcache.StoreUnavailable, match=r"lacks batch_job_evictable, batch_job_live, .*without readonly=True"
    ):
        dcache.open_db(path, readonly=True)
    assert path.read_bytes() == before


def test_memory_cannot_be_read_only() -> None:
    with pytest.raises(dcache.StoreUnavailable, match=r"^path: a read-only store must be a file"):
        dcache.open_db(":memory:", readonly=True)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("", r"^path: is empty; give the store file's path, or ':memory:'"),
        ("dir", r"^path: '.*' is a directory, not a store file$"),
        ("missing/parent/store.db", r"^path: the directory '.*missing/parent' of '.*' does not exist$"),
    ],
    ids=["empty", "directory", "missing-parent"],
)
@pytest.mark.parametrize("readonly", [False, True])
def test_paths_that_cannot_be_a_store_say_why(
    tmp_path: Path, where: str, message: str, readonly: bool
) -> None:
    (tmp_path / "dir").mkdir()
    path = str(tmp_path / where) if where else ""
    with pytest.raises(dcache.StoreUnavailable, match=message):
        dcache.open_db(path, readonly=readonly)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]
    assert dcache.db.deferred
