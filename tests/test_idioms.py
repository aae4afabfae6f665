"""Peewee's own connection idioms, as web apps and shells write them, from 8 real threads at once.

The store shares one connection between threads, while Peewee's idioms assume one connection per thread:
``db.connect()``/``db.close()`` in request hooks (Flask, Bottle, Django middleware and FastAPI, as Peewee
documents them), ``with db:``, ``with db.connection_context():``, the same as a decorator, ``db.atomic()``,
Peewee sessions, ``open_db``/``close_db`` per request, and the deferred ``db.init(path)``. Each idiom runs
8 threads x 500 uses on a real WAL file, each use wrapping store calls and an ad-hoc model query. After
it: no error, the totals are exact, no transaction is left open, and a second connection sees every write.
"""

from __future__ import annotations

import random
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from pathlib import Path
from typing import Any

import helpers
import pytest
from helpers import make_job, make_targets

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, db

THREADS = 8
USES = 500
JOIN_TIMEOUT_S = 120.0

Use = Callable[[Path], AbstractContextManager[Any]]


@contextmanager
def flask_hooks(path: Path) -> Iterator[None]:
    """Peewee's Flask (and Bottle) pattern: connect in before_request, close in teardown_request."""
    db.connect()
    try:
        yield
    finally:
        if not db.is_closed():
            db.close()


@contextmanager
def reuse_if_open(path: Path) -> Iterator[None]:
    db.connect(reuse_if_open=True)
    try:
        yield
    finally:
        db.close()


@contextmanager
def with_db(path: Path) -> Iterator[None]:
    with db:
        yield


@contextmanager
def connection_context(path: Path) -> Iterator[None]:
    with db.connection_context():
        yield


@contextmanager
def atomic(path: Path) -> Iterator[None]:
    with db.atomic():
        yield


@contextmanager
def session(path: Path) -> Iterator[None]:
    with helpers.session():
        yield


@contextmanager
def open_per_request(path: Path) -> Iterator[None]:
    dcache.open_db(path)
    try:
        yield
    finally:
        dcache.close_db()


@contextmanager
def mixed(path: Path) -> Iterator[None]:
    """Any of the idioms above, chosen per use, with another nested inside half the time (open_db and
    close_db belong outside any transaction, so they are never the inner one)."""
    outer, inner = random.sample(list(IDIOMS.values())[:-1], 2)
    if inner is open_per_request:
        outer, inner = inner, outer
    with outer(path):
        if random.random() < 0.5:
            with inner(path):
                yield
        else:
            yield


IDIOMS: dict[str, Use] = {
    "flask-hooks": flask_hooks,
    "reuse-if-open": reuse_if_open,
    "with-db": with_db,
    "connection-context": connection_context,
    "atomic": atomic,
    "session": session,
    "open-per-request": open_per_request,
    "mixed": mixed,
}


def run_threads(work: Callable[[int], None]) -> list[str]:
    errors: list[str] = []

    def guarded(t: int) -> None:
        try:
            work(t)
        except BaseException as exc:  # every failure, whatever it is, fails the test
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=guarded, args=(t,), daemon=True) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
    hung = [t for t, thread in enumerate(threads) if thread.is_alive()]
    return errors + [f"thread {t} still running after {JOIN_TIMEOUT_S:g} s" for t in hung]


def assert_nothing_left_open(path: Path) -> None:
    """No transaction is open in this process, the lock is free, and another process could write."""
    assert not db.in_transaction()
    assert db.lock.acquire(blocking=False)
    db.lock.release()
    conn = db._state.conn
    assert conn is None or not conn.in_transaction
    with closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # fails at once if our connection still held a write transaction
        other.execute("ROLLBACK")


def second_connection_view(path: Path) -> dict[str, tuple[int, int, int]]:
    """job id -> (targets_done, nbytes, done target rows), read by a plain sqlite3 connection."""
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT j.id, j.targets_done, j.nbytes, "
            "(SELECT COUNT(*) FROM batch_target t WHERE t.job_id = j.id AND t.status = 'done') "
            "FROM batch_job j"
        ).fetchall()
        total = conn.execute("SELECT nbytes FROM batch_totals").fetchone()[0]
        assert total == sum(row[2] for row in rows)
    return {row[0]: (row[1], row[2], row[3]) for row in rows}


@pytest.mark.slow
@pytest.mark.parametrize("idiom", list(IDIOMS))
def test_idiom_from_8_threads(tmp_path: Path, idiom: str) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path)
    for t in range(THREADS):
        dcache.create_batch_job(make_job(f"job-{t}", targets_total=USES), make_targets(USES))
    use = IDIOMS[idiom]

    def work(t: int) -> None:
        random.seed(t)
        job_id = f"job-{t}"
        for i in range(USES):
            with use(path):
                dcache.update_batch_target(job_id, i, "done", result="é" * (i % 7), now=2_000 + i)
                job = BatchJob.get_by_id(job_id)  # an ad-hoc model read inside the same use
                assert job.targets_done >= i + 1
                assert BatchTarget.select().where(BatchTarget.job_id == job_id).count() == USES

    try:
        assert run_threads(work) == []
        assert_nothing_left_open(path)  # first: closing the store would end a transaction left open
        expected = {f"job-{t}": (USES, sum(2 * (i % 7) for i in range(USES)), USES) for t in range(THREADS)}
        assert second_connection_view(path) == expected
        assert dcache.batch_nbytes() == sum(nbytes for _, nbytes, _ in expected.values())
    finally:
        dcache.close_db()


@pytest.mark.parametrize(
    "idiom", ["flask-hooks", "reuse-if-open", "connection-context", "with-db", "atomic", "session"]
)
def test_idiom_never_closes_the_store_under_another_thread(tmp_path: Path, idiom: str) -> None:
    """While one thread is inside a transaction of its own, other threads' idioms run and end; the
    transaction still commits on the same connection afterwards."""
    path = tmp_path / "store.db"
    dcache.open_db(path)
    dcache.create_batch_job(make_job("held", targets_total=1), make_targets(1))
    connection = db.connection()
    inside, others_done = threading.Event(), threading.Event()
    errors: list[str] = []

    def holder() -> None:
        try:
            with db.atomic():
                dcache.update_batch_target("held", 0, "done", result="x", now=5)
                inside.set()
                others_done.wait(60)
        except BaseException as exc:
            errors.append(repr(exc))

    def other(t: int) -> None:
        inside.wait(30)
        for _ in range(50):
            with IDIOMS[idiom](path):
                pass

    try:
        thread = threading.Thread(target=holder)
        thread.start()
        others = [threading.Thread(target=other, args=(t,)) for t in range(4)]
        for o in others:
            o.start()
        # The idioms that open a transaction wait for the holder; the others finish while it holds it.
        if idiom not in ("with-db", "atomic", "session"):
            for o in others:
                o.join(20)
            assert not any(o.is_alive() for o in others)
            assert thread.is_alive() and not others_done.is_set()
        others_done.set()
        thread.join(30)
        for o in others:
            o.join(30)
        assert errors == []
        assert db.connection() is connection
        assert_nothing_left_open(path)
        assert second_connection_view(path)["held"] == (1, 1, 1)
    finally:
        others_done.set()
        dcache.close_db()


def test_connect_and_close_while_open_do_nothing(file_store: Path) -> None:
    connection = db.connection()
    assert db.connect() is False
    assert db.connect(reuse_if_open=True) is False
    assert db.close() is False
    assert not db.is_closed()
    assert db.connection() is connection
    with db.connection_context():
        pass
    with db:
        pass
    assert db.connection() is connection


def test_connection_context_as_a_decorator(file_store: Path) -> None:
    @db.connection_context()
    def view() -> int:
        return int(BatchJob.select().count())

    assert view() == 0
    assert not db.is_closed()


def test_with_db_is_a_transaction_of_its_own_thread(file_store: Path) -> None:
    with pytest.raises(RuntimeError), db:
        dcache.create_batch_job(make_job("rolled-back"))
        raise RuntimeError("the block fails")
    assert dcache.batch_job("rolled-back") is None
    with db:
        dcache.create_batch_job(make_job("kept"))
    assert second_connection_view(file_store) == {"kept": (0, 0, 0)}


def test_idioms_before_open_db_raise_store_not_open() -> None:
    dcache.close_db()
    db.init(None)
    with pytest.raises(dcache.StoreNotOpen):
        db.connect()
    with pytest.raises(dcache.StoreNotOpen), db.connection_context():
        pass
    with pytest.raises(dcache.StoreNotOpen), db:
        pass
    assert db.close() is False
    assert db.lock.acquire(blocking=False)
    db.lock.release()


def test_close_db_then_connect_and_close_are_real(tmp_path: Path) -> None:
    """After close_db, connect() opens a connection of the caller's and close() closes it."""
    dcache.open_db(tmp_path / "store.db")
    dcache.close_db()
    assert db.is_closed()
    assert db.connect() is True
    assert db.close() is True
    assert db.is_closed()


def test_db_init_opens_the_store_with_its_schema(tmp_path: Path) -> None:
    path = tmp_path / "deferred.db"
    db.init(path)
    try:
        dcache.create_batch_job(make_job(targets_total=1), make_targets(1))
        dcache.update_batch_target("job-1", 0, "done", result="abc", now=5)
        assert dcache.batch_nbytes() == 3
        assert repr(db) == f"<SerializedSqliteDatabase {str(path)!r}: open>"
    finally:
        db.init(None)
    assert db.deferred
    assert second_connection_view(path) == {"job-1": (1, 3, 1)}


def test_db_init_takes_only_the_store_options(tmp_path: Path) -> None:
    with pytest.raises(dcache.StoreUnavailable, match=r"^pragmas: "):
        db.init(tmp_path / "x.db", pragmas={"journal_mode": "delete"})
    assert not (tmp_path / "x.db").exists()
    db.init(tmp_path / "y.db", timeout=1.0)
    try:
        assert dcache.batch_nbytes() == 0
    finally:
        db.init(None)


def test_db_init_from_threads_switches_under_the_lock(tmp_path: Path) -> None:
    """Reopening while other threads write: each write lands whole in one store or the other."""
    paths = [tmp_path / "a.db", tmp_path / "b.db"]
    for path in paths:
        dcache.open_db(path)
        for t in range(THREADS):
            dcache.create_batch_job(make_job(f"job-{t}", targets_total=1), make_targets(1))
    dcache.close_db()
    db.init(paths[0])
    stop = threading.Event()

    def writer(t: int) -> None:
        i = 0
        while not stop.is_set() and i < 2_000:
            dcache.touch_batch_job(f"job-{t}", now=10_000 + i)
            i += 1

    def switcher() -> None:
        for i in range(40):
            db.init(paths[i % 2])
        stop.set()

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(THREADS)]
    errors: list[str] = []

    def guarded() -> None:
        try:
            switcher()
        except BaseException as exc:
            errors.append(repr(exc))
            stop.set()

    extra = threading.Thread(target=guarded)
    for thread in [*threads, extra]:
        thread.start()
    for thread in [*threads, extra]:
        thread.join(JOIN_TIMEOUT_S)
    try:
        assert errors == []
        assert_nothing_left_open(paths[0])
        assert_nothing_left_open(paths[1])
    finally:
        db.init(None)


def test_repr_names_the_file_and_its_state(tmp_path: Path) -> None:
    dcache.close_db()
    db.init(None)
    assert repr(db) == "<SerializedSqliteDatabase: no store open; call sift.dcache.open_db(path)>"
    path = tmp_path / "store.db"
    dcache.open_db(path)
    assert repr(db) == f"<SerializedSqliteDatabase {str(path)!r}: open>"
    dcache.close_db()
    assert repr(db) == f"<SerializedSqliteDatabase {str(path)!r}: closed>"
    dcache.open_db(path, readonly=True)
    try:
        assert repr(db) == f"<SerializedSqliteDatabase {str(path)!r}: open, read-only>"
    finally:
        dcache.close_db()


def test_request_hooks_run_no_statement(file_store: Path) -> None:
    """What keeps Peewee's hooks free (the bench measures it): no SQL, and no wait on the lock."""
    statements: list[str] = []
    connection = db.connection()
    connection.set_trace_callback(statements.append)
    try:
        for _ in range(10):
            with flask_hooks(file_store), connection_context(file_store):
                pass
    finally:
        connection.set_trace_callback(None)
    assert statements == []


@pytest.mark.parametrize("call", ["open_db", "close_db", "db.init"])
def test_open_or_close_inside_ones_own_transaction_is_refused(file_store: Path, call: str) -> None:
    """Closing the connection would end the caller's transaction half-done: a clear error instead, and
    the store and the transaction are as they were."""
    calls: dict[str, Callable[[], object]] = {
        "open_db": lambda: dcache.open_db(file_store),
        "close_db": dcache.close_db,
        "db.init": lambda: db.init(file_store),
    }
    refused = "close_db" if call == "close_db" else "open_db"  # db.init(path) is open_db(path)
    connection = db.connection()
    with db.atomic():
        dcache.create_batch_job(make_job("inside"))
        with pytest.raises(dcache.BatchError, match=rf"^database: {refused}\(\) inside a transaction"):
            calls[call]()
        assert db.connection() is connection
    assert db.close() is False  # still the store's connection
    assert second_connection_view(file_store) == {"inside": (0, 0, 0)}
