"""The shipped Runner against huey, and how soon its results can be read.

A batch: a job of ``runner_targets`` targets submitted, then a ``Runner`` of ``concurrency=16`` whose fetch
returns at once stores every result (its writer commits what has arrived together; its workers start as
fetches need them, and the case says how many did, and how long each part of the batch took), then one
read of all results; against huey at the same ``synchronous`` setting writing each result
(``peers.huey_batch``). Beside them, the claims, writes and finishes of the same batch's targets made one
after another on one thread (``sequence``): the least its runner could take for them. And, on a store at
NORMAL, the time from each ``fetch`` returning to its result being readable by another process (a plain
``sqlite3`` reader there, looking every millisecond)."""

from __future__ import annotations

import multiprocessing
import sqlite3
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from sift import dcache
from sift.runner import Runner
from sift.runner.runner import PREFETCH
from sift.testing import make_job, make_targets

from ..harness import Report, checkpoints_settled, rotate
from ..sizes import OPTIONS, RESULT_1K, T0, Sizes
from .peers import SETTINGS, huey_batch, huey_storage

RUNNER_THREADS = 16
#: The most a runner's batch may take, as a fraction of huey's: at NORMAL, half; at FULL, a fifth.
RUNNER_GOALS = {"normal": 0.5, "full": 0.2}
#: The most the median result may take to be readable by another process after its fetch returned.
VISIBLE_GOAL_MS = 50.0


def _wait_until_done(job_id: str) -> None:
    """Wait for the job to end as a client watching it does: woken by each change of its count."""
    job = dcache.batch_job(job_id)
    while job is not None and job.status in ("queued", "running"):
        job = dcache.wait_for_batch_job(job_id, timeout=120, since=job)


def _runner_until_done(job_id: str, fetch: Any) -> int:
    """Run a Runner until the job is done; the count of its workers running then."""
    runner = Runner(fetch, name=f"bench-{job_id}", concurrency=RUNNER_THREADS)
    thread = threading.Thread(target=runner.run, kwargs={"grace": 30})
    thread.start()
    try:
        _wait_until_done(job_id)
        return runner.progress().workers
    finally:
        runner.stop()
        thread.join()


#: A runner's batch in its three parts, each in ms: the submission, the Runner's run (its start until its
#: stop returned), the read of every result.
PHASES = ("create_ms", "run_ms", "read_ms")


def runner_batch(
    job_id: str, targets: int, workers: list[int] | None = None, phases: dict[str, list[float]] | None = None
) -> Any:
    """One batch: submit the job, run a Runner until the job is done, stop it, read every result. The job
    and its targets are built before, as huey's payloads and sift's own batches are (``peers``). The count
    of workers the Runner started goes to ``workers``, and the time of each part (``PHASES``) to
    ``phases``."""
    job = make_job(id=job_id, caller="peers", targets_total=targets, created_at=T0, lease=T0)
    rows = make_targets(targets, options=OPTIONS)

    def run() -> None:
        t0 = time.perf_counter()
        dcache.create_batch_job(job, rows)
        t1 = time.perf_counter()
        started = _runner_until_done(job_id, lambda target: RESULT_1K)
        t2 = time.perf_counter()
        got = dcache.batch_targets(job_id)
        t3 = time.perf_counter()
        if workers is not None:
            workers.append(started)
        if phases is not None:
            for name, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                phases.setdefault(name, []).append(seconds * 1000)
        if got is None or len(got) != targets or any(t.result != RESULT_1K for t in got):
            raise AssertionError("runner: the batch's results are not all there")
        checkpoints_settled()

    return run


def sequence_batch(job_id: str, targets: int) -> Any:
    """A runner's batch without the runner: its submission, its claims (of the runner's sizes), each claim's
    writes and finish, and the read, on one thread, another waiting for the job. Built before, as
    ``runner_batch`` is."""
    job = make_job(id=job_id, caller="peers", targets_total=targets, created_at=T0, lease=T0)
    rows = make_targets(targets, options=OPTIONS)
    runner = f"bench-{job_id}"

    def run() -> None:
        dcache.create_batch_job(job, rows)
        waiter = threading.Thread(target=_wait_until_done, args=(job_id,), daemon=True)
        waiter.start()
        limit = RUNNER_THREADS  # the runner's first claim: its workers' count; then its prefetch beside it
        while claimed := dcache.claim_batch_targets(limit, runner=runner):
            results = [{"idx": int(t.idx), "status": "done", "result": RESULT_1K} for t in claimed]
            dcache.update_batch_targets(job_id, results, runner=runner)
            dcache.finish_batch_job(job_id)
            limit = RUNNER_THREADS + PREFETCH
        finished = dcache.batch_job(job_id)
        if finished is None or finished.status != "done":
            raise AssertionError(f"sequence: the job did not finish: {finished}")
        waiter.join(120)
        if waiter.is_alive():
            raise AssertionError("sequence: the wait did not see the job finish")
        got = dcache.batch_targets(job_id)
        if got is None or len(got) != targets or any(t.result != RESULT_1K for t in got):
            raise AssertionError("sequence: the batch's results are not all there")
        checkpoints_settled()

    return run


def bench_runner_peers(tmp: Path, sizes: Sizes, report: Report) -> None:
    """The runner's batch, its sequence and huey's, at NORMAL and at FULL, one of each per round."""
    targets = sizes.runner_targets
    for name, (durable, synchronous) in SETTINGS.items():
        dcache.open_db(tmp / f"runner-sift-{name}.db", durable=durable)
        storage = huey_storage(tmp / f"runner-huey-{name}.db", synchronous)
        samples: dict[str, list[float]] = {"runner": [], "sequence": [], "huey": []}
        workers: list[int] = []
        phases: dict[str, list[float]] = {}
        for rnd in range(sizes.runner_rounds + 1):  # round 0 warms up, untimed
            sides = {
                "runner": runner_batch(f"runner-{name}-{rnd}", targets, workers, phases if rnd else None),
                "sequence": sequence_batch(f"sequence-{name}-{rnd}", targets),
                "huey": huey_batch(storage, f"runner-{name}-{rnd}", targets),
            }
            for side in rotate(rnd, tuple(sides)):
                t0 = time.perf_counter()
                sides[side]()
                if rnd:
                    samples[side].append((time.perf_counter() - t0) * 1e6 / targets)
        storage.close()
        dcache.close_db()
        huey_case = report.case(f"peers/runner/{name}/huey", targets, samples["huey"])
        runner_case = report.case(f"peers/runner/{name}/runner", targets, samples["runner"])
        runner_case.extra.update(workers_started_min=min(workers), workers_started_max=max(workers))
        runner_case.extra.update({part: statistics.median(times) for part, times in phases.items()})
        ratio = report.pair(runner_case, huey_case)
        report.goal(
            f"peers: a {targets}-target batch through a Runner of concurrency={RUNNER_THREADS} at "
            f"synchronous={name.upper()}, runner/huey",
            ratio,
            RUNNER_GOALS[name],
            "x",
        )
        sequence_case = report.case(f"peers/runner/{name}/sequence", targets, samples["sequence"])
        # what the runner adds to its targets' store calls: its threads, its start, keeper and stop
        runner_case.extra["over_sequence"] = runner_case.median_us / sequence_case.median_us
        report.goal(
            f"peers: the same batch without a runner, on one thread (a thread waiting beside it), at "
            f"synchronous={name.upper()} (the runner's floor), sequence/huey",
            report.pair(sequence_case, huey_case),
            None,
            "x",
        )
    visible_after_fetch(tmp, sizes, report)


def reader(path: str, job_id: str, total: int, ready: Any, out: Any) -> None:
    """Another process: when each of the job's results is first readable (CLOCK_MONOTONIC, after the read
    that saw it: at most a millisecond and a read late)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    seen: dict[int, float] = {}
    ready.set()
    deadline = time.monotonic() + 300
    while len(seen) < total and time.monotonic() < deadline:
        rows = conn.execute(
            "SELECT idx FROM batch_target WHERE job_id = ? AND status = 'done'", (job_id,)
        ).fetchall()
        now = time.monotonic()
        for (idx,) in rows:
            seen.setdefault(idx, now)
        time.sleep(0.001)
    conn.close()
    out.put(seen)


def visible_after_fetch(tmp: Path, sizes: Sizes, report: Report) -> None:
    """A runner's batch at NORMAL with another process reading: each result's time from its fetch's return
    to the reader's first sight of it."""
    path = tmp / "runner-visible.db"
    targets, job_id = sizes.runner_targets, "visible"
    dcache.open_db(path)
    job = make_job(id=job_id, caller="peers", targets_total=targets, created_at=T0, lease=T0)
    dcache.create_batch_job(job, make_targets(targets, options=OPTIONS))
    returned: dict[int, float] = {}

    def fetch(target: dcache.BatchTarget) -> str:
        returned[int(target.idx)] = time.monotonic()
        return RESULT_1K

    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=reader, args=(str(path), job_id, targets, ready, out))
    proc.start()
    try:
        if not ready.wait(120):
            raise RuntimeError("runner: the reader process did not start")
        _runner_until_done(job_id, fetch)
        seen = out.get(timeout=300)
    finally:
        proc.join(60)
        dcache.close_db()
    if len(seen) != targets:
        raise RuntimeError(f"runner: the reader saw {len(seen)} of {targets} results")
    latencies = [(seen[idx] - returned[idx]) * 1e6 for idx in range(targets)]
    case = report.case("peers/runner/visible_after_fetch", targets, latencies)
    case.samples_us = []  # one per target: the median and the extras summarize them
    case.extra["p90_ms"] = statistics.quantiles(latencies, n=10)[-1] / 1000
    report.goal(
        "runner: median time from a fetch's return to its result readable by another process",
        case.median_us / 1000,
        VISIBLE_GOAL_MS,
        "ms",
    )
