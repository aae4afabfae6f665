"""Disk full: writes driven until the disk is full each fail with the package's error, with the driver's
error as ``__cause__``; the file stays intact, every committed write is there and no failed one is; once
space is freed, the same open store writes again.

Two real full disks: a 4 MiB tmpfs holding the store and a 1 MiB filler file (as root), and a limit on the
size of this process's files (``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored), which works without root. Past the
limit a write is cut short (SQLite: ``SQLITE_FULL``) or fails with EFBIG (``SQLITE_IOERR_WRITE``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path

import pytest
from faults import file_size_limit, tmpfs
from helpers import make_job, make_targets

from sift import dcache

LIMIT = 3 * 1024 * 1024  # bytes a file may reach under RLIMIT_FSIZE
FILLER = 1024 * 1024  # bytes of the filler on the 4 MiB tmpfs

pytestmark = pytest.mark.sqlite_only


class FullDisk:
    """Where the store lives, how the disk limit is put in force around a call, and how space is freed."""

    def __init__(self, how: str, tmp_path: Path, stack: ExitStack) -> None:
        self.how = how
        self.freed = False
        directory = tmp_path
        if how == "tmpfs":
            directory = stack.enter_context(tmpfs(tmp_path / "fs", "4m"))
            self.filler = directory / "filler"
            self.filler.write_bytes(b"\0" * FILLER)
        self.path = directory / "store.db"

    def limited(self) -> AbstractContextManager[None]:
        """The disk's limit, in force for the block (a tmpfs is always limited)."""
        if self.how == "rlimit" and not self.freed:
            return file_size_limit(LIMIT)
        return nullcontext()

    def free(self) -> None:
        if self.how == "tmpfs":
            self.filler.unlink()
        self.freed = True

    @property
    def errors(self) -> tuple[type[dcache.StoreUnavailable], ...]:
        """What a write may meet: StoreFull, whether the disk is full (ENOSPC) or a write would pass the
        file size limit (EFBIG, which SQLite reports as a plain write error)."""
        return (dcache.StoreFull,)


@pytest.fixture(params=["tmpfs", "rlimit"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FullDisk]:
    with ExitStack() as stack:
        disk = FullDisk(request.param, tmp_path, stack)
        dcache.open_db(disk.path)
        stack.callback(dcache.close_db)
        yield disk


def result(n: int, idx: int) -> str:
    """A 12 KB result, different for every target."""
    return f'{{"job":{n},"idx":{idx},"body":"' + f"{n:06d}{idx}" * 1700 + '"}'


def test_disk_full(disk: FullDisk) -> None:
    committed: dict[str, dict[int, str | None]] = {}  # job id -> idx -> its stored result
    failed_jobs: list[str] = []
    failures: list[Exception] = []
    n = 0
    while len(failures) < 20:
        n += 1
        assert n < 1000, "the disk never filled up"
        job_id = f"job-{n}"
        try:
            with disk.limited():
                dcache.create_batch_job(make_job(job_id, status="running"), make_targets(3))
        except Exception as exc:
            failures.append(exc)
            failed_jobs.append(job_id)
            continue
        committed[job_id] = dict.fromkeys(range(3))
        for idx in range(3):
            try:
                with disk.limited():
                    dcache.update_batch_target(job_id, idx, "done", result=result(n, idx), now=1_000)
            except Exception as exc:
                failures.append(exc)
            else:
                committed[job_id][idx] = result(n, idx)

    assert len(committed) > 10  # the store held a good many jobs before the disk filled
    for failure in failures:
        assert isinstance(failure, disk.errors), repr(failure)
        assert isinstance(failure.__cause__, sqlite3.Error), repr(failure.__cause__)
        assert str(failure).startswith("database: ")
    if disk.how == "tmpfs":
        assert all("is full" in str(failure) for failure in failures)
    else:
        assert all("is full" in str(f) or "file size limit" in str(f) for f in failures)

    assert dcache.db.execute_sql("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert_stored(committed, failed_jobs)

    disk.free()
    for m in range(n + 1, n + 6):  # the same open store, no reopen
        dcache.create_batch_job(make_job(f"job-{m}", status="running"), make_targets(3))
        committed[f"job-{m}"] = dict.fromkeys(range(3))
        for idx in range(3):
            dcache.update_batch_target(f"job-{m}", idx, "done", result=result(m, idx), now=1_000)
            committed[f"job-{m}"][idx] = result(m, idx)
    assert dcache.db.execute_sql("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert_stored(committed, failed_jobs)


def assert_stored(committed: dict[str, dict[int, str | None]], failed_jobs: list[str]) -> None:
    """Every committed job and result is stored, with exact counts, and no failed job is."""
    for job_id, results in committed.items():
        targets = dcache.batch_targets(job_id)
        assert targets is not None
        assert {t.idx: t.result for t in targets} == results
        job = dcache.batch_job(job_id)
        assert job is not None
        assert job.targets_done == sum(r is not None for r in results.values())
        assert job.nbytes == sum(len(r) for r in results.values() if r is not None)
    for job_id in failed_jobs:
        assert dcache.batch_job(job_id) is None
    assert dcache.BatchJob.select().count() == len(committed)
    assert dcache.batch_nbytes() == sum(len(r) for rs in committed.values() for r in rs.values() if r)
