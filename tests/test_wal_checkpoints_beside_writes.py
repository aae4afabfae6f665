"""Checkpoints of the -wal file made while writes go on beside them.

A checkpoint copies only the frames written before it began. The store's checkpoint aside is made again
while WAL_AUTOCHECKPOINT_PAGES frames or more still wait and the last one copied more, or a write made one
due while it ran, until the store closes, so the last writes' frames do not wait for a later write; a
reader's older snapshot, which holds the rest back, ends those rounds, and the thread then waits for the
next write's ask rather than a thread being started for each write. And the long file's checkpoint, with
every writer held, comes each time the file grew by WAL_AUTOCHECKPOINT_PAGES frames past
WAL_RESTART_FRAMES however few frames wait, so that checkpoints of other connections copying nearly every
frame cannot keep the file from starting again.

The checkpoints beside the writes are played here in order, with a reader's snapshot where a copy must
stop short, and the thread aside waited for where a write's ask must start its round: no timing decides
what is asserted."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import make_job, make_targets
from test_writer_queue import frames_pending, wal_index_frames

from sift import dcache
from sift.dcache import db
from sift.dcache.backends.sqlite import wal
from sift.dcache.backends.sqlite.settings import WAL_AUTOCHECKPOINT_PAGES, WAL_RESTART_FRAMES

pytestmark = pytest.mark.sqlite_only

WAIT_S = 60.0  # how long a test waits for another thread before it fails (never a timing assertion)
#: The frames one 4 KB result's write appends (8 to 15 seen), as test_writer_queue bounds the file with.
ONE_WRITE_FRAMES = 16
#: The most checkpoint calls one aside thread may make here before the test stops it: a loop that never
#: ends would otherwise spin on beside the rest of the session.
MOST_CALLS = 10
JOB = "big"


def write_one(store: Path, idx: int) -> tuple[int, int]:
    """Target ``idx``'s 4 KB result, in a write transaction of its own; then the file's frames and how
    many are copied back."""
    dcache.update_batch_target(JOB, idx, "done", result="r" * 4096, now=2_000)
    return wal_index_frames(store)


def write_rest(store: Path, first: int, targets: int) -> tuple[int, int]:
    """Targets ``first`` on to ``targets``' 16 KB results in one write transaction (thousands of frames);
    then the file's frames and how many are copied back."""
    results = [{"idx": idx, "status": "done", "result": "r" * 16384} for idx in range(first, targets)]
    dcache.update_batch_targets(JOB, results, now=2_000)
    return wal_index_frames(store)


class Reader:
    """Another connection in a read transaction: its snapshot keeps any checkpoint from copying the frames
    written after it began, and the file from starting again."""

    def __init__(self, store: Path) -> None:
        self.conn = sqlite3.connect(store, isolation_level=None, check_same_thread=False)
        self.conn.execute("BEGIN")
        self.conn.execute("SELECT count(*) FROM batch_job").fetchall()

    def end(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.close()


@pytest.fixture
def readers(file_store: Path) -> Iterator[list[Reader]]:
    """Readers a test starts (``readers.append(Reader(...))``), each ended at the end if it is not."""
    started: list[Reader] = []
    yield started
    for reader in started:
        reader.conn.close()


def a_reader_after_the_first_writes(store: Path, readers: list[Reader], targets: int) -> int:
    """A job of ``targets`` targets, its first 20 written, then a reader's snapshot begun; the next idx."""
    dcache.create_batch_job(make_job(id=JOB, targets_total=targets), make_targets(targets))
    for idx in range(20):
        write_one(store, idx)
    readers.append(Reader(store))
    return 20


def aside_call(calls: list[threading.Thread]) -> bool:
    """Whether the caller is the thread aside; its call then goes to ``calls``, and one past MOST_CALLS
    stops it with an error."""
    here = threading.current_thread()
    if here.name != "sift-checkpoint":
        return False
    calls.append(here)
    if len(calls) > MOST_CALLS:
        raise RuntimeError("the checkpoint aside does not stop")
    return True


def aside_threads_ended() -> bool:
    for thread in threading.enumerate():
        if thread.name == "sift-checkpoint":
            thread.join(WAIT_S)
            if thread.is_alive():
                return False
    return True


def test_the_checkpoint_aside_copies_again_what_its_first_copy_left(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, readers: list[Reader]
) -> None:
    """A reader's snapshot from the first write stops the first checkpoint aside short of the frames after
    it, as writes beside it would (which it cannot have copied): WAL_AUTOCHECKPOINT_PAGES frames still wait
    when it ends, and the reader ends then. The thread copies again, and fewer than that many wait."""
    calls: list[threading.Thread] = []
    checkpoint = db.obj._checkpoint_once

    def reader_ends_after_the_first(*, truncate: bool = False) -> bool:
        busy = checkpoint(truncate=truncate)
        if aside_call(calls) and readers:
            readers.pop().end()
        return bool(busy)

    monkeypatch.setattr(db.obj, "_checkpoint_once", reader_ends_after_the_first)
    targets = 400
    dcache.create_batch_job(make_job(id=JOB, targets_total=targets), make_targets(targets))
    mark, _ = write_one(file_store, 0)
    readers.append(Reader(file_store))
    max_frame, _ = write_rest(file_store, 1, targets)  # which starts the checkpoint aside
    assert max_frame - mark >= WAL_AUTOCHECKPOINT_PAGES  # what the reader leaves uncopied
    assert aside_threads_ended()
    assert frames_pending(file_store) < WAL_AUTOCHECKPOINT_PAGES
    assert len(calls) == 2 and calls[0] is calls[1], calls  # one thread: its checkpoint, and one more


def test_writes_while_the_thread_aside_ends_get_their_checkpoint(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread aside has read that its checkpoint left fewer than WAL_AUTOCHECKPOINT_PAGES frames
    waiting, and is about to end, when writes make another due: it is asked for another round, makes it,
    and fewer than that many frames wait once it ends."""
    decided, written = threading.Event(), threading.Event()
    reads: list[tuple[int, int]] = []
    frames = db.obj._wal_frames

    def held_after_deciding() -> tuple[int, int]:
        got: tuple[int, int] = frames()
        if threading.current_thread().name == "sift-checkpoint":
            reads.append(got)
            if len(reads) == 2:  # after its first checkpoint: what the thread decides on
                decided.set()
                written.wait(WAIT_S)
        return got

    monkeypatch.setattr(db.obj, "_wal_frames", held_after_deciding)
    targets = 400
    dcache.create_batch_job(make_job(id=JOB, targets_total=targets), make_targets(targets))
    idx = 0
    try:
        while idx < targets and not decided.is_set():  # until a write makes the checkpoint aside due
            max_frame, backfilled = write_one(file_store, idx)
            idx += 1
            if max_frame - backfilled >= WAL_AUTOCHECKPOINT_PAGES:
                assert decided.wait(WAIT_S)
        assert reads[1][0] - reads[1][1] < WAL_AUTOCHECKPOINT_PAGES  # no writes beside that checkpoint
        waiting = 0
        while idx < targets and waiting < WAL_AUTOCHECKPOINT_PAGES:  # the writes, as the thread would end
            max_frame, backfilled = write_one(file_store, idx)  # the first starts the file again
            waiting = max_frame - backfilled
            idx += 1
        assert waiting >= WAL_AUTOCHECKPOINT_PAGES
    finally:
        written.set()
    assert aside_threads_ended()
    assert frames_pending(file_store) < WAL_AUTOCHECKPOINT_PAGES
    assert len(reads) == 4  # its first checkpoint and the one asked for, each between two reads


def test_close_db_ends_the_checkpoint_aside_that_another_process_keeps_going(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, readers: list[Reader]
) -> None:
    """Another connection writes more than WAL_AUTOCHECKPOINT_PAGES frames after each of the aside thread's
    checkpoints, as a process writing on beside it would, and each checkpoint copies more (a reader's
    snapshot, begun before those writes, stops it short of them, as their writing beside it would): the
    thread goes on, and ``close_db()``, which waits for it, ends it after the checkpoint under way."""
    targets, before_close = 400, 5
    calls: list[threading.Thread] = []
    going = threading.Event()
    other = sqlite3.connect(file_store, isolation_level=None, check_same_thread=False)
    other.execute("PRAGMA wal_autocheckpoint = 0")  # its own COMMIT would copy what the next round should
    checkpoint = db.obj._checkpoint_once

    def written_beside(*, truncate: bool = False) -> bool:
        busy = checkpoint(truncate=truncate)
        if aside_call(calls):
            readers.pop().end()
            readers.append(Reader(file_store))
            # a new 16 KB result for every target: four pages each
            other.execute(
                "UPDATE batch_target SET result = ? WHERE job_id = ?", (str(len(calls)) * 16384, JOB)
            )
            if len(calls) == before_close:  # the store closes while this checkpoint is under way
                going.set()
                deadline = time.monotonic() + WAIT_S
                while not db.obj._checkpoint_stop.is_set() and time.monotonic() < deadline:
                    time.sleep(0.001)
        return bool(busy)

    monkeypatch.setattr(db.obj, "_checkpoint_once", written_beside)
    dcache.create_batch_job(make_job(id=JOB, targets_total=targets), make_targets(targets))
    write_one(file_store, 0)
    readers.append(Reader(file_store))  # the first checkpoint copies up to here
    try:
        max_frame, backfilled = write_rest(file_store, 1, targets)  # which starts the checkpoint aside
        assert max_frame - backfilled >= WAL_AUTOCHECKPOINT_PAGES
        assert going.wait(WAIT_S), calls
        dcache.close_db()
    finally:
        other.close()
    assert len(calls) == before_close and len(set(calls)) == 1, calls
    assert not calls[0].is_alive()


def test_a_readers_snapshot_ends_the_checkpoint_aside(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, readers: list[Reader]
) -> None:
    """A reader's snapshot keeps every checkpoint from copying the frames after it, however many wait: once
    the writes stop, the thread aside makes at most the round a write asked for and one after it that
    reached the snapshot, and ends."""
    writing = threading.Event()
    writing.set()
    after_writes: list[threading.Thread] = []
    checkpoint = db.obj._checkpoint_once

    def counted(*, truncate: bool = False) -> bool:
        if not writing.is_set():
            aside_call(after_writes)
        return bool(checkpoint(truncate=truncate))

    monkeypatch.setattr(db.obj, "_checkpoint_once", counted)
    targets = 1_000
    first = a_reader_after_the_first_writes(file_store, readers, targets)
    for idx in range(first, targets):
        max_frame, backfilled = write_one(file_store, idx)
        if max_frame >= WAL_RESTART_FRAMES - WAL_AUTOCHECKPOINT_PAGES:  # short of the long file's checkpoint
            break
    assert max_frame - backfilled >= WAL_AUTOCHECKPOINT_PAGES  # the last write made a checkpoint due
    writing.clear()
    assert aside_threads_ended()
    assert len(after_writes) <= 2, after_writes
    assert frames_pending(file_store) >= WAL_AUTOCHECKPOINT_PAGES  # held back by the reader, as said
    readers[0].end()


def test_the_long_file_starts_again_beside_another_connections_checkpoints(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, readers: list[Reader]
) -> None:
    """Another connection checkpoints beside the writes, each time all but the frames of the write made
    meanwhile (a reader's snapshot stops it there), so that fewer than WAL_AUTOCHECKPOINT_PAGES frames ever
    wait and none of the store's own checkpoints is due by that count: the file still starts again once it
    is a round past WAL_RESTART_FRAMES, through its checkpoint with every writer held."""
    asides: list[tuple[int, int]] = []
    monkeypatch.setattr(db.obj, "_checkpoint_aside", lambda: asides.append(wal_index_frames(file_store)))

    def due_soon(max_frame: int) -> bool:
        """Whether the next write may make the long file's checkpoint due by the file's growth: no reader
        then, which would keep it from copying every frame (and the file from starting again)."""
        grown = (max_frame - WAL_RESTART_FRAMES) % WAL_AUTOCHECKPOINT_PAGES
        return max_frame >= WAL_RESTART_FRAMES and grown >= WAL_AUTOCHECKPOINT_PAGES - 2 * ONE_WRITE_FRAMES

    other = sqlite3.connect(file_store, isolation_level=None)
    targets = 1_400  # about 12,500 frames: without that checkpoint the file would hold them all
    dcache.create_batch_job(make_job(id=JOB, targets_total=targets), make_targets(targets))
    longest = restarts = 0
    previous = 0
    try:
        for idx in range(targets):
            max_frame, backfilled = write_one(file_store, idx)
            longest = max(longest, max_frame)
            restarts += max_frame < previous
            previous = max_frame
            if readers:  # the checkpoint begun at the last write copies up to there, as the write went on
                other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                readers.pop().end()
            elif max_frame - backfilled >= WAL_AUTOCHECKPOINT_PAGES // 2 and not due_soon(max_frame):
                readers.append(Reader(file_store))
    finally:
        other.close()
    assert not asides  # fewer than WAL_AUTOCHECKPOINT_PAGES frames waited after every write
    assert restarts >= 2  # each time by that checkpoint: the second as soon as the first
    assert longest <= WAL_RESTART_FRAMES + WAL_AUTOCHECKPOINT_PAGES + ONE_WRITE_FRAMES


def test_a_reader_keeping_the_long_file_from_starting_again_costs_no_checkpoint_a_write(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, readers: list[Reader]
) -> None:
    """Another connection reads after every write, its recent snapshot keeping the file from starting
    again: the long file's checkpoint, with every writer held, comes at most twice for each
    WAL_AUTOCHECKPOINT_PAGES frames the file grows past WAL_RESTART_FRAMES (by the frames waiting, and by
    that growth), not at every write, which would hold the other processes' writers for nothing."""
    writer = threading.current_thread()
    long_checkpoints: list[int] = []
    checkpoint = db.obj._checkpoint_once

    def counted(*, truncate: bool = False) -> bool:
        if threading.current_thread() is writer:  # on a store not durable, only the long file's
            long_checkpoints.append(wal_index_frames(file_store)[0])
        return bool(checkpoint(truncate=truncate))

    monkeypatch.setattr(db.obj, "_checkpoint_once", counted)
    targets = 1_500
    dcache.create_batch_job(make_job(id=JOB, targets_total=targets), make_targets(targets))
    max_frame = 0
    for idx in range(targets):
        max_frame, _ = write_one(file_store, idx)
        # the next read begins before the last ends: one always holds a snapshot with frames after it, so
        # no checkpoint copies every frame before the next write (a read begun then could not hold it)
        readers.append(Reader(file_store))
        if len(readers) > 1:
            readers.pop(0).end()
    assert aside_threads_ended()
    grown = max_frame - WAL_RESTART_FRAMES
    assert grown >= 4 * WAL_AUTOCHECKPOINT_PAGES  # the readers kept the file from starting again
    assert len(long_checkpoints) <= 2 * (grown // WAL_AUTOCHECKPOINT_PAGES + 1), long_checkpoints


def aside_threads(calls: list[threading.Thread]) -> list[threading.Thread]:
    """The threads aside among ``calls``' callers, each once."""
    return list({id(thread): thread for thread in calls if thread.name == "sift-checkpoint"}.values())


class AskWaits:
    """The waits of the thread aside for a write's ask under way: the store's condition's ``wait``,
    counted. The condition stays the store's own, which ``close_db()`` wakes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.waiting = 0
        asked = db.obj._aside_asked
        wait = asked.wait

        def counted(timeout: float | None = None) -> bool:
            self.waiting += 1  # the lock is held
            try:
                return bool(wait(timeout))
            finally:
                self.waiting -= 1

        monkeypatch.setattr(asked, "wait", counted)


def aside_quiet(asks: AskWaits) -> bool:
    """Wait until no round of the thread aside is under way or asked for: none runs, or it waits for an
    ask. A write's ask is then what starts the next round."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        with db.obj._aside_lock:
            if not db.obj._aside_running or (asks.waiting and not db.obj._aside_again):
                return True
        time.sleep(0.001)
    return False


def test_a_readers_old_snapshot_costs_no_thread_a_write(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, readers: list[Reader]
) -> None:
    """A reader's snapshot from the first writes holds thousands of frames back: once a checkpoint aside has
    copied nothing, its thread waits for the next write's ask (here for an hour: an ask must wake it), and
    tries again at each, not a thread started for each write; the first try after the reader ends copies
    what it held back, aside, and the next write starts the file again."""
    monkeypatch.setattr(wal, "CHECKPOINT_LINGER_S", 3600.0)
    asks = AskWaits(monkeypatch)
    calls: list[threading.Thread] = []  # the thread of each checkpoint call
    checkpoint = db.obj._checkpoint_once

    def counted(*, truncate: bool = False) -> bool:
        calls.append(threading.current_thread())
        return bool(checkpoint(truncate=truncate))

    monkeypatch.setattr(db.obj, "_checkpoint_once", counted)
    targets = 1_000
    first = a_reader_after_the_first_writes(file_store, readers, targets)
    idx, max_frame, backfilled = first, 0, 0
    while max_frame < WAL_RESTART_FRAMES - 8 * ONE_WRITE_FRAMES:  # short of the long file's checkpoint
        max_frame, backfilled = write_one(file_store, idx)
        idx += 1
    assert max_frame - backfilled >= 2 * WAL_AUTOCHECKPOINT_PAGES  # held back by the reader all along
    # at most two threads: one whose checkpoint copies up to the snapshot (and which ends there when fewer
    # than WAL_AUTOCHECKPOINT_PAGES frames wait then), and one whose checkpoint copies nothing, and waits
    threads = aside_threads(calls)
    assert len(threads) <= 2 and threads[-1].is_alive(), calls
    assert threading.current_thread() not in calls  # each try aside
    assert aside_quiet(asks)
    readers.pop().end()
    write_one(file_store, idx)  # its ask: the thread copies every frame, and ends
    assert aside_threads_ended()
    assert frames_pending(file_store) == 0
    assert aside_threads(calls) == threads  # no other thread
    max_frame, _ = write_one(file_store, idx + 1)
    assert max_frame <= ONE_WRITE_FRAMES  # started again


def test_close_db_ends_the_thread_aside_waiting_for_an_ask(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, readers: list[Reader]
) -> None:
    """The thread aside waits for a write's ask after a checkpoint that a reader's snapshot kept from
    copying anything (here for an hour): ``close_db()`` ends it at once, not after that wait."""
    monkeypatch.setattr(wal, "CHECKPOINT_LINGER_S", 3600.0)
    asks = AskWaits(monkeypatch)
    targets = 400
    dcache.create_batch_job(make_job(id=JOB, targets_total=targets), make_targets(targets))
    write_one(file_store, 0)
    readers.append(Reader(file_store))
    write_rest(file_store, 1, targets)  # which starts the checkpoint aside: it copies to the snapshot, then
    deadline = time.monotonic() + WAIT_S  # nothing
    while asks.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert asks.waiting == 1
    thread = db.obj._checkpoint_thread
    closer = threading.Thread(target=dcache.close_db)
    closer.start()
    try:
        closer.join(WAIT_S)
        assert not closer.is_alive() and thread is not None and not thread.is_alive()
    finally:
        with db.obj._aside_asked:  # a close that did not wake it: woken here, so that the store closes
            db.obj._aside_asked.notify_all()
        closer.join(WAIT_S)


def test_the_file_starts_again_between_readers_that_each_hold_frames_back(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, readers: list[Reader]
) -> None:
    """Readers one after another, each holding back WAL_AUTOCHECKPOINT_PAGES frames or more, with a few
    writes between them (a report read over and over): each time, the first write after a reader ends asks
    for the checkpoint that copies what it held back (aside: the test waits for it), and the next write
    starts the file again. Each reader ends once no round aside is under way or asked for, so that this
    write's ask is what starts the copy."""
    asks = AskWaits(monkeypatch)
    targets, life, gap = 1_200, 150, 3
    dcache.create_batch_job(make_job(id=JOB, targets_total=targets), make_targets(targets))
    restarts, previous, cycles = 0, 0, 0
    for idx in range(targets):
        phase = idx % (life + gap)
        if phase == 0:
            readers.append(Reader(file_store))
        elif phase == life:
            assert aside_quiet(asks)
            readers.pop().end()
            cycles += 1
        max_frame, _ = write_one(file_store, idx)
        if phase == life:
            assert frames_pending(file_store) == 0  # once the thread aside has ended
        restarts += max_frame < previous
        previous = max_frame
    assert cycles >= 7
    assert restarts >= cycles


@pytest.mark.parametrize(
    ("before", "after", "busy", "end"),
    [
        ((3_000, 300), (3_050, 2_000), False, "more"),  # copied more; 1,050 frames wait, written beside it
        ((3_000, 300), (3_050, 2_500), False, "done"),  # copied more; 550 wait
        ((3_000, 300), (3_050, 300), False, "held back"),  # copied nothing; 2,750 wait
        ((1_200, 300), (1_250, 300), False, "done"),  # copied nothing; 950 wait
        ((3_000, 300), (3_050, 300), True, "done"),  # another connection's checkpoint is copying them
    ],
    ids=["more", "caught up", "held back", "few wait", "busy"],
)
def test_what_a_round_of_the_thread_aside_comes_to(
    file_store: Path,
    monkeypatch: pytest.MonkeyPatch,
    before: tuple[int, int],
    after: tuple[int, int],
    busy: bool,
    end: str,
) -> None:
    """The WAL index header's frames and frames copied back, before and after the round's checkpoint (busy
    or not), are played, and what the round came to is checked: only "more" makes another round; "held
    back" waits for a write's ask."""
    dcache.create_batch_job(make_job(id=JOB, targets_total=1), make_targets(1))  # opens the WAL index
    frames = iter([before, after])
    monkeypatch.setattr(db.obj, "_wal_frames", lambda: next(frames))
    monkeypatch.setattr(db.obj, "_checkpoint_once", lambda *, truncate=False: busy)
    assert db.obj._checkpoint_round() == end


#: Two salts of the -wal file: it takes a new one each time it starts again.
SALT, NEW_SALT = b"salt-one", b"salt-two"


@pytest.mark.parametrize(
    ("salt", "due"), [(SALT, None), (NEW_SALT, "queue held")], ids=["same file", "new file"]
)
def test_the_long_files_growth_counts_from_where_it_was_due_in_the_same_file(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, salt: bytes, due: str | None
) -> None:
    """The long file's checkpoint was due at 6,000 frames; the next write finds 6,500, 500 waiting: grown
    past where it was due by fewer than WAL_AUTOCHECKPOINT_PAGES in the same file, it is not due; in a new
    file (started again by another connection, and grown since), it is: past WAL_RESTART_FRAMES by more."""
    dcache.create_batch_job(make_job(id=JOB, targets_total=1), make_targets(1))  # opens the WAL index
    monkeypatch.setattr(db.obj, "_wal_header", lambda: (6_000, 4_000, SALT))
    assert db.obj.checkpoint_due() == "queue held"  # 2,000 frames wait
    monkeypatch.setattr(db.obj, "_wal_header", lambda: (6_500, 6_000, salt))
    assert db.obj.checkpoint_due() == due


def test_a_close_interrupted_while_it_waits_leaves_the_thread_aside_stopping(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close_db()`` interrupted (``KeyboardInterrupt``) while it waits for the thread aside: the thread
    still makes no round after the one under way, and the next ``close_db()`` waits for it."""
    inside, release = threading.Event(), threading.Event()
    calls: list[threading.Thread] = []
    checkpoint = db.obj._checkpoint_once

    def held(*, truncate: bool = False) -> bool:
        busy = checkpoint(truncate=truncate)
        if threading.current_thread().name == "sift-checkpoint":
            calls.append(threading.current_thread())
            inside.set()
            release.wait(WAIT_S)
        return bool(busy)

    monkeypatch.setattr(db.obj, "_checkpoint_once", held)
    targets = 400
    dcache.create_batch_job(make_job(id=JOB, targets_total=targets), make_targets(targets))
    write_rest(file_store, 0, targets)  # which starts the checkpoint aside
    try:
        assert inside.wait(WAIT_S)
        thread = calls[0]

        def interrupted(timeout: float | None = None) -> None:
            raise KeyboardInterrupt

        thread.join = interrupted  # type: ignore[method-assign]
        try:
            with pytest.raises(KeyboardInterrupt):
                dcache.close_db()
        finally:
            del thread.join
        assert db.obj._checkpoint_thread is thread and db.obj._checkpoint_stop.is_set()
    finally:
        release.set()
    dcache.close_db()
    assert not thread.is_alive()
    assert calls == [thread]


@pytest.mark.parametrize("started", [True, False], ids=["thread started", "thread not started"])
def test_an_interrupt_while_the_thread_aside_starts(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, started: bool
) -> None:
    """A ``KeyboardInterrupt`` in the thread aside's ``start()``, after the thread began or before: the
    write is kept, ``close_db()`` waits for a thread that began, and once the store is opened again its
    checkpoints run aside again."""
    release = threading.Event()
    asides: list[threading.Thread] = []
    checkpoint = db.obj._checkpoint_once
    start = threading.Thread.start

    def held_first(*, truncate: bool = False) -> bool:
        if threading.current_thread().name == "sift-checkpoint":
            asides.append(threading.current_thread())
            release.wait(WAIT_S)  # the first thread's first checkpoint, until the test lets it go
        return bool(checkpoint(truncate=truncate))

    def interrupted(thread: threading.Thread) -> None:
        if started:
            start(thread)
        raise KeyboardInterrupt

    monkeypatch.setattr(db.obj, "_checkpoint_once", held_first)
    targets = 400
    dcache.create_batch_job(make_job(id=JOB, targets_total=targets), make_targets(targets))
    monkeypatch.setattr(threading.Thread, "start", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            write_rest(file_store, 0, targets)  # which starts the checkpoint aside
    finally:
        monkeypatch.setattr(threading.Thread, "start", start)
    assert dcache.batch_job(JOB).targets_done == targets  # type: ignore[union-attr]
    closer = threading.Thread(target=dcache.close_db)
    try:
        closer.start()
        if started:  # a thread that began is waited for: held, it cannot have ended the close
            closer.join(0.2)
            assert closer.is_alive()
    finally:
        release.set()
    closer.join(WAIT_S)
    assert not closer.is_alive() and not any(thread.is_alive() for thread in asides)
    dcache.open_db(file_store)
    dcache.create_batch_job(make_job(id="again", targets_total=targets), make_targets(targets))
    results = [{"idx": idx, "status": "done", "result": "r" * 16384} for idx in range(targets)]
    dcache.update_batch_targets("again", results, now=2_000)
    assert aside_threads_ended()
    assert frames_pending(file_store) < WAL_AUTOCHECKPOINT_PAGES
    assert len(set(asides)) == 1 + started  # its checkpoints ran aside again, on a thread of their own
