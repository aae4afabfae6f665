"""Rule 9: errors and counters. Misses, the exception classes and stats(). That no driver exception escapes
a caller's bad input is test_bad_input's (each case raises exactly its own error and writes nothing)."""

from __future__ import annotations

import pickle
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peewee
import pytest
from helpers import create_partial, make_job, make_target, make_targets, snapshot

from sift import dcache


def test_exception_hierarchy() -> None:
    assert issubclass(dcache.JobNotFound, LookupError)
    assert issubclass(dcache.TargetNotFound, LookupError)
    assert issubclass(dcache.InvalidBatchInput, ValueError)
    for cls in (
        dcache.JobNotFound,
        dcache.TargetNotFound,
        dcache.InvalidBatchInput,
        dcache.DuplicateJob,
        dcache.StoreNotOpen,
        dcache.StoreUnavailable,
        dcache.StoreFull,
        dcache.StoreCorrupt,
        dcache.StoreReadOnly,
    ):
        assert issubclass(cls, dcache.BatchError)
        assert not issubclass(cls, (peewee.PeeweeException, sqlite3.Error))
    assert issubclass(dcache.BatchError, Exception)
    for cls in (dcache.StoreFull, dcache.StoreCorrupt, dcache.StoreReadOnly):
        assert issubclass(cls, dcache.StoreUnavailable)  # a 503 to a web app, like any unusable store


def test_invalid_input_names_its_field(store: Any) -> None:
    dcache.create_batch_job(make_job("job-1"))
    with pytest.raises(dcache.InvalidBatchInput) as info:
        dcache.put_batch_targets("job-1", [make_target(0, options="{")])
    assert info.value.field == "options"
    assert str(info.value) == "options: is not valid JSON text (target 0)"
    copy = pickle.loads(pickle.dumps(info.value))  # as it crosses to another process
    assert (type(copy), copy.field, str(copy)) == (dcache.InvalidBatchInput, "options", str(info.value))


def test_reads_return_none_on_a_miss(store: Any) -> None:
    create_partial(make_job("job-1", idem_key="k"), make_targets(1))
    assert dcache.batch_job("job-2") is None
    assert dcache.batch_job("JOB-1") is None
    assert dcache.batch_targets("job-2") is None
    assert dcache.batch_targets("job-1 ") is None
    assert dcache.batch_job_by_idem("bob", "k", 100, now=1_000) is None
    assert dcache.batch_job_by_idem("alice", "other", 100, now=1_000) is None


WRITES_TO_UNKNOWN_JOB: list[tuple[str, Callable[[], object]]] = [
    ("put_batch_targets", lambda: dcache.put_batch_targets("nope", make_targets(1))),
    ("put_batch_targets-empty", lambda: dcache.put_batch_targets("nope", [])),
    ("update_batch_target", lambda: dcache.update_batch_target("nope", 0, "done", now=5)),
    ("update_batch_target-running", lambda: dcache.update_batch_target("nope", 0, "running", now=5)),
    ("set_batch_job_status", lambda: dcache.set_batch_job_status("nope", "done", now=5)),
    ("touch_batch_job", lambda: dcache.touch_batch_job("nope", now=5)),
]


@pytest.mark.parametrize(
    "write", [w for _, w in WRITES_TO_UNKNOWN_JOB], ids=[n for n, _ in WRITES_TO_UNKNOWN_JOB]
)
def test_write_to_unknown_job(store: Any, write: Callable[[], object]) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    before = snapshot()
    with pytest.raises(dcache.JobNotFound, match=r"^job_id") as info:
        write()
    assert isinstance(info.value, LookupError) and isinstance(info.value, dcache.BatchError)
    assert snapshot() == before
    assert dcache.stats()["batch_write_miss"] == 1


@pytest.mark.parametrize("status", ["pending", "running", "done", "failed"])
def test_write_to_unknown_target(store: Any, status: str) -> None:
    create_partial(make_job("job-1", targets_total=3), make_targets(2))
    create_partial(make_job("job-2", targets_total=3), make_targets(1, start=2))
    before = snapshot()
    with pytest.raises(dcache.TargetNotFound, match=r"^idx") as info:
        dcache.update_batch_target("job-1", 2, status, now=5)
    assert isinstance(info.value, LookupError) and isinstance(info.value, dcache.BatchError)
    with pytest.raises(dcache.TargetNotFound):
        dcache.update_batch_target("job-2", 0, status, now=5)
    assert snapshot() == before
    assert dcache.stats()["batch_write_miss"] == 2


def test_duplicate_job(store: Any) -> None:
    create_partial(make_job("job-1"), make_targets(2))
    before = snapshot()
    with pytest.raises(dcache.DuplicateJob, match="id") as info:
        dcache.create_batch_job(make_job("job-1", caller="bob", status="done"))
    assert isinstance(info.value, dcache.BatchError)
    with pytest.raises(dcache.DuplicateJob):
        dcache.create_batch_job(make_job("job-1", targets_total=5), make_targets(5))
    assert snapshot() == before
    job = dcache.batch_job("job-1")
    assert job is not None and job.caller == "alice"


def test_stats_count_exactly(store: Any) -> None:
    """Each counter moves by exactly what happened."""
    stats = dcache.stats()
    assert all(isinstance(k, str) and type(v) is int for k, v in stats.items())
    assert set(stats.values()) == {0}
    create_partial(make_job("job-1", idem_key="k", targets_total=5), make_targets(3))
    dcache.create_batch_job(make_job("job-2", status="running"))
    dcache.put_batch_targets("job-1", make_targets(2, start=3))
    for _ in range(3):
        dcache.batch_job("job-1")
    dcache.batch_job("nope")
    dcache.batch_job("nope-2")
    dcache.batch_targets("job-1")
    dcache.batch_targets("job-2")
    for _ in range(4):
        dcache.batch_targets("nope")
    dcache.batch_job_by_idem("alice", "k", 100, now=1_000)
    dcache.batch_job_by_idem("alice", "x", 100, now=1_000)
    dcache.batch_job_by_idem("alice", "", 100, now=1_000)
    dcache.batch_job_by_idem("bob", "k", 100, now=1_000)
    dcache.update_batch_target("job-1", 0, "done", result="abc", now=1_000)
    dcache.update_batch_target("job-1", 1, "running", now=1_000)
    with pytest.raises(dcache.JobNotFound):
        dcache.touch_batch_job("nope", now=1)
    with pytest.raises(dcache.JobNotFound):
        dcache.set_batch_job_status("nope", "done", now=1)
    with pytest.raises(dcache.JobNotFound):
        dcache.update_batch_target("nope", 0, "done", now=1)
    with pytest.raises(dcache.JobNotFound):
        dcache.put_batch_targets("nope", make_targets(1))
    dcache.create_batch_job(make_job("job-3", targets_total=2))
    with pytest.raises(dcache.TargetNotFound):
        dcache.update_batch_target("job-3", 1, "done", now=1)
    with pytest.raises(dcache.InvalidBatchInput):
        dcache.update_batch_target("job-1", 0, "pending", now=1)
    with pytest.raises(dcache.InvalidBatchInput):
        dcache.touch_batch_job("job-1", now=-1)
    dcache.set_batch_job_status("job-1", "done", now=1_000)
    assert dcache.mark_in_flight_failed("restart", now=1_000) == 2  # job-2 and job-3
    assert dcache.evict_batch_oldest(0) == 1  # job-1 holds 3 bytes
    assert dcache.sweep_batch(0, now=1_000) == 2
    stats = dcache.stats()
    expected = {
        "batch_job_hit": 3,
        "batch_job_miss": 2,
        "batch_targets_hit": 2,
        "batch_targets_miss": 4,
        "batch_idem_hit": 1,
        "batch_idem_miss": 3,
        "batch_write_miss": 5,
        "invalid_input": 2,
        "jobs_created": 3,
        "targets_put": 5,
        "target_writes": 2,
        "jobs_swept": 2,
        "jobs_evicted": 1,
        "bytes_evicted": 3,
        "jobs_marked_failed": 2,
    }
    assert {k: stats.get(k) for k in expected} == expected


def test_stats_returns_a_copy(store: Any) -> None:
    stats = dcache.stats()
    stats["batch_job_miss"] = 99
    assert dcache.stats()["batch_job_miss"] == 0


@pytest.mark.parametrize("targets", [None, 5, object()])
def test_put_targets_that_are_not_iterable(store: dcache.SerializedSqliteDatabase, targets: Any) -> None:
    dcache.create_batch_job(make_job())
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput, match=r"^targets: must be an iterable"):
        dcache.put_batch_targets("job-1", targets)
    assert snapshot() == before


@pytest.mark.parametrize("targets", [5, object()])
def test_create_targets_that_are_not_iterable(store: dcache.SerializedSqliteDatabase, targets: Any) -> None:
    with pytest.raises(dcache.InvalidBatchInput, match=r"^targets: must be an iterable"):
        dcache.create_batch_job(make_job(), targets)
    assert dcache.batch_job("job-1") is None  # the job went with its targets


@pytest.mark.parametrize("path", ["bad\x00name.db", "bad\ud800name.db", 42])
def test_open_db_with_a_path_that_cannot_be_opened(tmp_path: Path, path: Any) -> None:
    if isinstance(path, str):
        path = str(tmp_path / path)
    with pytest.raises(dcache.StoreUnavailable, match=r"^path: cannot open"):
        dcache.open_db(path)
    with pytest.raises(dcache.StoreNotOpen):  # the failed open left no half-open database behind
        dcache.batch_job("x")
