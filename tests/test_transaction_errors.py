"""Peewee's own transactions (``with db:``, ``db.atomic()``, ``db.transaction()``, sessions) get the
package's errors too: they begin and end on the shared connection through the store, so another process's
lock is ``StoreUnavailable`` and a failed COMMIT names its real cause, never a raw Peewee error. On a
read-only store they only read, so they work."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from faults import file_size_limit, locked_by_another_process
from helpers import make_job, make_targets, session

from sift import dcache
from sift.dcache import BatchJob, db

BLOCKS: dict[str, Callable[[], AbstractContextManager[Any]]] = {
    "with db": lambda: db,
    "atomic": db.atomic,
    "transaction": db.transaction,
    "session": session,
}


def assert_left_clean() -> None:
    assert not db.in_transaction()
    assert db.lock.acquire(blocking=False)
    db.lock.release()
    conn = db.connection()
    assert not conn.in_transaction


@pytest.fixture
def small_timeout_store(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "store.db"
    dcache.open_db(path, timeout=0.2)
    dcache.create_batch_job(make_job("a", targets_total=1), make_targets(1))
    yield path
    dcache.close_db()


@pytest.mark.parametrize("block", list(BLOCKS))
def test_another_process_lock_is_store_unavailable(small_timeout_store: Path, block: str) -> None:
    with (
        locked_by_another_process(small_timeout_store),
        pytest.raises(dcache.StoreUnavailable, match="locked by another process") as info,
        BLOCKS[block](),
    ):
        BatchJob.select().count()
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert_left_clean()
    with BLOCKS[block]():
        dcache.touch_batch_job("a", now=5)  # the lock is gone: the same idiom works again
    assert dcache.batch_job("a").lease == 5  # type: ignore[union-attr]


@pytest.mark.parametrize("block", list(BLOCKS))
def test_a_failed_commit_names_its_cause(small_timeout_store: Path, block: str) -> None:
    """No file may grow (RLIMIT_FSIZE 0): the COMMIT's write fails with an I/O error, and that is the
    error the block raises, not "cannot rollback - no transaction is active"."""
    with (
        pytest.raises(dcache.StoreUnavailable, match="I/O error") as info,
        file_size_limit(0),
        BLOCKS[block](),
    ):
        for i in range(200):
            dcache.create_batch_job(make_job(f"big-{i}", targets_total=1), make_targets(1))
    assert isinstance(info.value.__cause__, sqlite3.Error)
    assert_left_clean()
    assert dcache.batch_job("big-0") is None  # the whole block rolled back
    dcache.create_batch_job(make_job("after"))  # and the store writes again


@pytest.mark.parametrize("block", list(BLOCKS))
def test_blocks_that_read_work_on_a_read_only_store(tmp_path: Path, block: str) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path)
    dcache.create_batch_job(make_job("a"))
    dcache.close_db()
    before = path.read_bytes()
    dcache.open_db(path, readonly=True)
    try:
        with BLOCKS[block]():
            assert BatchJob.select().count() == 1
        with pytest.raises(dcache.StoreReadOnly), BLOCKS[block]():
            BatchJob.update(status="done").execute()
        assert_left_clean()
    finally:
        dcache.close_db()
    assert path.read_bytes() == before
