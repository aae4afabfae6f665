"""Store calls while another thread of the process computes in Python without a pause (a fetch that parses
what it fetched, a request thread rendering a page).

On SQLite each row a statement reads or writes is a step of the driver, which lets go of the interpreter's
lock for it and must then take it back from the computing thread, which gives it up only when the switch
interval (``sys.getswitchinterval()``, 5 ms by default) has passed: a call of many rows waits at many of
its steps, holding the store's lock all the while. On PostgreSQL a statement's rows come in one answer, and
the waits are fewer. No goal: the runners page gives the figures and what to do.

- ``contention/batch_targets/{alone,beside_compute}``: one read of every target of a job of
  ``contention_targets`` targets (1 KB results), alone and with the computing thread running;
- ``contention/update_batch_targets/{alone,beside_compute}``: one call writing ``CONTENTION_WRITES`` of
  them again;
- ``contention/runner/{fetch_computes,fetch_waits}`` (SQLite): a ``batch_job`` call made every 10 ms by
  another thread while a ``Runner`` of 8 workers stores a job whose fetch computes for ``FETCH_CPU_S`` of CPU
  time on its own thread, or hands that work to a pool of 2 processes and waits for it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from sift import dcache
from sift.runner import Runner
from sift.testing import make_job, make_targets

from ..fixtures import Builder, PgBuilder
from ..harness import Case, Report, alternate
from ..sizes import OPTIONS, RESULT_1K, T0, Sizes
from ..stores import POSTGRES, SQLITE, PgServer, StoreUnderTest

#: The results one timed update_batch_targets call writes again.
CONTENTION_WRITES = 256
#: The CPU time each computing fetch takes (seconds).
FETCH_CPU_S = 0.002
#: How long the computing thread runs before the timed call starts (seconds).
SETTLE_S = 0.01
#: How often the other thread reads the job while a runner works (seconds).
LOOK_EVERY_S = 0.01
#: The longest a runner's job may take before the group gives up on it (seconds).
RUNNER_DEADLINE_S = 300.0


def compute_for(seconds: float) -> str:
    """Python computing for ``seconds`` of this thread's CPU time; the runner's 1 KB result."""
    end = time.thread_time() + seconds
    total = 0
    while time.thread_time() < end:
        for i in range(100):
            total += i
    return RESULT_1K


@contextlib.contextmanager
def computing() -> Iterator[None]:
    """A thread of this process running Python without a pause, until the block ends."""
    stop, running = threading.Event(), threading.Event()

    def spin() -> None:
        running.set()
        while not stop.is_set():
            compute_for(0.001)

    thread = threading.Thread(target=spin, name="bench-compute", daemon=True)
    thread.start()
    running.wait()
    time.sleep(SETTLE_S)  # computing, as such a thread does, before the call comes
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _timed(call: Callable[[], object], beside_compute: bool) -> float:
    """µs of one ``call``, alone or with a computing thread running."""
    with computing() if beside_compute else contextlib.nullcontext():
        t0 = time.perf_counter()
        call()
        return (time.perf_counter() - t0) * 1e6


def _case(report: Report, name: str, n: int, samples: list[float]) -> Case:
    """The case of ``samples`` (µs a call), with its longest call (``max_ms``): a call waits for the
    computing thread at some of its steps and not at others, so its time spreads far."""
    return report.case(name, n, samples, max_ms=max(samples) / 1000)


def build_contention(b: Builder | PgBuilder, sizes: Sizes) -> None:
    """The job read and written: ``contention_targets`` targets, each done with a 1 KB result."""
    b.one_job(
        "contention",
        caller="contention",
        status="done",
        targets=sizes.contention_targets,
        result_bytes=len(RESULT_1K),
        lease=T0,
    )
    b.close()


def run_contention(target: str, sizes: Sizes, report: Report, store: StoreUnderTest) -> None:
    """The read and the write, alone and beside a computing thread, taking turns at going first."""
    targets, writes = sizes.contention_targets, min(CONTENTION_WRITES, sizes.contention_targets)
    dcache.open_db(target)
    try:
        again = [{"idx": i, "status": "done", "result": RESULT_1K} for i in range(writes)]

        def read() -> None:
            got = dcache.batch_targets("contention")
            assert got is not None and len(got) == targets

        def write() -> None:
            assert dcache.update_batch_targets("contention", again) == writes

        samples: dict[tuple[str, bool], list[float]] = {}
        for rnd in range(sizes.contention_rounds + 1):  # round 0 warms up, untimed
            for name, call in (("batch_targets", read), ("update_batch_targets", write)):
                for computes in alternate(rnd, (False, True)):
                    us = _timed(call, computes)
                    if rnd:
                        samples.setdefault((name, computes), []).append(us)
    finally:
        dcache.close_db()
    for name, n in (("batch_targets", targets), ("update_batch_targets", writes)):
        alone = _case(report, f"{store.prefix}contention/{name}/alone", n, samples[(name, False)])
        beside = _case(report, f"{store.prefix}contention/{name}/beside_compute", n, samples[(name, True)])
        report.goal(
            f"{store.goal_prefix}{name} of {n:,} targets beside a thread computing in Python, / alone",
            report.pair(beside, alone),
            None,
            "x",
        )


def _runner_looks(job_id: str, targets: int, fetch: Callable[[Any], str]) -> list[float]:
    """A job of ``targets`` stored by a Runner of 8 workers calling ``fetch``; the µs of each ``batch_job``
    call another thread makes every ``LOOK_EVERY_S`` until the job is done."""
    dcache.create_batch_job(
        make_job(id=job_id, caller="contention", targets_total=targets, created_at=T0, lease=T0),
        make_targets(targets, options=OPTIONS),
    )
    runner = Runner(fetch, name=f"bench-{job_id}", concurrency=8)
    thread = threading.Thread(target=runner.run, kwargs={"grace": 30})
    thread.start()
    looks: list[float] = []
    deadline = time.monotonic() + RUNNER_DEADLINE_S
    try:
        while True:
            t0 = time.perf_counter()
            job = dcache.batch_job(job_id)
            looks.append((time.perf_counter() - t0) * 1e6)
            # a runner whose thread died leaves the job running: the group fails rather than wait for ever
            if job is None or job.status not in ("queued", "running") or time.monotonic() > deadline:
                break
            time.sleep(LOOK_EVERY_S)
    finally:
        runner.stop()
        thread.join()
    if job is None or job.status != "done":
        raise AssertionError(f"contention: the runner's job did not finish: {job}")
    return looks


def runner_contention(tmp: Path, sizes: Sizes, report: Report) -> None:
    """A runner whose fetch computes on its own thread, and one whose fetch waits for a process pool."""
    targets = sizes.contention_targets
    dcache.open_db(tmp / "contention-runner.db")
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    try:
        list(pool.map(compute_for, [0.0, 0.0]))  # both processes started before any round

        def in_thread(target: Any) -> str:
            return compute_for(FETCH_CPU_S)

        def in_pool(target: Any) -> str:
            return pool.submit(compute_for, FETCH_CPU_S).result()

        looks: dict[str, list[float]] = {"fetch_computes": [], "fetch_waits": []}
        for rnd in range(sizes.contention_rounds):
            for side in alternate(rnd, tuple(looks)):
                fetch = in_thread if side == "fetch_computes" else in_pool
                looks[side] += _runner_looks(f"contention-{side}-{rnd}", targets, fetch)
    finally:
        pool.shutdown()
        dcache.close_db()
    computes = _case(report, "contention/runner/fetch_computes", 1, looks["fetch_computes"])
    waits = _case(report, "contention/runner/fetch_waits", 1, looks["fetch_waits"])
    report.goal(
        "a batch_job call beside a Runner whose fetch computes on its thread, / one whose fetch waits for a "
        "process pool (medians)",
        report.pair(computes, waits),
        None,
        "x",
    )


def bench_contention(tmp: Path, sizes: Sizes, report: Report) -> None:
    """The calls on a SQLite file, and the runner's two fetches."""
    path = tmp / "contention.db"
    build_contention(Builder(path), sizes)
    run_contention(str(path), sizes, report, SQLITE)
    runner_contention(tmp, sizes, report)


def pg_contention(server: PgServer, sizes: Sizes, report: Report) -> None:
    """The calls on a PostgreSQL schema."""
    schema = server.new_schema("contention")
    build_contention(PgBuilder(server, schema), sizes)
    run_contention(server.target(schema), sizes, report, POSTGRES)
    server.drop(schema)
