"""How soon a wait ends after the write that ends it: ``wait_for_batch_job`` in this process, the job
finished by another process, timed from the start of that process's finishing call (its commit is inside
it: PostgreSQL may deliver the notification before the call returns) to the wait's return, so each figure
is at most the finishing call's own time longer than the time from its commit."""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from sift import dcache
from sift.testing import make_job, make_targets

from ..harness import Report
from ..sizes import T0, Sizes
from ..stores import POSTGRES, SQLITE, PgServer, StoreUnderTest

#: The goal of each backend, in ms at the median: SQLite looks every few ms, PostgreSQL is told.
WAIT_GOALS_MS = {SQLITE: 100.0, POSTGRES: 50.0}


def finisher(target: str, jobs: int, go: Any, done: Any) -> None:
    """The other process: for each job in turn, once told to, finish it and report when the finishing call
    started (CLOCK_MONOTONIC is one clock for every process of the machine)."""
    dcache.open_db(target)
    try:
        for i in range(jobs):
            if go.recv() is None:
                return
            dcache.update_batch_target(f"wait-{i}", 0, "done", result="r", now=T0 + i)
            started = time.monotonic()
            dcache.finish_batch_job(f"wait-{i}", now=T0 + i)
            done.send(started)
    finally:
        dcache.close_db()


def _armed(job_id: str) -> None:
    """Return once a wait for ``job_id`` is registered and the process's change feed is armed."""
    waiters = dcache.db.backend.job_waiters()
    while job_id not in waiters.job_ids():
        time.sleep(0.001)
    probe = threading.Event()
    waiters.add("bench-probe", probe)
    waiters.remove("bench-probe", probe)


def _wait(job_id: str, returned: list[float]) -> None:
    dcache.wait_for_batch_job(job_id, timeout=60)
    returned.append(time.monotonic())


def wait_latencies(target: str, rounds: int) -> list[float]:
    """Each round: a wait for a job in a thread here, then another process finishes it; the wait's return
    less the start of the finishing call, in µs."""
    dcache.open_db(target)
    for i in range(rounds):
        dcache.create_batch_job(
            make_job(id=f"wait-{i}", targets_total=1, created_at=T0, lease=T0), make_targets(1)
        )
    ctx = multiprocessing.get_context("spawn")
    (go_recv, go_send), (done_recv, done_send) = ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)
    proc = ctx.Process(target=finisher, args=(target, rounds, go_recv, done_send))
    proc.start()
    latencies: list[float] = []
    try:
        for i in range(rounds):
            returned: list[float] = []
            waiter = threading.Thread(target=_wait, args=(f"wait-{i}", returned))
            waiter.start()
            _armed(f"wait-{i}")
            go_send.send(i)
            started = done_recv.recv()
            waiter.join(60)
            if not returned:
                raise RuntimeError(f"wait: the wait for wait-{i} never ended")
            latencies.append((returned[0] - started) * 1e6)
    finally:
        go_send.send(None)
        proc.join(60)
        dcache.close_db()
    return latencies


def _report(report: Report, store: StoreUnderTest, latencies: list[float]) -> None:
    name = f"{store.prefix}wait/after_write"
    case = report.case(name, len(latencies), latencies, p90_ms=_p90(latencies) / 1000)
    report.goal(
        f"{store.goal_prefix}wait_for_batch_job: median from another process's finishing write to the wait's "
        "return",
        case.median_us / 1000,
        WAIT_GOALS_MS[store],
        "ms",
    )


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def bench_wait(tmp: Path, sizes: Sizes, report: Report) -> None:
    """A SQLite file: waits ended by another process's commit (the change feed's 5 ms look)."""
    _report(report, SQLITE, wait_latencies(str(tmp / "wait.db"), sizes.wait_rounds))


def pg_wait(server: PgServer, sizes: Sizes, report: Report) -> None:
    """PostgreSQL: waits ended by another process's commit (NOTIFY to the process's listening connection)."""
    schema = server.new_schema("wait")
    _report(report, POSTGRES, wait_latencies(server.target(schema), sizes.wait_rounds))
