"""The long -wal file's checkpoint beside another process's.

From ``WAL_RESTART_FRAMES`` frames on, the store checkpoints with every writer held, so that the next write
starts the file again. While another process's checkpoint holds SQLite's checkpoint lock (byte 121 of the
``-shm`` file), that checkpoint copies nothing and says so only in its row (busy 1): it is tried again for
at most ``CHECKPOINT_WAIT_S``; once it gave up, once at each write that makes it due, until a checkpoint
copies again.

The other process here holds the lock itself, as a checkpoint does, until the test tells it to let go.
No timing is asserted: the store's sleeps are the test's (they count, and move a clock of the test's).
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Event
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import make_job, make_targets
from test_writer_queue import lock_is_free, wal_index_frames

from sift import dcache
from sift.dcache.backends.sqlite import wal
from sift.dcache.backends.sqlite.settings import (
    CHECKPOINT_RETRY_S,
    WAL_AUTOCHECKPOINT_PAGES,
    WAL_RESTART_FRAMES,
)

pytestmark = pytest.mark.sqlite_only

ctx = multiprocessing.get_context("spawn")
WAIT_S = 60.0  # how long a test waits for another process before it fails (never a timing assertion)
#: SQLite's checkpoint lock: WAL_CKPT_LOCK, one byte at 120 + 1 of the -shm file (sqlite.org/walformat).
CHECKPOINT_LOCK_BYTE = 121
#: A bound on the frames one write of ``Writes.one`` appends (8 to 15 seen: its result's overflow page, the
#: row, the job, the indexes), far under the 1,000 more the long file grows by when its checkpoint gives up.
ONE_WRITE_FRAMES = 64
JOB = "big"
WRITES = 3_000  # enough to take the file past WAL_RESTART_FRAMES more than once


def _hold_checkpoint_lock(path: str, held: Event, release: Event) -> None:
    """Another process: SQLite's checkpoint lock on the store, held as a checkpoint holds it."""
    fd = os.open(f"{path}-shm", os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, CHECKPOINT_LOCK_BYTE)
    held.set()
    release.wait(WAIT_S)
    os.close(fd)


class Holder:
    """The other process holding the checkpoint lock, until ``let_go``."""

    def __init__(self, store: Path) -> None:
        self.held, self.release = ctx.Event(), ctx.Event()
        self.process = ctx.Process(target=_hold_checkpoint_lock, args=(str(store), self.held, self.release))
        self.process.start()
        assert self.held.wait(WAIT_S), "the other process never took the checkpoint lock"

    def let_go(self) -> None:
        self.release.set()
        self.process.join(WAIT_S)
        assert self.process.exitcode == 0


@pytest.fixture
def holding(file_store: Path) -> Iterator[Callable[[], Holder]]:
    """Start a holder of the store's checkpoint lock (each let go of at the end)."""
    holders: list[Holder] = []

    def start() -> Holder:
        holders.append(Holder(file_store))
        return holders[-1]

    dcache.create_batch_job(make_job(JOB, targets_total=WRITES), make_targets(WRITES))
    yield start
    for holder in holders:
        holder.release.set()
        holder.process.join(WAIT_S)


class Clock:
    """The store's ``time`` in wal.py: each ``sleep`` counts, moves ``monotonic`` on by ``step`` seconds
    (none: a clock standing still, as freezegun's), then runs ``then``."""

    def __init__(self, step: float = CHECKPOINT_RETRY_S, then: Callable[[], None] = lambda: None) -> None:
        self.now = 1_000.0
        self.step = step
        self.sleeps = 0
        self.then = then

    def sleep(self, seconds: float) -> None:
        assert seconds == CHECKPOINT_RETRY_S
        self.sleeps += 1
        self.now += self.step
        self.then()

    def monotonic(self) -> float:
        return self.now


def use(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    monkeypatch.setattr(wal, "time", SimpleNamespace(sleep=clock.sleep, monotonic=clock.monotonic))


class Writes:
    """Writes of a 4 KB result, one a call, to the job's next target; each returns the -wal file's frames."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.next = 0

    def one(self) -> int:
        assert self.next < WRITES, "the job's targets ran out"
        dcache.update_batch_target(JOB, self.next, "done", result="r" * 4096, now=2_000)
        self.next += 1
        return wal_index_frames(self.store)[0]

    def until_restart(self) -> int:
        """Write until a write starts the file again; the most frames before it."""
        longest = 0
        while (frames := self.one()) >= longest:
            longest = frames
        return longest


def test_the_long_files_checkpoint_waits_for_another_processs_and_the_file_starts_again(
    file_store: Path, holding: Callable[[], Holder], monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = holding()
    clock = Clock(then=lambda: holder.let_go() if holder.process.exitcode is None else None)
    use(monkeypatch, clock)
    # Every checkpoint found the lock held, so the file grew to the long file's checkpoint. That one found
    # it held too, waited, and copied every frame once the other process let go: the next write started
    # the file again. Without the wait it would give up at once, and the file grow on (the lock held).
    longest = Writes(file_store).until_restart()
    assert clock.sleeps == 1
    assert WAL_RESTART_FRAMES <= longest <= WAL_RESTART_FRAMES + ONE_WRITE_FRAMES


def test_given_up_it_tries_once_a_write_until_a_checkpoint_copies_then_waits_again(
    file_store: Path, holding: Callable[[], Holder], monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = holding()
    clock = Clock(step=1.0)  # past its deadline after the first sleep
    use(monkeypatch, clock)
    busy: list[bool] = []  # what each checkpoint of the store found
    checkpoint = dcache.db.obj._checkpoint_once

    def watched(*, truncate: bool = False) -> bool:
        busy.append(bool(checkpoint(truncate=truncate)))
        return busy[-1]

    monkeypatch.setattr(dcache.db.obj, "_checkpoint_once", watched)
    writes = Writes(file_store)
    while not clock.sleeps:  # to the long file's first checkpoint
        frames = writes.one()
    assert frames >= WAL_RESTART_FRAMES
    assert clock.sleeps == 1  # then it gave up, and left the writers' queue
    assert lock_is_free(file_store)
    # each later write tries once, without waiting, and the file grows meanwhile
    before = len(busy)
    for _ in range(100):
        frames = writes.one()
    assert clock.sleeps == 1
    assert len(busy) - before >= 100 and all(busy[before:])
    assert frames > WAL_RESTART_FRAMES + 100
    # the other process lets go: the next write's checkpoint copies, and the write after starts the file again
    holder.let_go()
    after = len(busy)
    writes.until_restart()
    assert False in busy[after:]
    # a checkpoint copied: the long file's next checkpoint that finds the lock held waits again
    holding()
    while clock.sleeps == 1:
        writes.one()
    assert clock.sleeps == 2


def submit(number: int) -> None:
    """A job of 20 targets with 3 KB of options each: a write transaction of the rules (``db.write()``)."""
    options = json.dumps({"pad": "p" * 3_000})
    dcache.create_batch_job(
        make_job(f"submitted-{number}", targets_total=20), make_targets(20, options=options)
    )


@pytest.mark.parametrize("path", ["a result", "a submission"])
def test_an_interrupt_while_it_waits_leaves_no_lock_held(
    file_store: Path, holding: Callable[[], Holder], monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """An interrupt in the wait leaves the store's write (its own transaction, committed before) with the
    writers' queue and the store's lock let go of: on the results' path, and on a write transaction's."""
    holding()
    interrupted: list[bool] = []

    def interrupt() -> None:
        if interrupted:
            pytest.fail("the store waited again after the interrupt")
        interrupted.append(True)
        raise KeyboardInterrupt

    use(monkeypatch, Clock(then=interrupt))
    writes = Writes(file_store)
    submitted = 0
    with pytest.raises(KeyboardInterrupt):
        for submitted in range(WRITES):  # the long file comes at about 100 submissions
            if path == "a result":
                writes.one()
            else:
                submit(submitted)
        pytest.fail("the store never waited")
    # before any other call of the store, which would leave the queue first
    assert lock_is_free(file_store)
    # committed before its checkpoint
    if path == "a result":
        written = dcache.batch_targets(JOB)
        assert written is not None and written[writes.next].status == "done"
        writes.next += 1
    else:
        assert dcache.batch_job(f"submitted-{submitted}") is not None
    assert lock_is_free(file_store)
    read: list[object] = []
    other = threading.Thread(target=lambda: read.append(dcache.batch_job(JOB)), daemon=True)
    other.start()
    other.join(WAIT_S)
    assert read and read[0] is not None, "another thread could not use the store"
    use(monkeypatch, Clock())
    writes.one()
    assert lock_is_free(file_store)


def test_a_checkpoint_that_a_reader_keeps_from_copying_all_does_not_wait(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only SQLite's busy row waits: a reader's snapshot is another matter, which waiting would not end."""
    dcache.create_batch_job(make_job(JOB, targets_total=WRITES), make_targets(WRITES))
    clock = Clock()
    use(monkeypatch, clock)
    reader = sqlite3.connect(file_store, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM batch_target").fetchall()  # a snapshot from before the writes
        writes = Writes(file_store)
        while writes.one() < WAL_RESTART_FRAMES + WAL_AUTOCHECKPOINT_PAGES:
            pass
        max_frame, backfilled = wal_index_frames(file_store)
        assert backfilled < max_frame  # the long file's checkpoints copied only what the reader let them
        assert clock.sleeps == 0
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("timeout", "step", "sleeps"),
    [
        # CHECKPOINT_WAIT_S on the clock: 42 x 0.006 s is the first past 0.25 s
        (10.0, 0.006, 42),
        # a quarter of a shorter timeout: 0.01 s
        (0.04, 0.006, 2),
        # a clock standing still (freezegun's): a count of tries, CHECKPOINT_WAIT_S / CHECKPOINT_RETRY_S
        (10.0, 0.0, 50),
        # and a quarter of a shorter timeout's worth of them
        (0.04, 0.0, 2),
    ],
)
def test_the_wait_ends_at_its_deadline_or_its_count_of_tries(
    file_store: Path,
    holding: Callable[[], Holder],
    monkeypatch: pytest.MonkeyPatch,
    timeout: float,
    step: float,
    sleeps: int,
) -> None:
    dcache.open_db(file_store, timeout=timeout)
    holding()
    clock = Clock(step=step)
    use(monkeypatch, clock)
    writes = Writes(file_store)
    while not clock.sleeps:
        writes.one()
    assert clock.sleeps == sleeps
