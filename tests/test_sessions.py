"""Peewee's session calls (start in one call, commit or roll back in another) hold and release the lock."""

from __future__ import annotations

import threading

import pytest
from helpers import make_job

from sift import dcache
from sift.dcache import db


def other_thread_can_write() -> bool:
    """Whether another thread gets the store within a few seconds (a held lock would block it)."""
    done = threading.Event()

    def write() -> None:
        dcache.touch_batch_job("job-1", now=77)
        done.set()

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return done.wait(5)


@pytest.mark.parametrize("end", ["session_commit", "session_rollback"])
def test_session_releases_the_lock(store: dcache.SerializedSqliteDatabase, end: str) -> None:
    dcache.create_batch_job(make_job())
    db.session_start()
    dcache.BatchJob.update(caller="bob").where(dcache.BatchJob.id == "job-1").execute()
    assert getattr(db, end)() is True
    assert other_thread_can_write()
    job = dcache.batch_job("job-1")
    assert job is not None and job.lease == 77
    assert job.caller == ("bob" if end == "session_commit" else "alice")


@pytest.mark.sqlite_only  # the shared connection's lock; on PostgreSQL each thread has its own connection
def test_session_keeps_other_threads_out_until_it_ends(store: dcache.SerializedSqliteDatabase) -> None:
    dcache.create_batch_job(make_job())
    db.session_start()
    blocked = threading.Event()
    finished = threading.Event()

    def write() -> None:
        blocked.set()
        dcache.touch_batch_job("job-1", now=88)
        finished.set()

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    blocked.wait(5)
    assert not finished.wait(0.3)  # the session holds the store
    db.session_rollback()
    assert finished.wait(5)
    job = dcache.batch_job("job-1")
    assert job is not None and job.lease == 88


def test_ending_without_a_session_is_false(store: dcache.SerializedSqliteDatabase) -> None:
    assert db.session_commit() is False
    assert db.session_rollback() is False
    dcache.create_batch_job(make_job())
    assert other_thread_can_write()  # no lock is left held
