"""Fork safety: a child made with os.fork() while the parent holds the open store never uses the inherited
connection; it opens its own, writes through the package and exits 0, while the parent goes on with
its own connection. Also when another parent thread holds ``db.lock`` (bare, or inside a read or a
write transaction) at the moment of the fork: the child must not deadlock nor fail on the inherited
lock state, and gets the store to itself once the parent's transaction is over.

The child always leaves through ``os._exit``; the parent waits with a timeout guard and kills a hung child.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import make_job, make_targets

from sift import dcache
from sift.dcache import BatchJob, db

BUSY_TIMEOUT_S = 5.0
CHILD_TIMEOUT_S = 30.0  # well past the busy timeout: a child stuck on a lock fails, it does not hang

pytestmark = pytest.mark.sqlite_only


@pytest.fixture
def store_path(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "store.db"
    dcache.open_db(path, timeout=BUSY_TIMEOUT_S)
    yield path
    dcache.close_db()


def fork_child(body: Callable[[], None]) -> tuple[int, int]:
    """Fork; the child runs ``body`` and always leaves with os._exit (0 on success, 1 with the error
    written to a pipe). Returns (pid, read end of the pipe)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_fd)
            body()
            code = 0
        except BaseException as exc:
            os.write(write_fd, f"{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def wait_child(pid: int, read_fd: int) -> tuple[int, str]:
    """Wait for the child with a timeout guard; return (exit code, what it reported)."""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_fd)
            pytest.fail(f"the forked child hung for {CHILD_TIMEOUT_S} s (deadlock?)")
        time.sleep(0.01)
    with os.fdopen(read_fd, "rb") as pipe:
        message = pipe.read().decode()
    return os.waitstatus_to_exitcode(status), message


def connection() -> object:
    """The store's current SQLite connection (Peewee opens one if there is none)."""
    return db.connection()


def child_writes(job_id: str) -> None:
    """What the child does: its own job, a result, read back, all through the package."""
    dcache.create_batch_job(make_job(job_id, caller="child"), make_targets(3))
    dcache.update_batch_target(job_id, 0, "done", result="çhild", now=3_000)
    job = dcache.batch_job(job_id)
    assert job is not None and (job.targets_done, job.nbytes) == (1, 6)


def test_forked_child_opens_its_own_connection(store_path: Path) -> None:
    dcache.create_batch_job(make_job("parent"), make_targets(3))
    inherited = connection()

    def child() -> None:
        assert connection() is not inherited, "the child uses the inherited connection"
        child_writes("child-job")
        assert BatchJob.select().count() == 2  # the parent's job, seen through its own connection

    pid, read_fd = fork_child(child)
    for idx in range(3):  # the parent goes on writing at the same time, on its own connection
        dcache.update_batch_target("parent", idx, "done", result="p" * (idx + 1), now=2_000 + idx)
    code, message = wait_child(pid, read_fd)
    assert (code, message) == (0, "")

    assert connection() is inherited  # the parent's connection is untouched and still works
    dcache.touch_batch_job("parent", now=4_000)
    assert db.execute_sql("PRAGMA integrity_check").fetchall() == [("ok",)]
    parent, child_job = dcache.batch_job("parent"), dcache.batch_job("child-job")
    assert parent is not None and (parent.targets_done, parent.nbytes, parent.lease) == (3, 6, 4_000)
    assert child_job is not None and (child_job.caller, child_job.targets_done, child_job.nbytes) == (
        "child",
        1,
        6,
    )
    targets = dcache.batch_targets("child-job")
    assert targets is not None and targets[0].result == "çhild"
    assert dcache.batch_nbytes() == 12


@pytest.mark.parametrize("holding", ["lock", "read-transaction", "write-transaction"])
def test_fork_while_another_thread_holds_the_lock(store_path: Path, holding: str) -> None:
    """Another thread holds db.lock for a moment when the main thread forks. The child gets a fresh lock
    (the inherited one is held by a thread that does not exist in the child) and, once the parent's
    transaction is over, writes as any process would."""
    dcache.create_batch_job(make_job("parent"), make_targets(3))
    holding_now = threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        try:
            if holding == "lock":
                with db.lock:
                    holding_now.set()
                    time.sleep(0.5)
            else:
                with db.atomic():
                    if holding == "write-transaction":
                        dcache.update_batch_target("parent", 0, "done", result="held", now=2_000)
                    else:
                        db.execute_sql("SELECT COUNT(*) FROM batch_target").fetchall()
                    holding_now.set()
                    time.sleep(0.5)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding_now.wait(10)
    pid, read_fd = fork_child(lambda: child_writes("child-job"))
    thread.join(30)
    assert not thread.is_alive() and errors == []
    code, message = wait_child(pid, read_fd)
    assert (code, message) == (0, "")

    assert db.execute_sql("PRAGMA integrity_check").fetchall() == [("ok",)]
    child_job = dcache.batch_job("child-job")
    assert child_job is not None and (child_job.targets_done, child_job.nbytes) == (1, 6)
    parent = dcache.batch_job("parent")
    assert parent is not None
    assert parent.targets_done == (1 if holding == "write-transaction" else 0)
    dcache.update_batch_target("parent", 2, "done", result="after", now=5_000)  # the parent still works
    assert dcache.batch_nbytes() == 6 + 5 + (4 if holding == "write-transaction" else 0)


def test_fork_inside_own_transaction_gives_the_child_a_clear_error(store_path: Path) -> None:
    dcache.create_batch_job(make_job("p", targets_total=1))
    with db.atomic():
        dcache.touch_batch_job("p", now=7)
        pid, read_fd = fork_child(lambda: dcache.touch_batch_job("p", now=9))
    code, report = wait_child(pid, read_fd)
    assert code == 1
    assert report.startswith("StoreUnavailable: database: this process was forked inside a transaction")
    job = dcache.batch_job("p")
    assert job is not None and job.lease == 7  # the parent's transaction committed; the child wrote nothing
