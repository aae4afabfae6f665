"""No driver exception escapes: every public function, under each real fault, works or raises a BatchError
of the fault's kind, with the sqlite3 error as ``__cause__``; once the fault clears, the call works with no
reopen. The faults are real (see tests/faults.py): no connection is patched.

Also the classification itself (sift/dcache/driver_errors.py): by SQLite's result code, never by text.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import peewee
import pytest
from faults import (
    IS_ROOT,
    PUBLIC_CALLS,
    damage,
    file_size_limit,
    fill,
    locked_by_another_process,
    populate,
    public_functions,
    read_only,
    tmpfs,
)
from helpers import make_job, make_targets

from sift import dcache
from sift.dcache import driver_errors

#: Pragmas a fresh connection gets, as PRAGMA reads them back.
PRAGMAS = {"journal_mode": "wal", "busy_timeout": 10_000, "recursive_triggers": 1, "synchronous": 1}

#: The functions that write (each must fail under a fault that stops writes), in an order where each
#: still finds the jobs it names; sweep_batch deletes every job.
WRITES = [
    "create_batch_job",
    "submit_batch_job",
    "submit",
    "put_batch_targets",
    "update_batch_target",
    "update_batch_targets",
    "touch_batch_job",
    "set_host_policy",
    "back_off_host",
    "release_host",
    "pause_batch_job",
    "resume_batch_job",
    "pause_caller",
    "resume_caller",
    "set_batch_job_status",
    "claim_batch_targets",
    "renew_claims",
    "release_claims",
    "requeue_stale_claims",
    "requeue_in_flight",
    "retry_batch_target",
    "retry_batch_targets",
    "retry_failed_targets",
    "finish_complete_jobs",
    "finish_batch_job",
    "cancel_batch_job",
    "rescue_stale_jobs",
    "mark_in_flight_failed",
    "evict_batch_oldest",
    "sweep_batch",
]
#: Reopening may fail under a fault that stops writes: a new connection writes its -shm file. Vacuum
#: writes only when there are free pages to give back; a backup writes only its copy, on another disk.
MAY_FAIL = {"open_db", "vacuum_store", "backup_store"}

#: Fault -> the error every write raises under it (reads work), or None: each call works or raises it.
FAULTS: dict[str, tuple[type[dcache.BatchError], bool]] = {
    "disk-full": (dcache.StoreFull, True),
    "io-error": (dcache.StoreUnavailable, True),
    "read-only": (dcache.StoreReadOnly, True),
    "busy": (dcache.StoreUnavailable, True),
    "corrupt": (dcache.StoreCorrupt, False),
}
#: Faults that clear with the store left open: space freed, the limit lifted, the lock released.
CLEARS = {"disk-full", "io-error", "busy"}


def test_every_public_function_has_a_call() -> None:
    assert public_functions() == sorted(PUBLIC_CALLS)


class Fault:
    """A populated store with a fault ready: ``active()`` puts it in force for the length of a block."""

    def __init__(self, kind: str, tmp_path: Path, stack: ExitStack) -> None:
        self.kind = kind
        directory = tmp_path
        if kind in ("disk-full", "read-only") and IS_ROOT:
            directory = stack.enter_context(tmpfs(tmp_path / "fs", "8m" if kind == "read-only" else "4m"))
        if kind == "disk-full" and not IS_ROOT:
            pytest.skip("a full disk needs a tmpfs (root); tests/test_disk_full.py also covers RLIMIT_FSIZE")
        self.path = directory / "store.db"
        dcache.open_db(self.path, timeout=0.2)
        stack.callback(dcache.close_db)
        populate(20)
        if kind == "disk-full":
            dcache.db.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)")  # every write needs new space
        if kind in ("read-only", "corrupt"):
            dcache.close_db()
            if kind == "corrupt":
                damage(self.path, 0.5)
            else:
                self.made_read_only = ExitStack()
                self.made_read_only.enter_context(read_only(self.path))
                stack.callback(self.made_read_only.close)
            dcache.open_db(self.path, timeout=0.2)

    @contextmanager
    def active(self) -> Iterator[None]:
        if self.kind == "disk-full":
            filler = fill(self.path.parent)
            try:
                yield
            finally:
                filler.unlink()
        elif self.kind == "io-error":
            with file_size_limit(0):  # every write() fails with EFBIG: SQLITE_IOERR_WRITE
                yield
        elif self.kind == "busy":
            with locked_by_another_process(self.path):
                yield
        else:
            yield


#: The fault the fast lane runs every public function under: every write fails, every read works, and it
#: clears with the store left open. The full lane runs them under each fault.
FAST_FAULT = "io-error"


@pytest.fixture(
    params=[k if k == FAST_FAULT else pytest.param(k, marks=pytest.mark.slow) for k in sorted(FAULTS)]
)
def fault(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fault]:
    with ExitStack() as stack:
        yield Fault(request.param, tmp_path, stack)


@pytest.mark.parametrize("name", public_functions())
def test_no_driver_exception_escapes(fault: Fault, name: str) -> None:
    call = PUBLIC_CALLS[name]
    outcome: BaseException | None = None
    with fault.active():
        try:
            call(fault.path)
        except Exception as exc:  # judged below, with the fault cleared (pytest may need to write)
            outcome = exc
    expected, writes_fail = FAULTS[fault.kind]
    if outcome is not None:
        assert isinstance(outcome, dcache.BatchError), repr(outcome)
        assert isinstance(outcome, expected), repr(outcome)
        assert isinstance(outcome.__cause__, sqlite3.Error), repr(outcome.__cause__)
        assert not isinstance(outcome, (peewee.PeeweeException, sqlite3.Error))
    if writes_fail and name not in MAY_FAIL:
        assert (outcome is not None) == (name in WRITES), repr(outcome)
    if fault.kind in CLEARS:
        call(fault.path)  # the same call, the fault gone, the store not reopened


@pytest.mark.parametrize("kind", ["disk-full", "io-error", "busy"])
def test_the_fault_cleared_leaves_every_write_working(tmp_path: Path, kind: str) -> None:
    """One fault, then every write in a row on the same open store: none is left broken by it."""
    with ExitStack() as stack:
        fault = Fault(kind, tmp_path, stack)
        with fault.active(), pytest.raises(dcache.StoreUnavailable):
            dcache.create_batch_job(make_job("during"), make_targets(3))
        for name in WRITES:
            PUBLIC_CALLS[name](fault.path)
        assert dcache.db.execute_sql("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert dcache.batch_job("during") is None


# -- The classification ----------------------------------------------------------------------------------


def sqlite_failure(code: int, message: str = "some text") -> sqlite3.Error:
    """A sqlite3 error as the driver raises it: its class, extended code and name."""
    names = {v: k for k, v in vars(sqlite3).items() if k.startswith("SQLITE_") and isinstance(v, int)}
    cls = sqlite3.IntegrityError if code & 0xFF == sqlite3.SQLITE_CONSTRAINT else sqlite3.OperationalError
    error = cls(message)
    error.sqlite_errorcode = code
    error.sqlite_errorname = names[code]
    return error


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (sqlite3.SQLITE_FULL, dcache.StoreFull),
        (sqlite3.SQLITE_IOERR, dcache.StoreUnavailable),
        (sqlite3.SQLITE_IOERR_WRITE, dcache.StoreUnavailable),
        (sqlite3.SQLITE_IOERR_FSYNC, dcache.StoreUnavailable),
        (sqlite3.SQLITE_CORRUPT, dcache.StoreCorrupt),
        (sqlite3.SQLITE_CORRUPT_INDEX, dcache.StoreCorrupt),
        (sqlite3.SQLITE_NOTADB, dcache.StoreCorrupt),
        (sqlite3.SQLITE_READONLY, dcache.StoreReadOnly),
        (sqlite3.SQLITE_READONLY_DBMOVED, dcache.StoreReadOnly),
        (sqlite3.SQLITE_BUSY, dcache.StoreUnavailable),
        (sqlite3.SQLITE_BUSY_SNAPSHOT, dcache.StoreUnavailable),
        (sqlite3.SQLITE_LOCKED_SHAREDCACHE, dcache.StoreUnavailable),
        (sqlite3.SQLITE_CANTOPEN, dcache.StoreUnavailable),
        (sqlite3.SQLITE_ERROR, dcache.StoreUnavailable),
        (sqlite3.SQLITE_CONSTRAINT_CHECK, dcache.StoreUnavailable),
    ],
)
@pytest.mark.parametrize("wrapped", [False, True])
def test_classified_by_result_code_not_text(code: int, expected: type[Exception], wrapped: bool) -> None:
    # The message is another error's text: only the code may decide.
    error = sqlite_failure(code, "database is locked: database or disk is full")
    raised: BaseException = error
    if wrapped:  # as Peewee re-raises it
        try:
            with vars(peewee)["__exception_wrapper__"]:
                raise error
        except peewee.PeeweeException as exc:
            raised = exc
    store = driver_errors.store_error(raised, path="x.db", timeout=2.5)
    assert type(store) is expected
    assert store.__cause__ is error
    assert str(store).startswith("database: ")
    if code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        assert str(store) == "database: locked by another process for over 2.5 s"
    else:
        assert "'x.db'" in str(store) or code == sqlite3.SQLITE_NOMEM


def test_constraint_violations_are_left_to_the_rule_unless_asked() -> None:
    error = sqlite_failure(sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, "UNIQUE constraint failed: batch_job.id")
    assert driver_errors.store_error(error, path="x.db", timeout=1, constraints=False) is None
    assert type(driver_errors.store_error(error, path="x.db", timeout=1)) is dcache.StoreUnavailable
    assert driver_errors.violated(error) == driver_errors.PRIMARY_KEY
    not_null = sqlite_failure(sqlite3.SQLITE_CONSTRAINT_NOTNULL, "UNIQUE constraint failed: batch_job.id")
    assert driver_errors.violated(not_null) == driver_errors.NOT_NULL
    assert (
        driver_errors.violated(sqlite_failure(sqlite3.SQLITE_CONSTRAINT_CHECK)) == "SQLITE_CONSTRAINT_CHECK"
    )
    assert driver_errors.violated(sqlite_failure(sqlite3.SQLITE_FULL)) is None


@pytest.mark.parametrize(
    "exc", [ValueError("x"), peewee.OperationalError("no driver error"), dcache.StoreFull()]
)
def test_what_is_no_driver_error_is_left_alone(exc: Exception) -> None:
    assert driver_errors.store_error(exc, path="x.db", timeout=1) is None


def test_a_connect_whose_pragmas_fail_keeps_no_half_open_connection(file_store: Path) -> None:
    """A connection whose pragmas failed (here: the header damaged, then mended) is not kept: the next
    call opens a new one, with every pragma set."""
    dcache.close_db()  # the next statement connects again
    good = file_store.read_bytes()[:100]
    with open(file_store, "r+b") as f:
        f.write(b"\xff" * 100)
    with pytest.raises(dcache.StoreCorrupt) as info:
        dcache.batch_job("job-1")
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    with open(file_store, "r+b") as f:
        f.write(good)
    assert dcache.batch_job("job-1") is None
    pragmas = {
        name: dcache.db.execute_sql(f"PRAGMA {name}").fetchone()[0] for name in ("recursive_triggers",)
    }
    assert pragmas == {"recursive_triggers": 1}


def test_connecting_twice_keeps_the_open_connection(file_store: Path) -> None:
    dcache.create_batch_job(make_job("job-1"))
    conn = dcache.db.connection()
    assert dcache.db.connect() is False  # the store's connection is open already: nothing to do
    assert dcache.db.connection() is conn
    assert dcache.batch_job("job-1") is not None


def test_ad_hoc_model_queries_get_the_same_errors(tmp_path: Path) -> None:
    """Peewee queries on the models (a web view's, a shell's) raise the package's errors too: an insert of
    a job id already stored is ``DuplicateJob``, as through ``create_batch_job``."""
    path = tmp_path / "store.db"
    dcache.open_db(path, timeout=0.2)
    try:
        dcache.create_batch_job(make_job("job-1"))
        with pytest.raises(dcache.DuplicateJob):
            dcache.BatchJob.insert(**make_job("job-1").__data__).execute()
        with locked_by_another_process(path), pytest.raises(dcache.StoreUnavailable) as info:
            dcache.BatchJob.update(lease=5).where(dcache.BatchJob.id == "job-1").execute()
        assert driver_errors.is_busy(info.value.__cause__ or info.value)
        assert dcache.BatchJob.get_by_id("job-1").lease == 1_000
    finally:
        dcache.close_db()


def test_a_read_only_store_writes_again_once_reopened(tmp_path: Path) -> None:
    """SQLite opened the file read-only: writable again, the open store still refuses writes; a new
    open_db writes."""
    with ExitStack() as stack:
        fault = Fault("read-only", tmp_path, stack)
        fault.made_read_only.close()
        with pytest.raises(dcache.StoreReadOnly):
            dcache.touch_batch_job("job-1", now=3_000)
        dcache.open_db(fault.path)
        dcache.touch_batch_job("job-1", now=3_000)
        assert dcache.db.execute_sql("PRAGMA integrity_check").fetchall() == [("ok",)]
