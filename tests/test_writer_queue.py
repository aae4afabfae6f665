"""The writers' queue (the tail on SQLite): every write transaction of a file store holds an
exclusive ``flock`` on ``<store>-lock`` from before its ``BEGIN IMMEDIATE`` to its end, so a writer of
another process waits in the kernel's lock queue, not in SQLite's sleeping busy handler.

No timing is asserted. The cause is pinned instead: while one process holds a write transaction, another
writer shows in ``/proc/locks`` as blocked on the lock file, and has not issued its ``BEGIN``; the lock is
free after every way a transaction ends, a SIGKILL included; reads, read-only and in-memory stores never
take it; a forked child never keeps its parent's lock.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest
from helpers import make_job, make_targets, session, snapshot

from sift import dcache
from sift.dcache import db
from sift.dcache.backends.sqlite import database as sqlite_database
from sift.dcache.backends.sqlite.settings import WAL_AUTOCHECKPOINT_PAGES, WAL_RESTART_FRAMES
from sift.dcache.backends.sqlite.writer_queue import WriterQueue

pytestmark = pytest.mark.sqlite_only

ctx = multiprocessing.get_context("spawn")
WAIT_S = 60.0  # how long a test waits for a condition before it fails (never a timing assertion)


def lock_path(store: Path) -> str:
    return f"{store}-lock"


def lock_is_free(store: Path) -> bool:
    """Whether nobody holds the queue: a flock on a new open file of the lock file succeeds at once."""
    fd = os.open(lock_path(store), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # releases it, if this took it
    return True


@contextmanager
def hold_lock(store: Path) -> Iterator[None]:
    """Hold the queue from this test, as another writer would."""
    fd = os.open(lock_path(store), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(fd)


def flock_entries(store: Path) -> list[tuple[bool, int]]:
    """``/proc/locks`` for the lock file: (blocked, pid) for each holder and each blocked waiter."""
    ino = os.stat(lock_path(store)).st_ino
    entries = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        blocked = fields[1] == "->"
        if blocked:
            fields = fields[1:]
        if fields[1] == "FLOCK" and fields[5].split(":")[-1] == str(ino):
            entries.append((blocked, int(fields[4])))
    return entries


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _hold_write(path: str, held: Event, release: Event) -> None:
    """Another process: one write transaction through the package, held open until told to commit."""
    dcache.open_db(path)
    with db.write():
        dcache.touch_batch_job("job-1", now=5_000)
        held.set()
        release.wait(WAIT_S)
    dcache.close_db()


def test_a_writer_waits_in_the_os_lock_queue_not_in_sqlites_busy_handler(file_store: Path) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_write, args=(str(file_store), held, release))
    holder.start()
    statements: list[str] = []
    db.connection().set_trace_callback(statements.append)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            dcache.update_batch_target("job-1", 0, "done", result="é", now=6_000)
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    try:
        assert held.wait(WAIT_S)
        assert flock_entries(file_store) == [(False, holder.pid)]
        writer.start()
        # This process waits on the lock file, behind the holder...
        wait_for(lambda: (True, os.getpid()) in flock_entries(file_store), "this process blocked on the lock")
        # ... and has not begun its transaction: SQLite's busy handler is not where it waits.
        assert not any(s.startswith("BEGIN") for s in statements)
    finally:
        release.set()
        holder.join(WAIT_S)
        writer.join(WAIT_S)
        db.connection().set_trace_callback(None)
    assert holder.exitcode == 0 and errors == []
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == ["BEGIN IMMEDIATE", "COMMIT"]
    job = dcache.batch_job("job-1")
    assert job is not None and (job.lease, job.targets_done) == (6_000, 1)  # after the holder's 5_000
    assert lock_is_free(file_store)


def test_without_the_queue_the_writer_waits_in_the_busy_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the queue (as scripts/bench.py measures it): no lock file, no queue."""
    path = tmp_path / "plain.db"
    without_queue(monkeypatch)
    try:
        dcache.open_db(path)
        dcache.create_batch_job(make_job("job-1"), make_targets(3))
        assert not os.path.exists(lock_path(path))
    finally:
        dcache.close_db()


class NoQueue(WriterQueue):
    """A writers' queue that is never taken: writers wait in SQLite's busy handler alone."""

    def __init__(self, store_path: str | None, timeout: float) -> None:
        super().__init__(None, timeout)


def without_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores opened from now on have no writers' queue (as before it, or another program's)."""
    monkeypatch.setattr(sqlite_database, "WriterQueue", NoQueue)


#: An ad-hoc write, for the idioms inside which the rules cannot run (manual commit, a bare begin()).
RAW_WRITE = "UPDATE batch_job SET lease = 7000 WHERE id = 'job-1'"


def _raw_commit() -> None:
    db.begin()
    db.execute_sql(RAW_WRITE)
    assert not lock_is_free_now()
    db.execute_sql("COMMIT")


def lock_is_free_now() -> bool:
    path = db.obj.path
    assert path is not None
    return lock_is_free(Path(path))


def _manual() -> None:
    with db.manual_commit():
        db.begin()
        db.execute_sql(RAW_WRITE)
        assert not lock_is_free_now()
        db.commit()
        assert lock_is_free_now()
        db.begin()
        assert not lock_is_free_now()
        db.rollback()


def _inside(block: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        with block():
            dcache.touch_batch_job("job-1", now=7_000)
            assert not lock_is_free_now()

    return run


def _session_commit() -> None:
    with session():
        dcache.touch_batch_job("job-1", now=7_000)
        assert not lock_is_free_now()


class Refused(Exception):
    pass


def _raising(block: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        with pytest.raises(Refused), block():
            dcache.touch_batch_job("job-1", now=7_000)
            assert not lock_is_free_now()
            raise Refused

    return run


def _savepoints() -> None:
    with db.atomic():
        with db.atomic():  # a savepoint: leaving it keeps the transaction, and the lock
            dcache.touch_batch_job("job-1", now=7_000)
        assert not lock_is_free_now()
        with pytest.raises(Refused), db.write():
            raise Refused
        assert not lock_is_free_now()


def _failing_rule() -> None:
    with pytest.raises(dcache.TargetNotFound):
        dcache.update_batch_target("job-1", 99, "done", result="x")


def _with_db() -> None:
    with db:
        dcache.touch_batch_job("job-1", now=7_000)
        assert not lock_is_free_now()


def _transaction_commit_midway() -> None:
    with db.atomic() as txn:
        dcache.touch_batch_job("job-1", now=7_000)
        txn.commit()  # commits, and begins again: the lock is taken again
        assert not lock_is_free_now()


ENDINGS: dict[str, Callable[[], None]] = {
    "write commits": _inside(db.write),
    "write rolls back": _raising(db.write),
    "rule fails": _failing_rule,
    "atomic commits": _inside(db.atomic),
    "atomic rolls back": _raising(db.atomic),
    "transaction": _inside(db.transaction),
    "with db": _with_db,
    "savepoints": _savepoints,
    "commit midway": _transaction_commit_midway,
    "session": _session_commit,
    "session rolls back": _raising(session),
    "manual commit": _manual,
    "raw COMMIT": _raw_commit,
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_every_write_transaction_holds_the_lock_until_it_ends(file_store: Path, ending: str) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    assert lock_is_free(file_store)
    ENDINGS[ending]()
    assert lock_is_free(file_store)
    dcache.touch_batch_job("job-1", now=8_000)  # and the store goes on writing
    assert lock_is_free(file_store)


def test_a_write_queued_past_the_timeout_fails_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path, timeout=0.2)
    try:
        dcache.create_batch_job(make_job("job-1"), make_targets(3))
        before = snapshot()
        with hold_lock(path):
            with pytest.raises(dcache.StoreUnavailable, match=r"locked by another process for over 0\.2 s"):
                dcache.update_batch_target("job-1", 0, "done", result="x")
            assert snapshot() == before
            with pytest.raises(dcache.StoreUnavailable, match="locked by another process"):
                dcache.touch_batch_job("job-1", now=9_000)  # behind the helper still waiting
        # The helper takes the lock once it is free, and drops it: nobody gave it to a writer.
        wait_for(lambda: lock_is_free(path) and flock_entries(path) == [], "the helper dropped the lock")
        assert snapshot() == before
        dcache.update_batch_target("job-1", 0, "done", result="x")
        assert lock_is_free(path)
    finally:
        dcache.close_db()
    wait_for(
        lambda: all(t.name != "sift-writers" for t in threading.enumerate()),
        "the helper thread ended with the store",
    )


def _hold_lock_until(path: str, held: Event, release: Event) -> None:
    """Another process holding the queue (as ``flock(1)`` would), until told to let go."""
    with hold_lock(Path(path)):
        held.set()
        release.wait(WAIT_S)


class Interrupted(Exception):
    pass


def _interrupted(signum: int, frame: Any) -> None:
    raise Interrupted  # as a KeyboardInterrupt, or a time limit's signal handler, would


@pytest.mark.slow
def test_a_writer_interrupted_while_queued_leaves_no_lock_and_no_turn_behind(file_store: Path) -> None:
    """An exception while a writer waits for its turn (a signal handler's, a KeyboardInterrupt) leaves the
    queue: when the turn comes the lock is dropped, not kept by the idle process, and no turn is kept for
    a later writer."""
    dcache.close_db()
    dcache.open_db(file_store, timeout=WAIT_S)  # queued for long: only the signal ends the wait
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    main = threading.main_thread().ident
    assert threading.get_ident() == main and main is not None  # Python runs signal handlers here
    me = os.getpid()

    def holding() -> tuple[Any, Event]:
        held, release = ctx.Event(), ctx.Event()
        holder = ctx.Process(target=_hold_lock_until, args=(str(file_store), held, release))
        holder.start()
        assert held.wait(WAIT_S)
        return holder, release

    def interrupt_once_queued() -> None:
        wait_for(lambda: (True, me) in flock_entries(file_store), "this process blocked on the lock")
        signal.pthread_kill(main, signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, _interrupted)
    holder, release = holding()
    interrupter = threading.Thread(target=interrupt_once_queued)
    try:
        interrupter.start()
        with pytest.raises(Interrupted):
            dcache.touch_batch_job("job-1", now=5_000)
        interrupter.join(WAIT_S)
    finally:
        signal.signal(signal.SIGALRM, previous)
        release.set()
        holder.join(WAIT_S)
    assert holder.exitcode == 0
    # The helper gets the lock once the holder is gone, and drops it: this idle process holds nothing.
    wait_for(lambda: lock_is_free(file_store) and flock_entries(file_store) == [], "the lock dropped")
    assert not db.obj.writers.held
    writer = ctx.Process(target=_write_once, args=(str(file_store), 6_000))
    writer.start()
    writer.join(WAIT_S)
    assert writer.exitcode == 0  # another process writes
    # This process's next write waits its turn behind another holder (no turn left over), then holds it.
    holder, release = holding()
    seen: list[list[tuple[bool, int]]] = []

    def write() -> None:
        with db.write():
            dcache.touch_batch_job("job-1", now=7_000)
            seen.append(flock_entries(file_store))

    queued = threading.Thread(target=write)
    try:
        queued.start()
        wait_for(lambda: (True, me) in flock_entries(file_store), "this process queued behind the holder")
        assert seen == []
    finally:
        release.set()
        holder.join(WAIT_S)
        queued.join(WAIT_S)
    assert seen == [[(False, me)]]
    job = dcache.batch_job("job-1")
    assert job is not None and job.lease == 7_000
    assert lock_is_free(file_store)


def _write_once(path: str, now: int) -> None:
    dcache.open_db(path)
    dcache.touch_batch_job("job-1", now=now)
    job = dcache.batch_job("job-1")
    assert job is not None and job.lease == now
    dcache.close_db()


def test_reads_never_take_the_lock(file_store: Path) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    with hold_lock(file_store):  # another process writes: reads go on, on WAL snapshots
        assert dcache.batch_job("job-1") is not None
        assert len(dcache.batch_targets("job-1") or []) == 3
        assert dcache.batch_nbytes() == 0
        assert dcache.live_batch_jobs("alice") == 1
        assert dcache.sweep_batch(3_600, now=2_000) == 0  # a no-op sweep reads only
        assert dcache.evict_batch_oldest(10**12) == 0  # a no-op eviction too
        with db.atomic("DEFERRED"):  # a deferred transaction only reads until it writes
            assert db.execute_sql("SELECT count(*) FROM batch_job").fetchone() == (1,)


def test_a_read_only_store_never_takes_or_makes_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with pytest.MonkeyPatch.context() as monkeypatch:
        without_queue(monkeypatch)  # a store written by another program: no lock file beside it
        try:
            dcache.open_db(path)
            dcache.create_batch_job(make_job("job-1"), make_targets(3))
        finally:
            dcache.close_db()
    assert not os.path.exists(lock_path(path))
    dcache.open_db(path, readonly=True)
    try:
        with db:
            assert dcache.batch_job("job-1") is not None
        with pytest.raises(dcache.StoreReadOnly):
            dcache.touch_batch_job("job-1", now=9_000)
        assert db.obj.writers.path is None
    finally:
        dcache.close_db()
    assert not os.path.exists(lock_path(path))


def test_an_in_memory_store_has_no_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    dcache.open_db(":memory:")
    try:
        dcache.create_batch_job(make_job("job-1"), make_targets(3))
        assert db.obj.writers.path is None
    finally:
        dcache.close_db()
    assert list(tmp_path.iterdir()) == []


def _write_and_hang(path: str, ready: Event) -> None:
    dcache.open_db(path)
    db.begin()  # a transaction left open: the process is killed inside it
    db.execute_sql(RAW_WRITE)
    ready.set()
    time.sleep(WAIT_S)


def test_a_process_killed_inside_its_transaction_releases_the_lock(file_store: Path) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    ready = ctx.Event()
    child = ctx.Process(target=_write_and_hang, args=(str(file_store), ready))
    child.start()
    try:
        assert ready.wait(WAIT_S)
        assert flock_entries(file_store) == [(False, child.pid)]
    finally:
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(WAIT_S)
    assert lock_is_free(file_store)
    dcache.touch_batch_job("job-1", now=6_000)  # its transaction was never committed; ours is
    job = dcache.batch_job("job-1")
    assert job is not None and job.lease == 6_000


def _fork_inside_transaction_then_wait(path: str, pids: Any) -> None:
    """A process that forks from inside its own write transaction; the child lives on, idle, after this
    process is killed. The pids go out once the child runs: the store's fork handler, which closes the
    child's copy of the lock file, runs in the child, and a busy machine may not have run the child yet."""
    dcache.open_db(path)
    db.begin()
    db.execute_sql(RAW_WRITE)
    running, started = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(started, b"1")  # os.fork() has returned here: the handlers have run
        time.sleep(WAIT_S)
        os._exit(0)
    assert os.read(running, 1) == b"1"
    pids.put((os.getpid(), child))
    time.sleep(WAIT_S)


def test_a_forked_child_does_not_keep_its_dead_parents_lock(file_store: Path) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    pids = ctx.Queue()
    parent = ctx.Process(target=_fork_inside_transaction_then_wait, args=(str(file_store), pids))
    parent.start()
    parent_pid, child_pid = pids.get(timeout=WAIT_S)
    try:
        assert not lock_is_free(file_store)
        os.kill(parent_pid, signal.SIGKILL)
        wait_for(lambda: parent.exitcode is not None, "the parent died")  # its child holds the join pipe
        # The child still runs; had it kept the descriptor it inherited, the lock would still be held.
        assert os.path.exists(f"/proc/{child_pid}")
        assert lock_is_free(file_store)
        assert flock_entries(file_store) == []
    finally:
        os.kill(child_pid, signal.SIGKILL)


def test_a_forked_child_writes_behind_its_parent_with_a_lock_of_its_own(file_store: Path) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))  # the parent's lock file is open
    with db.write():
        dcache.touch_batch_job("job-1", now=5_000)
        pid = os.fork()
        if pid == 0:  # the child: forked inside the parent's transaction, it cannot use the store
            code = 1
            try:
                try:
                    dcache.touch_batch_job("job-1", now=9_999)
                except dcache.StoreUnavailable as exc:  # at once, not after waiting for the queue
                    if "forked inside a transaction" in str(exc):
                        code = 2 if lock_is_free_now() else 0  # the parent's lock is still held
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)  # the parent's transaction lasts until the child is done
    assert os.waitstatus_to_exitcode(status) == 0
    assert lock_is_free(file_store)
    pid = os.fork()
    if pid == 0:  # forked outside a transaction: writes with a lock of its own
        code = 1
        try:
            dcache.touch_batch_job("job-1", now=6_000)
            code = 0 if db.obj.writers.path == lock_path(file_store) and lock_is_free_now() else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    job = dcache.batch_job("job-1")
    assert job is not None and job.lease == 6_000
    dcache.touch_batch_job("job-1", now=7_000)
    assert lock_is_free(file_store)


def test_the_lock_file_takes_the_store_files_mode_and_follows_a_chmod(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path)
    try:
        dcache.create_batch_job(make_job("job-1"), make_targets(3))
        assert stat.S_IMODE(os.stat(lock_path(path)).st_mode) == 0o600
    finally:
        dcache.close_db()
    os.chmod(path, 0o660)  # shared with a group
    dcache.open_db(path)
    try:
        dcache.touch_batch_job("job-1", now=2_000)
        assert stat.S_IMODE(os.stat(lock_path(path)).st_mode) == 0o660
    finally:
        dcache.close_db()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_root_gives_a_new_lock_file_to_the_store_files_owner(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path)
    dcache.close_db()
    os.unlink(lock_path(path))
    os.chown(path, 4321, 4322)
    dcache.open_db(path)
    try:
        dcache.create_batch_job(make_job("job-1"), make_targets(3))
        info = os.stat(lock_path(path))
        assert (info.st_uid, info.st_gid) == (4321, 4322)
    finally:
        dcache.close_db()


@pytest.mark.parametrize("obstacle", ["dangling symlink", "directory"])
def test_without_a_usable_lock_file_the_store_writes_as_before(file_store: Path, obstacle: str) -> None:
    """A lock file that cannot be opened, or is not a file, leaves writers to SQLite's busy handler: the
    store still writes, outside any queue."""
    dcache.close_db()
    os.unlink(lock_path(file_store))
    if obstacle == "directory":
        os.mkdir(lock_path(file_store))
    else:
        os.symlink(file_store.parent / "missing" / "lock", lock_path(file_store))
    dcache.open_db(file_store)
    with db.write():
        dcache.create_batch_job(make_job("job-1"), make_targets(3))
        assert not db.obj.writers.held
    assert dcache.batch_job("job-1") is not None


def _create_job(path: str) -> None:
    dcache.open_db(path, timeout=1)
    with db.write():
        dcache.create_batch_job(make_job("job-1"), make_targets(3))
        assert not db.obj.writers.held
    dcache.close_db()


def test_a_fifo_in_place_of_the_lock_file_leaves_the_store_on_the_busy_handler(tmp_path: Path) -> None:
    """Opening a FIFO would block until a writer opens it: the lock file is opened without blocking, and
    a FIFO there is left alone like any other non-file. The write runs in a child so that a regression
    fails here instead of hanging the run."""
    path = tmp_path / "store.db"
    dcache.open_db(path)
    dcache.close_db()
    os.unlink(lock_path(path))
    os.mkfifo(lock_path(path), 0o644)
    mode = os.stat(lock_path(path)).st_mode
    child = ctx.Process(target=_create_job, args=(str(path),))
    child.start()
    child.join(WAIT_S)
    if child.exitcode is None:
        child.kill()
        child.join(WAIT_S)
        pytest.fail("the write hung opening the FIFO")
    assert child.exitcode == 0
    assert os.stat(lock_path(path)).st_mode == mode  # still a FIFO, its mode untouched
    dcache.open_db(path)
    try:
        assert dcache.batch_job("job-1") is not None
    finally:
        dcache.close_db()


def test_a_lock_file_that_cannot_take_the_stores_mode_is_closed_and_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the new lock file cannot be given the store's mode, writers go on without the queue, and the
    descriptor opened for it is closed, not left behind for the life of the process."""
    path = tmp_path / "store.db"
    dcache.open_db(path)
    dcache.close_db()
    os.unlink(lock_path(path))
    opened_before = sorted(os.listdir("/proc/self/fd"))

    def refuse(fd: int, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchmod", refuse)
    dcache.open_db(path)
    try:
        with db.write():
            dcache.create_batch_job(make_job("job-1"), make_targets(3))
            assert not db.obj.writers.held
        assert dcache.batch_job("job-1") is not None
    finally:
        dcache.close_db()
    assert sorted(os.listdir("/proc/self/fd")) == opened_before


# -- SQLite's automatic checkpoint, moved out of the queue ---------------------------------------------------


def autocheckpoint() -> int:
    value: int = db.execute_sql("PRAGMA wal_autocheckpoint").fetchone()[0]
    return value


def wal_index_frames(store: Path) -> tuple[int, int]:
    """The -wal file's frames and how many are copied back, read as the store reads them (the WAL index
    header's mxFrame and nBackfill)."""
    with open(f"{store}-shm", "rb") as f:
        header = f.read(100)
    max_frame, backfilled = (int.from_bytes(header[i : i + 4], sys.byteorder) for i in (16, 96))
    return max_frame, backfilled


def frames_pending(store: Path) -> int:
    """Frames of the -wal file not yet checkpointed, once a checkpoint running aside has ended."""
    for thread in threading.enumerate():
        if thread.name == "sift-checkpoint":
            thread.join()
    max_frame, backfilled = wal_index_frames(store)
    return max_frame - backfilled


def unreadable(fd: int, length: int, offset: int) -> bytes:
    """``os.pread`` of a WAL index that cannot be read."""
    raise OSError(5, "Input/output error")


def write_results(count: int, job_id: str = "big", each: Callable[[], None] = lambda: None) -> None:
    """``count`` write transactions of a 4 KB result each: a few -wal pages apiece; ``each`` after each."""
    dcache.create_batch_job(make_job(job_id, targets_total=count), make_targets(count))
    for idx in range(count):
        dcache.update_batch_target(job_id, idx, "done", result="r" * 4096, now=2_000)
        each()


class NoNewThread(threading.Thread):
    def start(self) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")


@pytest.mark.parametrize(
    "store_kind",
    [
        "plain",
        pytest.param("durable", marks=pytest.mark.slow),
        pytest.param("no thread", marks=pytest.mark.slow),
    ],
)
def test_checkpoints_run_aside_while_the_wal_is_short_then_with_every_writer_held(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, store_kind: str
) -> None:
    """SQLite would checkpoint inside the COMMIT that fills the -wal file past 1,000 pages, with every other
    process's writer queued behind the copy and its fsyncs: the store turns that off, and checkpoints by the
    same rule, on a thread of its own once the queue is free (a durable store: on the writing thread), the
    writes going on. From WAL_RESTART_FRAMES frames on, on the writing thread with the lock and the queue
    still held: no write comes in between, so the file starts again and stays short. Where no thread can
    be started (an interpreter shutting down), on the writing thread: the write never fails for it."""
    if store_kind == "durable":
        dcache.close_db()
        dcache.open_db(file_store, durable=True)
    if store_kind == "no thread":
        monkeypatch.setattr(threading, "Thread", NoNewThread)  # as while an interpreter shuts down
    on_writer_only = store_kind != "plain"  # every checkpoint on the writing thread
    assert autocheckpoint() == 0
    writer = threading.current_thread()
    calls: list[tuple[str, bool, bool, bool]] = []
    checkpoint = db.obj._checkpoint_once

    def watched(*, truncate: bool = False) -> bool:
        here = threading.current_thread()
        on_writer = here is writer
        # the queue (process-wide) is only the writing thread's to hold: another thread writes on meanwhile
        queue_held = on_writer and db.obj.writers.held and not lock_is_free(file_store)
        long = wal_index_frames(file_store)[0] >= WAL_RESTART_FRAMES
        calls.append(("writer" if on_writer else here.name, queue_held, db.obj.lock._is_owned(), long))
        return bool(checkpoint(truncate=truncate))

    monkeypatch.setattr(db.obj, "_checkpoint_once", watched)
    longest = [0]
    # Twice, from the file's start until it is long, another connection's read keeps every checkpoint from
    # copying the frames after it, as writes beside a checkpoint aside do (one may copy every frame before
    # the next write, which then starts the file again short of long); then the checkpoints go their way.
    reader: list[sqlite3.Connection] = []
    reads = [0]

    def look() -> None:
        max_frame = wal_index_frames(file_store)[0]
        if reader and max_frame >= WAL_RESTART_FRAMES:
            reader.pop().close()
        elif not reader and max_frame < WAL_RESTART_FRAMES and reads[0] < 2:
            reads[0] += 1
            reader.append(sqlite3.connect(file_store, isolation_level=None))
            reader[0].execute("BEGIN")
            reader[0].execute("SELECT count(*) FROM batch_job").fetchall()
        longest[0] = max(longest[0], max_frame)

    try:
        write_results(3_000, each=look)  # about 9 frames each: the file is started again several times
    finally:
        for conn in reader:
            conn.close()
    aside = [c for c in calls if c[0] == "sift-checkpoint"]
    here = [c for c in calls if c[0] == "writer"]
    assert {c[0] for c in calls} == ({"writer"} if on_writer_only else {"sift-checkpoint", "writer"}), calls
    assert on_writer_only or len([c for c in here if c[3]]) >= 2, calls  # the file was long at least twice
    assert all(owned and queue_held == long for _, queue_held, owned, long in here), calls
    assert not any(owned for _, _, owned, _ in aside), calls
    # one checkpoint due past WAL_RESTART_FRAMES, at most one round of frames on, and one write's frames
    bound = WAL_RESTART_FRAMES + WAL_AUTOCHECKPOINT_PAGES + 16
    assert longest[0] <= bound
    page_size = int(db.execute_sql("PRAGMA page_size").fetchone()[0])
    assert os.path.getsize(f"{file_store}-wal") <= 32 + bound * (24 + page_size)
    assert frames_pending(file_store) < WAL_AUTOCHECKPOINT_PAGES


def _write_results_in_process(path: str, job_id: str, count: int, start: Event) -> None:
    dcache.open_db(path)
    start.wait(WAIT_S)
    write_results(count, job_id)
    dcache.close_db()


@pytest.mark.slow
def test_processes_writing_at_once_keep_the_wal_short(file_store: Path) -> None:
    """A checkpoint copies only the frames written before it began, and other processes write on beside
    one made after the queue is left: the file would never start again (over 150 MB here). The one made
    with the queue held, once the file is long, lets it start again. It may wait a moment for another
    process's checkpoint running aside (SQLite runs one at a time), so the bound here is twice the
    file's length at which it is made."""
    start = ctx.Event()
    writers = [
        ctx.Process(target=_write_results_in_process, args=(str(file_store), f"p{i}", 1_500, start))
        for i in range(3)
    ]
    for process in writers:
        process.start()
    start.set()
    for process in writers:
        process.join(WAIT_S * 5)
        assert process.exitcode == 0
    assert all(job_final_done(f"p{i}", 1_500) for i in range(3))
    page_size = int(db.execute_sql("PRAGMA page_size").fetchone()[0])
    assert os.path.getsize(f"{file_store}-wal") <= 32 + 2 * WAL_RESTART_FRAMES * (24 + page_size)


def job_final_done(job_id: str, count: int) -> bool:
    job = dcache.batch_job(job_id)
    return job is not None and job.targets_done == count


def test_without_the_queue_sqlite_checkpoints_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_queue(monkeypatch)
    try:
        dcache.open_db(tmp_path / "plain.db")
        assert autocheckpoint() == 1000
    finally:
        dcache.close_db()


def test_an_unreadable_wal_index_gives_the_checkpoint_back_to_sqlite(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "pread", unreadable)
    write_results(1, "small")
    assert autocheckpoint() == 1000
    monkeypatch.undo()
    write_results(600)  # now as SQLite alone would: inside the COMMIT
    assert frames_pending(file_store) < 1000


def test_sweeps_and_evictions_leave_the_checkpoint_to_the_store(file_store: Path) -> None:
    """Bulk writes turn SQLite's checkpoint off for their run, and after it leave it off on a queued store."""
    dcache.create_batch_job(make_job("old", lease=1), make_targets(3))
    assert dcache.sweep_batch(10, now=1_000) == 1
    assert autocheckpoint() == 0


def _in_child(check: Callable[[], bool]) -> bool:
    """Run ``check`` in a forked child, which opens a connection of its own on its first call."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if check() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@pytest.mark.slow
@pytest.mark.parametrize("index", ["readable", "unreadable"])
def test_a_forked_childs_connection_keeps_the_stores_checkpoint_rule(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, index: str
) -> None:
    """A child's new connection checkpoints as the store does by then: after the queue, or (once the WAL
    index could not be read) by SQLite itself, never not at all."""
    if index == "unreadable":
        monkeypatch.setattr(os, "pread", unreadable)
        write_results(1, "small")
        monkeypatch.undo()
    expected = 0 if index == "readable" else 1000

    def child() -> bool:
        if autocheckpoint() != expected:
            return False
        write_results(600)
        return frames_pending(file_store) < 1000

    assert _in_child(child)
