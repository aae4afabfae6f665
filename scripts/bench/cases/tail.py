"""The tail on SQLite with several processes writing one file: SQLite's busy handler alone against the
writers' queue, in alternating rounds of one run."""

from __future__ import annotations

import gc
import multiprocessing
import random
import statistics
from pathlib import Path
from typing import Any

from sift import dcache
from sift.dcache.backends.sqlite import database as sqlite_database
from sift.dcache.backends.sqlite.writer_queue import WriterQueue
from sift.testing import make_job, make_targets

from ..harness import Report, alternate, perf_ns
from ..sizes import T0, Sizes

#: Processes writing at once.
TAIL_PROCESSES = 4
TAIL_WORKLOADS = ("update_batch_target", "mix")
#: The two ways a writer waits for another process's transaction: SQLite's busy handler alone (a queue
#: that is never taken stands in for the writers' queue: no public API turns it off), and the queue.
TAIL_SIDES = {"busy_handler": False, "queue": True}


class NoQueue(WriterQueue):
    """A writers' queue that is never taken: writers wait in SQLite's busy handler alone."""

    def __init__(self, store_path: str | None, timeout: float) -> None:
        super().__init__(None, timeout)


def tail_writer(path: str, queued: bool, tag: str, calls: int, workload: str, barrier: Any, out: Any) -> None:
    """One forked process: ``calls`` writes through the package, each timed; puts (start, end, latencies
    in µs, error) on ``out``. ``mix``: 60% target results, 20% creates of 10 targets, 20% idempotent
    submits of 5 (a key in two repeats)."""
    try:
        if not queued:  # this process only: each writer is a process of its own
            sqlite_database.WriterQueue = NoQueue  # type: ignore[attr-defined]
        dcache.open_db(path)
        rng = random.Random(tag)
        latencies: list[float] = []
        barrier.wait(60)
        start = perf_ns()
        for i in range(calls):
            op = "update" if workload == "update_batch_target" else rng.choice("uuuuuuccss")
            t0 = perf_ns()
            if op == "u":
                dcache.update_batch_target(
                    f"tail-{tag[-1]}", rng.randrange(50), "done", result="x" * 100, now=T0 + i
                )
            elif op == "c":
                job = make_job(id=f"tail-{tag}-c{i}", targets_total=10, created_at=T0, lease=T0)
                dcache.create_batch_job(job, make_targets(10))
            else:
                job = make_job(
                    id=f"tail-{tag}-s{i}",
                    targets_total=5,
                    idem_key=f"{tag}-key{i // 2}",
                    created_at=T0,
                    lease=T0,
                )
                dcache.submit_batch_job(job, make_targets(5), 3600, now=T0)
            latencies.append((perf_ns() - t0) / 1000)
        out.put((start, perf_ns(), latencies, None))
    except BaseException as exc:  # reported by the parent, which must not wait forever
        out.put((0, 0, [], f"{type(exc).__name__}: {exc}"))
    finally:
        dcache.close_db()


def tail_round(path: Path, queued: bool, tag: str, calls: int, workload: str) -> tuple[list[float], float]:
    """TAIL_PROCESSES forked writers released at once: every call's latency (µs), and calls per second.

    The bench's objects are frozen out of the collector while the writers fork (``gc.freeze``): when the
    bench had made no full collection yet, each writer's first collection was a full one over every object
    it inherited, copying their pages inside a timed call (worst calls of 63 to 155 ms here, against 17 to
    25 with them frozen: ``python scripts/bench --only tail --db sqlite``)."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(TAIL_PROCESSES), ctx.Queue()
    procs = [
        ctx.Process(target=tail_writer, args=(str(path), queued, f"{tag}-{p}", calls, workload, barrier, out))
        for p in range(TAIL_PROCESSES)
    ]
    gc.freeze()
    try:
        for proc in procs:
            proc.start()
    finally:
        gc.unfreeze()  # the parent's later groups collect as before
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(60)
    errors = [r[3] for r in results if r[3] is not None]
    if errors:
        raise RuntimeError(f"tail: a writer failed: {errors[0]}")
    latencies = [x for r in results for x in r[2]]
    elapsed_s = (max(r[1] for r in results) - min(r[0] for r in results)) / 1e9
    return latencies, len(latencies) / elapsed_s


def bench_tail(tmp: Path, sizes: Sizes, report: Report) -> None:
    """4 processes writing one file, waiting on SQLite's busy handler alone and queued on the writers' OS
    lock, in alternating rounds of one run: p50/p99/max of every call, and calls per second. Goals for the
    queue: p99 <= 10 ms, worst call <= 50 ms, throughput no lower."""
    rounds, calls = sizes.tail_rounds, sizes.tail_calls
    path = tmp / "tail.db"
    dcache.open_db(path)
    for p in range(TAIL_PROCESSES):
        job = make_job(id=f"tail-{p}", status="running", targets_total=50, created_at=T0, lease=T0)
        dcache.create_batch_job(job, make_targets(50))
    dcache.close_db()  # no store open in the parent when it forks
    for workload in TAIL_WORKLOADS:
        latencies: dict[str, list[float]] = {side: [] for side in TAIL_SIDES}
        rates: dict[str, list[float]] = {side: [] for side in TAIL_SIDES}
        for rnd in range(rounds):
            for side in alternate(rnd, tuple(TAIL_SIDES)):
                tag = f"{workload[0]}{rnd}{side[0]}"
                got, rate = tail_round(path, TAIL_SIDES[side], tag, calls, workload)
                latencies[side].extend(got)
                rates[side].append(rate)
        cases = {}
        for side in TAIL_SIDES:
            ordered = sorted(latencies[side])
            cases[side] = report.case(
                f"tail/{workload}/{side}",
                TAIL_PROCESSES,
                ordered,
                p50_ms=ordered[len(ordered) // 2] / 1000,
                p99_ms=ordered[int(len(ordered) * 0.99)] / 1000,
                max_ms=ordered[-1] / 1000,
                calls_per_s=statistics.median(rates[side]),
                calls=len(ordered),
            )
            cases[side].samples_us = []  # thousands of calls: the extras summarize them
        busy, queue = cases["busy_handler"], cases["queue"]
        # Per round pair, busy-handler calls/s over queue calls/s; <= 1: the queue is no slower.
        ratio = statistics.median(b / q for b, q in zip(rates["busy_handler"], rates["queue"], strict=True))
        busy.ratio, queue.ratio = 1.0, ratio  # a ratio of throughputs, not of medians
        label = f"tail, {TAIL_PROCESSES} processes, {workload}"
        report.goal(f"{label}: queue p99 per call", queue.extra["p99_ms"], 10, "ms")
        report.goal(f"{label}: queue worst call", queue.extra["max_ms"], 50, "ms")
        report.goal(
            f"{label}: throughput, busy handler calls/s / queue calls/s (busy handler: p99 "
            f"{busy.extra['p99_ms']:.1f} ms, worst {busy.extra['max_ms']:.0f} ms)",
            ratio,
            1.0,
            "x",
        )
