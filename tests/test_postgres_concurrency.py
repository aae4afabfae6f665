"""The rules under concurrent writers on PostgreSQL: 8 real processes (multiprocessing, 'spawn', each its own
``open_db``) standing in for hosts, all released at once by a barrier.

- Counting: every process writes every target of one job, many times over: targets_done counts each
  target once, nbytes is exactly the stored results' size, and no finished target goes back.
- Eviction: 4 evictors at once, with 4 writers rewriting live jobs, evict exactly what one would.
- Sweep: sweepers and lease refreshers at once: a job whose refresh succeeded is never swept.
- submit_batch_job: bursts of the same (caller, key) from 8 processes make one job per key.

Every error a process meets is reported and must be none (a StoreConflict included).
"""

from __future__ import annotations

import multiprocessing
import random
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Barrier
from typing import Any

import pytest
from conftest import open_empty_postgres, postgres_target
from helpers import job_with_bytes, make_job, make_targets

from sift import dcache
from sift.dcache import BatchTarget, db

pytestmark = pytest.mark.postgres

PROCESSES = 8
TIMEOUT_S = 300.0
ctx = multiprocessing.get_context("spawn")


@pytest.fixture
def schema(postgres_schema: str) -> Iterator[str]:
    open_empty_postgres(postgres_schema)
    yield postgres_schema
    dcache.close_db()


def run_all(worker: Callable[..., dict[str, Any]], args: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Run ``worker(*args[i], barrier, results)`` in one process per entry; return what each reported."""
    barrier = ctx.Barrier(len(args))
    results = ctx.Queue()
    processes = [ctx.Process(target=_entry, args=(worker, *a, barrier, results)) for a in args]
    for process in processes:
        process.start()
    reports = [results.get(timeout=TIMEOUT_S) for _ in processes]
    for process in processes:
        process.join(timeout=TIMEOUT_S)
        assert process.exitcode == 0
    return reports


def _entry(worker: Callable[..., dict[str, Any]], *args: Any) -> None:
    *rest, barrier, results = args
    try:
        out = worker(*rest, barrier)
    except BaseException as exc:  # reported, so the test names it instead of timing out
        out = {"errors": [f"{type(exc).__name__}: {exc}"]}
    results.put(out)


# -- Exactly-once counting on one target set --------------------------------------------------------------

TARGETS = 24
ROUNDS = 6


def _counting_writer(target: str, seed: int, barrier: Barrier) -> dict[str, Any]:
    rng = random.Random(seed)
    dcache.open_db(target)
    errors: list[str] = []
    refused = 0
    barrier.wait()
    for _ in range(ROUNDS):
        for idx in rng.sample(range(TARGETS), TARGETS):
            try:
                if rng.random() < 0.2:
                    dcache.update_batch_target("job", idx, "running", now=5)
                else:
                    size = rng.randint(0, 40)
                    dcache.update_batch_target("job", idx, "done", result="é" * size, now=5)
            except dcache.InvalidBatchInput:
                refused += 1  # a finished target going back to running: the rule
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    dcache.close_db()
    return {"errors": errors, "refused": refused}


@pytest.mark.slow
def test_same_targets_from_8_processes_count_exactly(schema: str) -> None:
    dcache.create_batch_job(make_job("job", status="running", targets_total=TARGETS), make_targets(TARGETS))
    reports = run_all(_counting_writer, [(postgres_target(schema), seed) for seed in range(PROCESSES)])
    assert [r["errors"] for r in reports] == [[]] * PROCESSES
    job = dcache.batch_job("job")
    targets = dcache.batch_targets("job")
    assert job is not None and targets is not None
    finished = [t for t in targets if t.status == "done"]
    assert len(finished) == TARGETS  # every target was finished by someone, and none went back
    assert job.targets_done == TARGETS
    assert job.nbytes == sum(len(t.result.encode()) for t in finished if t.result is not None)
    assert dcache.batch_nbytes() == job.nbytes
    assert sum(r["refused"] for r in reports) > 0  # the race happened: some went back and were refused


# -- Eviction by 4 at once, with 4 writers --------------------------------------------------------------

EVICTABLE_JOBS = 400
LIVE_JOBS = 8


def _evictor(target: str, budget: int, barrier: Barrier) -> dict[str, Any]:
    dcache.open_db(target)
    barrier.wait()
    try:
        return {"errors": [], "evicted": dcache.evict_batch_oldest(budget)}
    except Exception as exc:
        return {"errors": [f"{type(exc).__name__}: {exc}"], "evicted": 0}


def _rewriter(target: str, p: int, barrier: Barrier) -> dict[str, Any]:
    """Rewrites results of its live job with ones of the same size: the total does not move."""
    dcache.open_db(target)
    errors = []
    barrier.wait()
    for i in range(150):
        try:
            dcache.update_batch_target(f"live-{p}", i % 3, "done", result=f"{i % 10}" * 10, now=50_000 + i)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    return {"errors": errors, "evicted": 0}


@pytest.mark.slow
def test_four_evictors_evict_what_one_would(schema: str) -> None:
    rng = random.Random(7)
    for i in range(EVICTABLE_JOBS):
        lease, nbytes = rng.randint(1, 50), rng.randint(1, 900)
        job_with_bytes(f"ev-{i:04d}", nbytes, status="done", lease=lease, created_at=i)
    for p in range(LIVE_JOBS):
        dcache.create_batch_job(make_job(f"live-{p}", status="running", lease=40_000), make_targets(3))
        for idx in range(3):
            dcache.update_batch_target(f"live-{p}", idx, "done", result="x" * 10, now=40_000)
    total = dcache.batch_nbytes()
    budget = total * 2 // 3
    expected = {job.id for job in dcache.evict_candidates(budget)}
    assert 50 < len(expected) < EVICTABLE_JOBS
    target = postgres_target(schema)
    reports = run_all(
        _evict_or_rewrite,
        [("evict", target, budget) for _ in range(4)] + [("rewrite", target, p) for p in range(4)],
    )
    assert [r["errors"] for r in reports] == [[]] * 8
    remaining = {row[0] for row in db.execute_sql("SELECT id FROM batch_job WHERE id LIKE 'ev-%%'")}
    assert {f"ev-{i:04d}" for i in range(EVICTABLE_JOBS)} - remaining == expected
    assert sum(r["evicted"] for r in reports) == len(expected)
    assert dcache.batch_nbytes() <= budget
    assert dcache.batch_nbytes() == db.execute_sql("SELECT SUM(nbytes) FROM batch_job").fetchone()[0]


def _evict_or_rewrite(kind: str, target: str, arg: int, barrier: Barrier) -> dict[str, Any]:
    return _evictor(target, arg, barrier) if kind == "evict" else _rewriter(target, arg, barrier)


# -- Sweep against lease refreshers ---------------------------------------------------------------------

SWEPT_JOBS = 1_000


def _sweep_or_touch(kind: str, target: str, seed: int, barrier: Barrier) -> dict[str, Any]:
    dcache.open_db(target)
    errors: list[str] = []
    touched: list[str] = []
    swept = 0
    barrier.wait()
    if kind == "sweep":
        for _ in range(5):
            try:
                swept += dcache.sweep_batch(100, now=1_000)  # cutoff 900: refreshed jobs (lease 5000) stay
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    else:
        rng = random.Random(seed)
        for i in rng.sample(range(SWEPT_JOBS), SWEPT_JOBS // 3):
            try:
                dcache.touch_batch_job(f"old-{i:04d}", now=5_000)
            except dcache.JobNotFound:
                continue  # swept first: the refresh came too late, as it may
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            touched.append(f"old-{i:04d}")
            try:  # refreshed: no sweep may take it now
                dcache.update_batch_target(f"old-{i:04d}", 0, "done", result="r", now=5_000)
            except Exception as exc:
                errors.append(f"after its refresh: {type(exc).__name__}: {exc}")
    return {"errors": errors, "touched": touched, "swept": swept}


@pytest.mark.slow
def test_sweep_never_deletes_a_refreshed_job(schema: str) -> None:
    for i in range(SWEPT_JOBS):
        dcache.create_batch_job(make_job(f"old-{i:04d}", lease=10 + i % 50, targets_total=2), make_targets(2))
    target = postgres_target(schema)
    reports = run_all(
        _sweep_or_touch,
        [("sweep", target, s) for s in range(4)] + [("touch", target, s) for s in range(4)],
    )
    assert [r["errors"] for r in reports] == [[]] * 8
    touched = {job for r in reports for job in r["touched"]}
    remaining = {row[0] for row in db.execute_sql("SELECT id FROM batch_job")}
    assert touched <= remaining  # every successful refresh kept its job
    assert remaining == touched  # and every other job was swept, exactly once
    assert sum(r["swept"] for r in reports) == SWEPT_JOBS - len(remaining)
    orphans = db.execute_sql(
        "SELECT COUNT(*) FROM batch_target WHERE job_id NOT IN (SELECT id FROM batch_job)"
    ).fetchone()[0]
    assert orphans == 0


# -- submit_batch_job bursts ----------------------------------------------------------------------------

KEYS = 100


def _submitter(target: str, p: int, barrier: Barrier) -> dict[str, Any]:
    dcache.open_db(target)
    rng = random.Random(p)
    answers: dict[str, str] = {}
    errors: list[str] = []
    barrier.wait()
    for k in rng.sample(range(KEYS), KEYS):
        job = make_job(f"p{p}-k{k}", idem_key=f"key-{k}", created_at=1_000, lease=1_000, targets_total=1)
        try:
            answers[f"key-{k}"], _ = dcache.submit_batch_job(
                job, [BatchTarget(idx=0, url="u", options="{}")], 60, now=1_010
            )
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    return {"errors": errors, "answers": answers}


@pytest.mark.slow
def test_submit_bursts_make_one_job_per_key(schema: str) -> None:
    reports = run_all(_submitter, [(postgres_target(schema), p) for p in range(PROCESSES)])
    assert [r["errors"] for r in reports] == [[]] * PROCESSES
    rows = db.execute_sql("SELECT idem_key, id FROM batch_job").fetchall()
    assert len(rows) == KEYS  # one job per key, no duplicates
    jobs = dict(rows)
    for report in reports:
        assert report["answers"] == jobs  # every process was answered with the one job
    assert db.execute_sql("SELECT COUNT(*) FROM batch_target").fetchone()[0] == KEYS
