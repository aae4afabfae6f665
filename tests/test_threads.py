"""Reliability under threads: 16 real threads x 500 mixed operations on one shared WAL store.

Every thread runs manager writes (updates with some targets re-written, touches, status changes, creates,
puts) and ad-hoc Peewee reads on the models at once. Each target is either *owned* by one thread, which
then knows its exact final state, or *contested*: any thread may finish or re-finish it. Deliberate
errors (a finished target sent back, a duplicate id, an idx put twice, an unknown target) are counted
and must match exactly; anything else that raises is a failure. At the end the rule 4 invariants are
checked row by row in Python, and no write may be lost.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import open_empty_postgres
from helpers import make_job, make_targets

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, db

THREADS = 16
OPS_PER_THREAD = 500
SHARED_JOBS = 8
OWNED_PER_THREAD = 2  # owned targets per thread in each shared job
CONTESTED = 16  # targets of each shared job that any thread may finish
SHARED_TOTAL = THREADS * OWNED_PER_THREAD + CONTESTED
FINAL = ("done", "failed")
JOB_STATUSES = tuple(s.value for s in dcache.JobStatus)
PIECES = ("é", "☃", "🎉", "a", "\u00a0", "ß", "'", "\u200b")
JOIN_TIMEOUT_S = 120.0

#: Figures of the last run, for docs/explanation/guarantees.md.
RECORD: dict[str, int] = {}

TargetState = tuple[str, str | None, str | None, str | None]  # status, result, error, hint


def shared_id(j: int) -> str:
    return f"shared-{j}"


def owner_of(idx: int) -> int | None:
    """The thread owning target ``idx`` of a shared job, or None for a contested target."""
    return idx % THREADS if idx < THREADS * OWNED_PER_THREAD else None


@dataclass
class OwnJob:
    """A job a worker created: it owns all its targets."""

    job_id: str
    total: int
    stored: int = 0  # targets 0..stored-1 are stored


@dataclass
class Worker:
    tid: int
    rng: random.Random
    all_jobs: list[str]
    all_jobs_lock: threading.Lock
    owned: dict[tuple[str, int], TargetState] = field(default_factory=dict)
    contested: dict[tuple[str, int], set[str]] = field(default_factory=lambda: defaultdict(set))
    own_jobs: list[OwnJob] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    expected: Counter[str] = field(default_factory=Counter)
    raised: Counter[str] = field(default_factory=Counter)
    ops: Counter[str] = field(default_factory=Counter)
    updates_ok: int = 0
    targets_put: int = 0
    serial: int = 0

    def text(self) -> str:
        """A unique non-ASCII string: every write can be told apart afterwards."""
        self.serial += 1
        return f"t{self.tid}#{self.serial}:" + "".join(self.rng.choices(PIECES, k=self.rng.randint(0, 40)))

    def run(self, barrier: threading.Barrier) -> None:
        barrier.wait()
        choices = (
            (self.update_owned, 30),
            (self.update_contested, 15),
            (self.touch, 8),
            (self.set_status, 8),
            (self.create, 6),
            (self.put, 6),
            (self.duplicate_create, 1),
            (self.unknown_target, 1),
            (self.read_models, 12),
            (self.read_functions, 6),
            (self.check_job_atomically, 7),
        )
        ops, weights = zip(*choices, strict=True)
        for _ in range(OPS_PER_THREAD):
            op = self.rng.choices(ops, weights)[0]
            self.ops[op.__name__] += 1
            try:
                op()
            except BaseException as exc:  # every exception is collected, none is lost
                self.unexpected.append(f"thread {self.tid} {op.__name__}: {type(exc).__name__}: {exc}")

    def expect(self, error: type[BaseException], call: Any, *args: Any, **kwargs: Any) -> None:
        """Make a deliberate bad call: it must raise exactly ``error``."""
        self.expected[error.__name__] += 1
        try:
            call(*args, **kwargs)
        except error:
            self.raised[error.__name__] += 1
            return
        self.unexpected.append(f"thread {self.tid}: {call.__name__}{args} did not raise {error.__name__}")

    def some_job(self) -> str:
        with self.all_jobs_lock:
            return self.rng.choice(self.all_jobs)

    # -- writes ---------------------------------------------------------------------------------------

    def update_owned(self) -> None:
        targets = [
            (shared_id(j), i)
            for j in range(SHARED_JOBS)
            for i in range(SHARED_TOTAL)
            if owner_of(i) == self.tid
        ]
        targets += [(own.job_id, i) for own in self.own_jobs for i in range(own.stored)]
        job_id, idx = self.rng.choice(targets)
        status = self.owned.get((job_id, idx), ("pending", None, None, None))[0]
        if status in FINAL and self.rng.random() < 0.1:  # a finished target sent back: refused, no change
            self.expect(
                dcache.InvalidBatchInput,
                dcache.update_batch_target,
                job_id,
                idx,
                self.rng.choice(("pending", "running")),
            )
            return
        new: TargetState
        if status not in FINAL and self.rng.random() < 0.3:
            new = ("running", None, None, None)
        else:  # first finish, or a re-write of a finished target
            result = self.text() if self.rng.random() < 0.85 else None
            new = (
                self.rng.choice(FINAL),
                result,
                self.rng.choice((None, self.text())),
                self.rng.choice((None, "h")),
            )
        dcache.update_batch_target(
            job_id, idx, new[0], result=new[1], error=new[2], hint=new[3], now=self.now()
        )
        self.owned[(job_id, idx)] = new
        self.updates_ok += 1

    def update_contested(self) -> None:
        job_id = shared_id(self.rng.randrange(SHARED_JOBS))
        idx = self.rng.randrange(THREADS * OWNED_PER_THREAD, SHARED_TOTAL)
        result = self.text()
        dcache.update_batch_target(job_id, idx, self.rng.choice(FINAL), result=result, now=self.now())
        self.contested[(job_id, idx)].add(result)
        self.updates_ok += 1

    def touch(self) -> None:
        dcache.touch_batch_job(self.some_job(), now=self.now())

    def set_status(self) -> None:
        dcache.set_batch_job_status(
            self.some_job(), self.rng.choice(JOB_STATUSES), self.text(), now=self.now()
        )

    def create(self) -> None:
        own = OwnJob(f"t{self.tid}-job{len(self.own_jobs)}-\u00e9", self.rng.randint(1, 20))
        with_targets = self.rng.random() < 0.5
        options = {"k": self.text()}  # a dict, stored as compact JSON
        targets = [BatchTarget(idx=i, url=f"https://e.test/{i}", options=options) for i in range(own.total)]
        job = make_job(own.job_id, caller=f"caller-{self.tid}", targets_total=own.total)
        dcache.create_batch_job(job, targets if with_targets else None)
        own.stored = own.total if with_targets else 0
        self.targets_put += own.stored
        self.own_jobs.append(own)
        with self.all_jobs_lock:
            self.all_jobs.append(own.job_id)

    def put(self) -> None:
        unfilled = [own for own in self.own_jobs if own.stored < own.total]
        if not unfilled:  # every target stored already: putting one again is refused, no change
            if self.own_jobs:
                own = self.rng.choice(self.own_jobs)
                self.expect(
                    dcache.InvalidBatchInput,
                    dcache.put_batch_targets,
                    own.job_id,
                    make_targets(1, own.total - 1),
                )
            return
        own = self.rng.choice(unfilled)
        count = self.rng.randint(1, own.total - own.stored)
        dcache.put_batch_targets(own.job_id, (t for t in make_targets(count, own.stored)))
        own.stored += count
        self.targets_put += count

    def duplicate_create(self) -> None:
        job_id = self.own_jobs[0].job_id if self.own_jobs else shared_id(self.tid % SHARED_JOBS)
        self.expect(dcache.DuplicateJob, dcache.create_batch_job, make_job(job_id), make_targets(3))

    def unknown_target(self) -> None:
        self.expect(
            dcache.TargetNotFound, dcache.update_batch_target, shared_id(0), SHARED_TOTAL + self.tid, "done"
        )

    def now(self) -> int:
        return 2_000 + self.rng.randrange(1_000)

    # -- reads ----------------------------------------------------------------------------------------

    def read_models(self) -> None:
        status = self.rng.choice(JOB_STATUSES)
        jobs = list(BatchJob.select().where(BatchJob.status == status))
        if any(job.status != status or not 0 <= job.targets_done <= job.targets_total for job in jobs):
            raise AssertionError(f"model read returned an impossible job: {[j.__data__ for j in jobs]}")
        if BatchTarget.select().count() < SHARED_JOBS * SHARED_TOTAL:
            raise AssertionError("model count lost seeded targets")
        job_id = self.some_job()
        idxs = [
            t.idx for t in BatchTarget.select().where(BatchTarget.job_id == job_id).order_by(BatchTarget.idx)
        ]
        if idxs != sorted(set(idxs)):
            raise AssertionError(f"{job_id}: target idx not ordered and unique: {idxs}")

    def read_functions(self) -> None:
        job_id = self.some_job()
        job = dcache.batch_job(job_id)
        targets = dcache.batch_targets(job_id)
        if job is None or targets is None:
            raise AssertionError(f"{job_id}: missing on read")
        if [t.idx for t in targets] != list(range(len(targets))):
            raise AssertionError(f"{job_id}: batch_targets not in idx order")

    def check_job_atomically(self) -> None:
        """Rule 4 must hold at every commit: read one job and its targets in one ad-hoc transaction."""
        job_id = self.some_job()
        # One snapshot: SQLite's transaction holds the store; PostgreSQL's READ COMMITTED (Peewee's default)
        # takes a snapshot per statement, so a read that must be one snapshot asks for REPEATABLE READ.
        sqlite = isinstance(db.backend, dcache.SerializedSqliteDatabase)
        with db.atomic() if sqlite else db.atomic(isolation_level="REPEATABLE READ"):
            job = BatchJob.get(BatchJob.id == job_id)
            targets = list(BatchTarget.select().where(BatchTarget.job_id == job_id))
        done = sum(t.status in FINAL for t in targets)
        nbytes = sum(len(t.result.encode()) for t in targets if t.result is not None)
        if (job.targets_done, job.nbytes) != (done, nbytes):
            raise AssertionError(
                f"{job_id}: (targets_done, nbytes) {(job.targets_done, job.nbytes)} != {(done, nbytes)}"
            )


@pytest.fixture(params=["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """A WAL file, or a PostgreSQL schema (each thread on its own pooled connection)."""
    if request.param == "postgres":
        open_empty_postgres(request.getfixturevalue("postgres_schema"))
    else:
        dcache.open_db(tmp_path / "store.db")
    yield
    dcache.close_db()


@pytest.mark.slow
def test_threads_mixed_operations(shared_store: None) -> None:
    for j in range(SHARED_JOBS):
        dcache.create_batch_job(
            make_job(shared_id(j), targets_total=SHARED_TOTAL), make_targets(SHARED_TOTAL)
        )
    all_jobs = [shared_id(j) for j in range(SHARED_JOBS)]
    lock = threading.Lock()
    workers = [Worker(tid, random.Random(1000 + tid), all_jobs, lock) for tid in range(THREADS)]
    barrier = threading.Barrier(THREADS)
    before = dcache.stats()
    threads = [threading.Thread(target=w.run, args=(barrier,), name=f"worker-{w.tid}") for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a worker thread hung (deadlock?)"
    after = dcache.stats()

    unexpected = [msg for w in workers for msg in w.unexpected]
    expected = sum((w.expected for w in workers), Counter[str]())
    raised = sum((w.raised for w in workers), Counter[str]())
    assert unexpected == []
    assert raised == expected and sum(expected.values()) > 0
    assert sum(sum(w.ops.values()) for w in workers) == THREADS * OPS_PER_THREAD

    # Every row, read back with plain SQL: rule 4 computed in Python from the rows.
    jobs = {
        row[0]: row[1:]
        for row in db.execute_sql("SELECT id, targets_total, targets_done, nbytes FROM batch_job")
    }
    rows = db.execute_sql("SELECT job_id, idx, status, result, error, hint FROM batch_target").fetchall()
    by_job: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        by_job[row[0]].append(row)
    created = {own.job_id: own for w in workers for own in w.own_jobs}
    assert set(jobs) == set(all_jobs) == {shared_id(j) for j in range(SHARED_JOBS)} | set(created)
    for job_id, (_total, targets_done, nbytes) in jobs.items():
        targets = by_job.get(job_id, [])
        assert targets_done == sum(r[2] in FINAL for r in targets), job_id
        assert nbytes == sum(len(r[3].encode("utf-8")) for r in targets if r[3] is not None), job_id
        expected_count = SHARED_TOTAL if job_id.startswith("shared-") else created[job_id].stored
        assert sorted(r[1] for r in targets) == list(range(expected_count)), job_id
    assert set(by_job) <= set(jobs), "targets without their job"
    assert dcache.batch_nbytes() == sum(nbytes for _, _, nbytes in jobs.values())

    # No lost update: an owned target holds its owner's last write, a contested one a value written to it.
    stored = {(r[0], r[1]): tuple(r[2:]) for r in rows}
    for w in workers:
        for key, state in w.owned.items():
            assert stored[key] == state, key
    written: dict[tuple[str, int], set[str]] = defaultdict(set)
    for w in workers:
        for key, results in w.contested.items():
            written[key] |= results
    for key, (status, result, _error, _hint) in stored.items():
        if owner_of(key[1]) is None and key[0].startswith("shared-"):
            assert (status in FINAL) == (key in written), key
            assert status == "pending" or result in written[key], key

    delta = {k: after[k] - before[k] for k in after}
    assert delta["target_writes"] == sum(w.updates_ok for w in workers)
    assert delta["jobs_created"] == len(created)
    assert delta["targets_put"] == sum(w.targets_put for w in workers)
    assert delta["invalid_input"] == expected["InvalidBatchInput"]
    assert delta["batch_write_miss"] == expected["TargetNotFound"]

    RECORD.update(
        threads=THREADS,
        ops_per_thread=OPS_PER_THREAD,
        target_writes=delta["target_writes"],
        jobs_created=len(created),
        targets_put=delta["targets_put"],
        expected_errors=sum(expected.values()),
        unexpected_errors=len(unexpected),
    )
    print(
        f"\nthreads: {THREADS} x {OPS_PER_THREAD} ops, {dict(sum((w.ops for w in workers), Counter[str]()))}"
    )
    print(f"threads: expected errors {dict(expected)}, unexpected 0, figures {RECORD}")


# -- An ad-hoc transaction is never interleaved with another thread's manager call ----------------------


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_adhoc_atomic_block_is_not_interleaved(file_store: Path, outcome: str) -> None:
    """Thread A holds ``with db.atomic():`` while thread B calls update_batch_target. B must wait for A's
    COMMIT or ROLLBACK: it never lands inside A's transaction, and A's ROLLBACK never undoes it."""
    dcache.create_batch_job(make_job("j", targets_total=3), make_targets(3))
    inside, b_trying = threading.Event(), threading.Event()
    log: list[str] = []
    seen: dict[str, Any] = {}
    errors: list[BaseException] = []

    class Rollback(Exception):
        pass

    def thread_a() -> None:
        try:
            with db.atomic():
                BatchJob.update(idem_key="from A").where(BatchJob.id == "j").execute()
                seen["first"] = BatchJob.get(BatchJob.id == "j").__data__.copy()
                inside.set()
                b_trying.wait(10)
                for _ in range(50):  # give B every chance to interleave, if the lock let it
                    time.sleep(0.005)
                    seen.setdefault("reads", []).append(BatchJob.get(BatchJob.id == "j").__data__.copy())
                log.append("A end")
                if outcome == "rollback":
                    raise Rollback
        except Rollback:
            pass
        except BaseException as exc:
            errors.append(exc)

    def thread_b() -> None:
        try:
            inside.wait(10)
            b_trying.set()
            dcache.update_batch_target("j", 0, "done", result="héllo", now=2_000)
            log.append("B done")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert log == ["A end", "B done"]
    assert all(read == seen["first"] for read in seen["reads"]), (
        "B's write became visible inside A's transaction"
    )
    assert seen["first"]["lease"] == 1_000 and seen["first"]["targets_done"] == 0

    job = dcache.batch_job("j")
    assert job is not None
    assert (job.targets_done, job.nbytes, job.lease) == (1, len("héllo".encode()), 2_000)
    assert job.idem_key == ("from A" if outcome == "commit" else "")
    targets = dcache.batch_targets("j")
    assert targets is not None and (targets[0].status, targets[0].result) == ("done", "héllo")
