"""The thin write path, pinned by what it does rather than how long it takes. On SQLite a result write is one
hold of the store's lock, one turn in the writers' queue, one look at the WAL index, and the statements
themselves (BEGIN, the job's and the target's update, COMMIT), and a call's many results one statement
moving the job a chunk of them, and the one target's write run for each in one call; a claim is one hold
and one turn too, its walk's statements sent straight to the connection; the no-op eviction is one hold
and one read. On PostgreSQL a call's writes are one statement, one round trip, and the no-op eviction
one more.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import open_empty_postgres
from helpers import count_round_trips, make_job, make_targets

from sift import dcache
from sift.dcache import claimorder
from sift.dcache.backends.sqlite import writes as sqlite_writes
from sift.dcache.database import db
from sift.dcache.statements import Statement

BUDGET = 10**15


class CountingLock:
    """The store's RLock, counting how often it is taken."""

    def __init__(self, lock: threading.RLock) -> None:
        self.lock = lock
        self.taken = 0

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        self.taken += 1
        return self.lock.acquire(*args, **kwargs)

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class Connection:
    """The store's sqlite3 connection, keeping the SQL of every statement sent to it."""

    def __init__(self, conn: sqlite3.Connection, sent: list[str], many: list[tuple[str, int]]) -> None:
        self.conn = conn
        self.sent = sent
        self.many = many

    def execute(self, sql: str, *params: Any) -> sqlite3.Cursor:
        self.sent.append(sql)
        return self.conn.execute(sql, *params)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        """Kept in ``sent`` once, as one call to the driver, and in ``many`` with the rows it ran for."""
        rows = list(rows)
        self.sent.append(sql)
        self.many.append((sql, len(rows)))
        return self.conn.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


class Seen:
    """What the store does from the moment it is made: statements sent to SQLite, lock holds, flocks,
    reads of the WAL index."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        backend: Any = db.backend
        self.statements: list[str] = []
        self.many: list[tuple[str, int]] = []  # each executemany: its statement and how many rows it ran
        self.flocks = 0
        self.preads = 0
        self.lock = CountingLock(backend.lock)
        monkeypatch.setattr(backend, "lock", self.lock)
        flock, pread = fcntl.flock, os.pread

        def counted_flock(*args: Any) -> Any:
            self.flocks += 1
            return flock(*args)

        def counted_pread(*args: Any) -> Any:
            self.preads += 1
            return pread(*args)

        monkeypatch.setattr(fcntl, "flock", counted_flock)  # the writers' queue's
        monkeypatch.setattr(os, "pread", counted_pread)
        backend.connection()
        connection = Connection(backend._state.conn, self.statements, self.many)
        monkeypatch.setattr(backend._state, "conn", connection)

    def reset(self) -> None:
        self.statements.clear()
        self.many.clear()
        self.flocks = self.preads = self.lock.taken = 0


@pytest.fixture
def seen(file_store: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Seen]:
    dcache.create_batch_job(make_job("job-1", status="running", targets_total=12), make_targets(12))
    dcache.update_batch_target("job-1", 11, "done", result="warm", now=100)  # the lease is 100 from here on
    counting = Seen(monkeypatch)
    yield counting


def test_a_runners_calls_are_their_statements_in_one_hold_each(seen: Seen) -> None:
    """A claim, a step (a result, then the no-op eviction): what a runner calls for every target."""
    claimed = dcache.claim_batch_targets(10, runner="r", now=100)
    assert [target.idx for target in claimed] == list(range(10))
    assert seen.statements[0] == "BEGIN IMMEDIATE" and seen.statements[-1] == "COMMIT"
    compiled = {statement.sql for statement in vars(claimorder).values() if isinstance(statement, Statement)}
    assert seen.statements[1:-1] and set(seen.statements[1:-1]) <= compiled  # the walk's own, nothing more
    assert (seen.lock.taken, seen.flocks, seen.preads) == (1, 2, 1)
    seen.reset()
    dcache.update_batch_target("job-1", 0, "done", result="r" * 1024, now=100)
    # the lease is 100 already: the form that leaves it alone
    assert seen.statements == [
        "BEGIN IMMEDIATE",
        sqlite_writes._move_sql(1, True),
        sqlite_writes._WRITE_ONE,
        "COMMIT",
    ]
    assert seen.lock.taken == 1
    assert seen.flocks == 2  # the writers' queue: taken, then released
    assert seen.preads == 1  # the checkpoint policy: one look at the WAL index, after the COMMIT
    seen.reset()
    assert dcache.evict_batch_oldest(BUDGET) == 0
    assert seen.statements == [db.backend.total_nbytes_sql]
    assert (seen.lock.taken, seen.flocks, seen.preads) == (1, 0, 0)


def test_a_write_that_moves_the_lease_tries_the_lease_form_first(seen: Seen) -> None:
    dcache.update_batch_target("job-1", 0, "done", result="r", now=101)
    assert seen.statements == [
        "BEGIN IMMEDIATE",
        sqlite_writes._move_sql(1, True),  # matches nothing: the lease is 100
        sqlite_writes._move_sql(1, False),
        sqlite_writes._WRITE_ONE,
        "COMMIT",
    ]
    assert (seen.lock.taken, seen.flocks, seen.preads) == (1, 2, 1)
    job = dcache.batch_job("job-1")
    assert job is not None and job.lease == 101


def test_ten_results_are_one_hold_and_one_turn_in_the_queue(seen: Seen) -> None:
    results = [{"idx": i, "status": "done", "result": "x" * i} for i in range(10)]
    assert dcache.update_batch_targets("job-1", results, now=100) == 10
    # the job moved once by the set, its targets checked in the same statement (10 rows padded to 16), then
    # the one target's write run for each target, in one call
    assert seen.statements == [
        "BEGIN IMMEDIATE",
        sqlite_writes._move_sql(16, True),
        sqlite_writes._WRITE_ONE,
        "COMMIT",
    ]
    assert seen.many == [(sqlite_writes._WRITE_ONE, 10)]
    assert (seen.lock.taken, seen.flocks, seen.preads) == (1, 2, 1)
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes) == (11, sum(range(10)) + 4)


@pytest.mark.parametrize("size", [3, 200, 2 * sqlite_writes.SET_ROWS + 2])
def test_a_calls_driver_calls_do_not_grow_with_its_size(
    file_store: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    # per chunk of SET_ROWS: one statement moves the job, then one call runs the one target's write for each
    # done target, and one its claim-ending write for each failed one
    dcache.create_batch_job(make_job("job-1", status="running", targets_total=size), make_targets(size))
    dcache.update_batch_target("job-1", size - 1, "done", result="warm", now=100)
    seen = Seen(monkeypatch)
    results = [
        {"idx": i, "status": "failed", "error": "gone"}
        if i % 5 == 1
        else {"idx": i, "status": "done", "result": "x" * (i % 7)}
        for i in range(size - 1)
    ]
    assert dcache.update_batch_targets("job-1", results, now=100) == size - 1
    chunks = [results[at : at + sqlite_writes.SET_ROWS] for at in range(0, size - 1, sqlite_writes.SET_ROWS)]
    moves = [sql for sql in seen.statements if sql.startswith("UPDATE batch_job SET (targets_done")]
    assert len(moves) == len(chunks)
    ran = [(sql, rows) for sql, rows in seen.many if sql.startswith("UPDATE batch_target SET status")]
    assert ran == [
        (sql, rows)
        for chunk in chunks
        for sql, rows in (
            (sqlite_writes._WRITE_ONE, sum(r["status"] == "done" for r in chunk)),
            (sqlite_writes._WRITE_ONE_UNCLAIMED, sum(r["status"] == "failed" for r in chunk)),
        )
        if rows
    ]
    job = dcache.batch_job("job-1")
    assert job is not None and job.targets_done == size
    assert job.nbytes == 4 + sum(i % 7 for i in range(size - 1) if i % 5 != 1)
    assert dcache.batch_nbytes() == job.nbytes
    targets = dcache.batch_targets("job-1")
    assert targets is not None
    assert [(t.status, t.result, t.error) for t in targets[:-1]] == [
        (r["status"], r.get("result"), r.get("error")) for r in results
    ]


def test_a_set_that_breaks_a_rule_writes_nothing_and_names_the_target(seen: Seen) -> None:
    # target 3 is done: going back to pending is refused; the store's reads then name it
    dcache.update_batch_target("job-1", 3, "done", result="abc", now=100)
    seen.reset()
    results: list[dict[str, Any]] = [{"idx": i, "status": "done", "result": "x"} for i in range(3)]
    results.append({"idx": 3, "status": "pending"})
    with pytest.raises(dcache.InvalidBatchInput, match="target 3 is already done"):
        dcache.update_batch_targets("job-1", results, now=100)
    assert seen.statements[1:3] == [sqlite_writes._move_sql(4, True), sqlite_writes._move_sql(4, False)]
    assert seen.statements[-1] == "ROLLBACK"
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes) == (2, 4 + 3)


def test_an_idx_given_twice_is_written_in_runs_each_seeing_the_one_before(seen: Seen) -> None:
    results = [
        {"idx": 0, "status": "done", "result": "ab"},
        {"idx": 1, "status": "done", "result": "x"},
        {"idx": 0, "status": "done", "result": "c"},
    ]
    assert dcache.update_batch_targets("job-1", results, now=100) == 3
    assert seen.statements[1:-1] == [
        sqlite_writes._move_sql(2, True),
        sqlite_writes._WRITE_ONE,
        sqlite_writes._move_sql(1, True),
        sqlite_writes._WRITE_ONE,
    ]
    assert seen.many == [(sqlite_writes._WRITE_ONE, 2)]
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes) == (3, 4 + 1 + 1)


def test_a_refused_write_rolls_back_in_the_same_hold(seen: Seen) -> None:
    results = [{"idx": 0, "status": "done", "result": "x"}, {"idx": 12, "status": "done"}]
    with pytest.raises(dcache.TargetNotFound):
        dcache.update_batch_targets("job-1", results, now=100)
    assert seen.statements[0] == "BEGIN IMMEDIATE" and seen.statements[-1] == "ROLLBACK"
    assert seen.flocks == 2  # the queue is left, once
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes) == (1, 4)  # nothing of the call stayed
    assert dcache.batch_nbytes() == 4


def test_a_write_inside_a_callers_transaction_is_a_savepoint_of_it(seen: Seen) -> None:
    with db.atomic():
        dcache.update_batch_target("job-1", 0, "done", result="abc", now=100)
        with pytest.raises(dcache.ClaimLost):
            dcache.update_batch_target("job-1", 1, "done", result="abc", runner="nobody", now=100)
        dcache.update_batch_target("job-1", 2, "done", result="de", now=100)
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes) == (3, 4 + 3 + 2)
    assert dcache.batch_nbytes() == 9
    assert seen.flocks == 2  # the caller's transaction took the queue, once


def test_a_read_only_store_refuses_the_write_before_any_statement(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dcache.create_batch_job(make_job("job-1", status="running", targets_total=1), make_targets(1))
    dcache.close_db()
    dcache.open_db(file_store, readonly=True)
    counting = Seen(monkeypatch)
    with pytest.raises(dcache.StoreReadOnly):
        dcache.update_batch_target("job-1", 0, "done", result="x", now=100)
    assert counting.statements == [] and counting.flocks == 0
    assert dcache.evict_batch_oldest(BUDGET) == 0


# -- PostgreSQL: round trips, counted by wrapping the driver's cursor ------------------------------------


@pytest.fixture
def pg_sent(postgres_schema: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The worker's schema, open and empty, with a running job of 12 targets; yields the statements sent
    to the server from then on, one a round trip."""
    open_empty_postgres(postgres_schema)
    dcache.create_batch_job(make_job("job-1", status="running", targets_total=12), make_targets(12))
    yield count_round_trips(monkeypatch)
    dcache.close_db()


@pytest.mark.postgres
def test_a_runner_step_is_two_round_trips_on_postgres(pg_sent: list[str]) -> None:
    dcache.update_batch_target("job-1", 0, "done", result="r" * 1024, now=100)
    assert len(pg_sent) == 1  # the whole write, in one statement
    assert dcache.evict_batch_oldest(BUDGET) == 0
    assert len(pg_sent) == 2  # the byte total
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes, job.lease) == (1, 1024, 100)


@pytest.mark.postgres
def test_ten_results_are_one_round_trip_on_postgres(pg_sent: list[str]) -> None:
    results = [{"idx": i, "status": "done", "result": "é" * i} for i in range(10)]
    assert dcache.update_batch_targets("job-1", results, now=100) == 10
    assert len(pg_sent) == 1
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes) == (10, 2 * sum(range(10)))
    assert dcache.batch_nbytes() == 2 * sum(range(10))


@pytest.mark.postgres
def test_a_refused_write_on_postgres_writes_nothing_and_names_the_target(pg_sent: list[str]) -> None:
    dcache.update_batch_target("job-1", 0, "done", result="abc", now=100)
    results = [{"idx": 1, "status": "done", "result": "x"}, {"idx": 0, "status": "running"}]
    with pytest.raises(dcache.InvalidBatchInput, match="target 0 is already done"):
        dcache.update_batch_targets("job-1", results, now=101)
    with pytest.raises(dcache.ClaimLost):
        dcache.update_batch_target("job-1", 2, "done", result="x", runner="nobody", now=101)
    with pytest.raises(dcache.TargetNotFound):
        dcache.update_batch_targets("job-1", [{"idx": 3, "status": "done"}, {"idx": 99, "status": "done"}])
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes, job.lease) == (1, 3, 100)
    assert [t.status for t in dcache.batch_targets("job-1") or []][:4] == [
        "done",
        "pending",
        "pending",
        "pending",
    ]


@pytest.mark.postgres
def test_the_same_target_twice_in_one_call_is_written_in_order_on_postgres(pg_sent: list[str]) -> None:
    results = [{"idx": 0, "status": "done", "result": "ab"}, {"idx": 0, "status": "done", "result": "abcd"}]
    assert dcache.update_batch_targets("job-1", results, now=100) == 2
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes) == (1, 4)


# -- SQLite: a job's targets go in INSERTs of many rows --------------------------------------------------


def target_inserts(call: Any) -> list[str]:
    """The INSERTs of targets ``call`` sends (each once: the trace repeats a statement's text per row of an
    executemany)."""
    sent: list[str] = []
    db.connection().set_trace_callback(sent.append)
    try:
        call()
    finally:
        db.connection().set_trace_callback(None)
    return [sql for sql in sent if sql.startswith('INSERT INTO "batch_target"')]


@pytest.mark.parametrize(("targets", "statements"), [(1, 1), (128, 1), (1000, 10), (2500, 10 + 10 + 7)])
def test_a_jobs_targets_go_in_few_inserts(file_store: Path, targets: int, statements: int) -> None:
    # powers of two up to 128 a statement, in chunks of 1,000: 1,000 is 7 x 128 + 64 + 32 + 8, 500 is
    # 3 x 128 + 64 + 32 + 16 + 4
    call = lambda: dcache.create_batch_job(make_job("j", targets_total=targets), make_targets(targets))  # noqa: E731
    assert len(target_inserts(call)) == statements
    stored = dcache.batch_targets("j") or []
    assert [t.idx for t in stored] == list(range(targets))
    assert {t.status for t in stored} == {"pending"}


@pytest.mark.parametrize(
    ("bad", "field", "problem"),
    [
        ({"options": "{"}, "options", "is not valid JSON text (target 700)"),
        ({"url": "https://example.com/\udcff"}, "url", "is not valid UTF-8 text (target 700)"),
        ({"idx": 3}, "idx", "target 3 of job 'j' is given twice or already stored"),
    ],
)
def test_a_bad_row_inside_a_many_row_insert_is_named_and_nothing_stays(
    file_store: Path, bad: dict[str, Any], field: str, problem: str
) -> None:
    targets = make_targets(1000)
    for name, value in bad.items():
        setattr(targets[700], name, value)
    with pytest.raises(dcache.InvalidBatchInput) as refused:
        dcache.create_batch_job(make_job("j", targets_total=1000), targets)
    assert (refused.value.field, refused.value.problem) == (field, problem)
    assert dcache.batch_job("j") is None
    assert dcache.batch_nbytes() == 0
