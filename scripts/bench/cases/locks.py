"""Short lock holds and a bounded -wal file: a sweep and an eviction of many jobs, with every hold of
the store's lock timed and a reader thread polling meanwhile."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from sift import dcache

from ..fixtures import Builder, wal_bytes
from ..harness import Case, Report, log, p99, perf_ns
from ..sizes import T0, Sizes


class TimedLock:
    """Wraps db.lock (an RLock) and records how long each outermost hold lasted, per thread."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.depth = 0  # only the owner changes it, while holding inner
        self.since = 0
        self.holds: list[tuple[int, int]] = []  # (ns held, thread ident)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = bool(self.inner.acquire(blocking, timeout))
        if got:
            self.depth += 1
            if self.depth == 1:
                self.since = perf_ns()
        return got

    def release(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.holds.append((perf_ns() - self.since, threading.get_ident()))
        self.inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class Reader(threading.Thread):
    """Calls batch_job in a loop and records each call's latency."""

    def __init__(self, job_id: str) -> None:
        super().__init__(daemon=True)
        self.job_id = job_id
        self.stop = threading.Event()
        self.latencies: list[int] = []

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = perf_ns()
            if dcache.batch_job(self.job_id) is None:
                raise AssertionError("the reader's job is gone")
            self.latencies.append(perf_ns() - t0)


def timed_removal(label: str, run: Callable[[], int], expect: int) -> dict[str, float]:
    """Run a sweep or eviction with db.lock timed and a reader thread polling batch_job."""
    os.sync()  # no writeback of earlier groups' files (or their deletion) left to stall the timed run
    lock = TimedLock(dcache.db.lock)
    dcache.db.obj.lock = lock  # no public hook times the store's lock: the proxy stands in for this run only
    reader = Reader("keep-0000000")
    try:
        reader.start()
        time.sleep(0.05)
        t0 = perf_ns()
        removed = run()
        elapsed = perf_ns() - t0
    finally:
        reader.stop.set()
        reader.join()
        dcache.db.obj.lock = lock.inner
    if removed != expect:
        raise AssertionError(f"{label}: removed {removed} jobs, expected {expect}")
    mine = threading.get_ident()
    holds = sorted(ns for ns, who in lock.holds if who == mine)  # this thread: the sweep or eviction
    return {
        "max_hold_ms": holds[-1] / 1e6,
        "hold_p50_ms": holds[len(holds) // 2] / 1e6,
        "hold_p99_ms": p99(holds) / 1e6,
        "holds": float(len(holds)),
        "holds_over_50ms": float(sum(ns > 50_000_000 for ns in holds)),
        "max_hold_any_thread_ms": max(ns for ns, _ in lock.holds) / 1e6,
        "reader_p99_ms": p99(reader.latencies) / 1e6,
        "reader_max_ms": max(reader.latencies, default=0) / 1e6,
        "reader_calls": float(len(reader.latencies)),
        "elapsed_s": elapsed / 1e9,
    }


def bench_locks(tmp: Path, sizes: Sizes, report: Report) -> None:
    """Sweep many expired jobs, then evict as many finished ones, each with its lock holds timed."""
    path = tmp / "sweep.db"
    rows = sizes.sweep_jobs * (sizes.sweep_targets + 1)
    t0 = time.perf_counter()
    b = Builder(path)
    b.jobs("old-", sizes.sweep_jobs, targets=sizes.sweep_targets, result_bytes=sizes.sweep_result, lease0=T0)
    b.jobs("keep-", 100, targets=10, result_bytes=None, lease0=T0 + 10**6, statuses=("queued",))
    b.close()
    log(
        f"locks: built {sizes.sweep_jobs} expired jobs x {sizes.sweep_targets} targets "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    dcache.open_db(path)
    now = T0 + 10**6
    sweep = timed_removal("sweep", lambda: dcache.sweep_batch(1000, now=now), sizes.sweep_jobs)
    sweep["wal_mb"] = wal_bytes(path) / 2**20
    log(f"locks: swept {rows} rows in {sweep['elapsed_s']:.1f} s")
    dcache.close_db()

    t0 = time.perf_counter()
    b = Builder(path)
    b.jobs(
        "evict-", sizes.sweep_jobs, targets=sizes.sweep_targets, result_bytes=sizes.sweep_result, lease0=T0
    )
    b.close()
    log(f"locks: built {sizes.sweep_jobs} evictable jobs in {time.perf_counter() - t0:.1f} s")
    dcache.open_db(path)
    keep_bytes = dcache.batch_nbytes() - sizes.sweep_jobs * sizes.sweep_targets * sizes.sweep_result
    evict = timed_removal("evict", lambda: dcache.evict_batch_oldest(keep_bytes), sizes.sweep_jobs)
    evict["wal_mb"] = wal_bytes(path) / 2**20
    log(f"locks: evicted {rows} rows in {evict['elapsed_s']:.1f} s")
    dcache.close_db()

    for name, m in (("sweep", sweep), ("evict", evict)):
        report.cases.append(Case(f"locks/{name}", rows, m["elapsed_s"] * 1e6 / sizes.sweep_jobs, None, [], m))
        report.goal(f"short locks: {name} longest hold of db.lock", m["max_hold_ms"], 50, "ms")
        report.goal(f"short locks: reader batch_job p99 during {name}", m["reader_p99_ms"], 50, "ms")
        report.goal(f"bounded disk: -wal file after {name}", m["wal_mb"], 64, "MB")
