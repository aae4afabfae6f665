"""The single-process simulation: callers, a runner that crashes half-way and restarts, a simulated clock.

Callers of both classes submit jobs from their own threads; some repeat an idempotency key and must be
answered from the store. Worker threads play the runner: they take targets from a bounded queue, write a
synthetic JSON result envelope of random size, and call ``evict_batch_oldest(budget)`` after each.
Time is a simulated clock (every store call gets ``now=`` from it): it advances ``STEP_S`` seconds per
target written, and a sweep runs whenever it passes the next multiple of a quarter of the ttl. Once half
the submissions are handled, the runner crashes: its workers stop after their current target, the callers
wait, the queue (and whatever a caller had not queued yet) is lost, the store is reopened as a new runner
process would open it, and that runner, at its start, calls ``mark_in_flight_failed`` to fail the jobs that
were in flight; then the callers carry on against its new set of workers. Reconciliation is the runner's
alone, as in a real deployment: the callers (the web workers) never call ``mark_in_flight_failed``.
"""

from __future__ import annotations

import contextlib
import queue
import random
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sift import dcache
from sift.dcache import JobNotFound, JobStatus, TargetNotFound, TargetStatus

from ..report import format_size
from ..store import OPEN_TIMEOUT_S
from .workload import (
    ERRORS,
    FAIL_P,
    JobSpec,
    Settings,
    corpus,
    envelope,
    final_status,
    plan,
    submission,
    target_urls,
)

__all__ = ["SimClock", "Simulation", "Tally"]

#: Simulated seconds that pass per target result written.
STEP_S = 2
#: Chance that a caller polls one of its earlier jobs after a submission.
POLL_P = 0.3
#: Targets the runner's in-memory queue holds per worker (callers wait when it is full).
QUEUE_PER_WORKER = 8
RESTART_REASON = "runner restarted (simulated crash)"


class SimClock:
    """The simulated clock: advances a fixed step per target written; says when a sweep is due."""

    def __init__(self, start: int, step: int, sweep_every: int) -> None:
        self._lock = threading.Lock()
        self._now = start
        self.start = start
        self.step = step
        self.sweep_every = max(1, sweep_every)
        self._next_sweep = start + self.sweep_every

    def now(self) -> int:
        with self._lock:
            return self._now

    def tick(self) -> tuple[int, bool]:
        """Advance one step; return the new time and whether a sweep is due at it."""
        with self._lock:
            self._now += self.step
            due = self._now >= self._next_sweep
            if due:
                self._next_sweep = self._now + self.sweep_every
            return self._now, due


@dataclass
class JobRun:
    """What the runner knows of a job it queued."""

    job_id: str
    spec: JobSpec
    remaining: int
    failed: int = 0
    started: bool = False
    gone: bool = False


@dataclass
class Tally:
    """What the run did, counted as the calls returned."""

    submissions: int = 0
    jobs_created: int = 0
    idem_hits: int = 0
    idem_wrong: int = 0
    idem_started_anew: int = 0
    polls: int = 0
    targets_written: int = 0
    targets_failed: int = 0
    targets_lost: int = 0
    sweeps: int = 0
    jobs_swept: int = 0
    jobs_evicted: int = 0
    restart_dropped_targets: int = 0
    restart_marked_failed: int = 0


class Simulation:
    """One run: the planned submissions, the callers' and workers' threads, the crash and the restart."""

    def __init__(self, settings: Settings, path: str, bar: Any) -> None:
        self.settings = settings
        self.path = path
        self.bar = bar
        self.prefix = f"sim-{secrets.token_hex(3)}"
        # Ids and keys carry the run's prefix, so they cannot collide with jobs of another run.
        self.specs = [
            replace(spec, idem_key=f"{self.prefix}-{spec.idem_key}" if spec.idem_key else "")
            for spec in plan(settings)
        ]
        planned_span = sum(spec.targets for spec in self.specs) * STEP_S
        self.clock = SimClock(dcache.unix_now() - planned_span, STEP_S, settings.ttl // 4)
        self.queue: queue.Queue[tuple[str, int, str] | None] = queue.Queue(
            QUEUE_PER_WORKER * settings.workers
        )
        self.lock = threading.Lock()
        self.runs: dict[str, JobRun] = {}
        self.created: dict[tuple[str, str], set[str]] = {}
        self.tally = Tally()
        self.counters_before_restart: dict[str, int] = {}
        # The crash: set once half the submissions are handled; workers stop, callers park until resumed.
        self.crashing = threading.Event()
        self.resumed = threading.Event()
        self.crash_after = max(1, len(self.specs) // 2)
        self.callers_parked = 0
        self.callers_finished = 0
        self.parking = threading.Condition(self.lock)
        self.abort = threading.Event()
        self.errors: list[BaseException] = []
        self.corpus = corpus(settings.seed)
        self.handled = 0

    # -- bookkeeping ------------------------------------------------------------------------------------

    def add(self, **amounts: int) -> None:
        with self.lock:
            for name, amount in amounts.items():
                setattr(self.tally, name, getattr(self.tally, name) + amount)

    def resolved(self) -> None:
        with self.lock:
            self.bar.update(1)

    def item_done(self, run: JobRun) -> bool:
        """Count one queued target of ``run`` as handled; True when it was the job's last."""
        with self.lock:
            run.remaining -= 1
            last = run.remaining == 0
        if last:
            self.resolved()
        return last

    def guarded(self, fn: Callable[..., None], *args: Any) -> Callable[[], None]:
        def body() -> None:
            try:
                fn(*args)
            except BaseException as exc:
                with self.lock:
                    self.errors.append(exc)
                self.abort.set()

        return body

    # -- callers (the API side) -------------------------------------------------------------------------

    def caller(self, specs: list[JobSpec], seed: int) -> None:
        try:
            self.submissions(specs, random.Random(seed))
        finally:
            with self.parking:
                self.callers_finished += 1
                self.parking.notify_all()

    def checkpoint(self) -> None:
        """While the runner is down, a caller waits here (its requests would fail) until it is back."""
        if not self.crashing.is_set():
            return
        with self.parking:
            self.callers_parked += 1
            self.parking.notify_all()
        while not (self.resumed.wait(0.05) or self.abort.is_set()):
            pass
        with self.parking:
            self.callers_parked -= 1

    def submissions(self, specs: list[JobSpec], rng: random.Random) -> None:
        mine: list[str] = []
        for spec in specs:
            self.checkpoint()
            if self.abort.is_set():
                return
            self.submit_one(spec, rng, mine)
            with self.lock:
                self.handled += 1
                if self.handled == self.crash_after:
                    self.crashing.set()

    def submit_one(self, spec: JobSpec, rng: random.Random, mine: list[str]) -> None:
        self.add(submissions=1)
        job_id = f"{self.prefix}-{spec.number:05d}"
        found = self.submit(spec, job_id)  # the idempotency lookup and the create, one transaction
        if found is not None:
            with self.lock:
                right = found in self.created.get((spec.caller, spec.idem_key), set())
            self.add(idem_hits=1, idem_wrong=0 if right else 1)
            self.resolved()
            return
        if spec.repeat:
            self.add(idem_started_anew=1)
        mine.append(job_id)
        if rng.random() < POLL_P:
            self.poll(rng.choice(mine))

    def submit(self, spec: JobSpec, job_id: str) -> str | None:
        """``submit_batch_job``: None when the job was created (its targets then go to the runner's
        queue), else the id of the job the store answered the repeat with."""
        now = self.clock.now()
        job, targets = submission(spec, job_id, now)
        found, created = dcache.submit_batch_job(job, targets, self.settings.ttl, now=now)
        if not created:
            return found
        with self.lock:
            self.runs[job_id] = JobRun(job_id, spec, remaining=spec.targets)
            self.created.setdefault((spec.caller, spec.idem_key), set()).add(job_id)
            self.tally.jobs_created += 1
        run = self.runs[job_id]
        for idx, url in enumerate(target_urls(spec)):
            while True:
                if self.abort.is_set():
                    return None
                if self.crashing.is_set():  # the runner died: what it had not queued yet is lost too
                    for _ in range(idx, spec.targets):
                        self.add(restart_dropped_targets=1)
                        self.item_done(run)
                    return None
                try:
                    self.queue.put((job_id, idx, url), timeout=0.05)
                    break
                except queue.Full:
                    continue
        return None

    def poll(self, job_id: str) -> None:
        """A caller reads one of its jobs; a finished one's results are fetched, which renews its lease."""
        self.add(polls=1)
        job = dcache.batch_job(job_id)
        if job is None or job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
            return
        dcache.batch_targets(job_id)
        with contextlib.suppress(JobNotFound):  # swept or evicted in between
            dcache.touch_batch_job(job_id, now=self.clock.now())

    # -- workers (the runner) ---------------------------------------------------------------------------

    def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        while not (self.crashing.is_set() or self.abort.is_set()):
            try:
                item = self.queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is None:
                return
            self.run_target(rng, *item)

    def run_target(self, rng: random.Random, job_id: str, idx: int, url: str) -> None:
        run = self.runs[job_id]
        sweep_at: int | None = None
        failed = False
        if not run.gone:
            try:
                with self.lock:
                    first, run.started = not run.started, True
                if first:
                    dcache.set_batch_job_status(job_id, JobStatus.RUNNING, now=self.clock.now())
                dcache.update_batch_target(job_id, idx, TargetStatus.RUNNING, now=self.clock.now())
                now, sweep_due = self.clock.tick()
                sweep_at = now if sweep_due else None
                if rng.random() < FAIL_P:
                    failed = True
                    error, hint = rng.choice(ERRORS)
                    dcache.update_batch_target(
                        job_id, idx, TargetStatus.FAILED, error=error, hint=hint, now=now
                    )
                else:
                    result = envelope(rng, self.corpus, url)
                    dcache.update_batch_target(job_id, idx, TargetStatus.DONE, result=result, now=now)
                self.add(targets_written=1, targets_failed=int(failed))
            except (JobNotFound, TargetNotFound):
                run.gone = True  # swept while it waited: a real runner drops the rest of it
        if run.gone:
            self.add(targets_lost=1)
        with self.lock:
            run.failed += int(failed)
        if self.item_done(run) and not run.gone:
            self.finish_job(run)
        if sweep_at is not None:
            swept = dcache.sweep_batch(self.settings.ttl, now=sweep_at)
            self.add(sweeps=1, jobs_swept=swept)
        self.add(jobs_evicted=dcache.evict_batch_oldest(self.settings.budget))

    def finish_job(self, run: JobRun) -> None:
        status, error = final_status(run.failed, run.spec.targets)
        try:
            dcache.set_batch_job_status(run.job_id, status, error, now=self.clock.now())
        except JobNotFound:
            run.gone = True

    # -- the run ----------------------------------------------------------------------------------------

    def show_status(self) -> None:
        if self.bar.disable is False:
            stored, live = format_size(dcache.batch_nbytes()), dcache.live_batch_jobs_total()
            self.bar.set_postfix_str(f"{stored} stored, {live} live", refresh=False)

    def wait(self, threads: list[threading.Thread]) -> None:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
                self.show_status()

    def wait_for(self, ready: Callable[[], bool]) -> None:
        with self.parking:
            while not (ready() or self.abort.is_set()):
                self.parking.wait(0.05)

    def run(self) -> None:
        callers, workers = threads(self, 0)
        running = callers + workers
        try:
            for thread in running:
                thread.start()
            # The crash, once half the submissions are handled: workers stop after their current target,
            # callers park, and the runner's queue is lost.
            while not (self.crashing.wait(0.2) or self.abort.is_set()):
                self.show_status()
            self.wait(workers)
            self.wait_for(lambda: self.callers_parked + self.callers_finished == len(callers))
            if not self.abort.is_set():
                self.restart()
            # A new runner process takes over; the callers carry on.
            workers = threads(self, 1)[1]
            running = callers + workers
            self.crashing.clear()
            for thread in workers:
                thread.start()
            self.resumed.set()
            self.wait(callers)
            for _ in workers:
                while not self.abort.is_set():
                    try:
                        self.queue.put(None, timeout=0.05)
                        break
                    except queue.Full:
                        continue
            self.wait(workers)
        except BaseException:
            self.abort.set()
            raise
        finally:
            for thread in running:
                if thread.ident is not None:
                    thread.join()
        if self.errors:
            raise self.errors[0]

    def restart(self) -> None:
        """The runner process starts again: its queue is gone; it opens the store and, before it takes any
        work, reconciles (``mark_in_flight_failed``). Only the runner does this; the callers, which stand
        for web workers, never do."""
        dropped = 0
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                dropped += 1
                self.item_done(self.runs[item[0]])
        if self.path != ":memory:":  # a new process: its counters start again from zero
            self.counters_before_restart = dcache.stats()
            dcache.close_db()
            dcache.open_db(self.path, timeout=OPEN_TIMEOUT_S)
        marked = dcache.mark_in_flight_failed(RESTART_REASON, now=self.clock.now())
        evicted = dcache.evict_batch_oldest(self.settings.budget)
        self.add(restart_dropped_targets=dropped, restart_marked_failed=marked, jobs_evicted=evicted)

    def counters(self) -> dict[str, int]:
        """stats() over the whole run: the first process's counters plus the restarted one's."""
        now = dcache.stats()
        return {name: now[name] + self.counters_before_restart.get(name, 0) for name in now}


def threads(sim: Simulation, phase: int) -> tuple[list[threading.Thread], list[threading.Thread]]:
    """The callers' threads (one per caller) and the workers' of one runner process (``phase`` 0 or 1)."""
    by_caller: dict[str, list[JobSpec]] = {}
    for spec in sim.specs:
        by_caller.setdefault(spec.caller, []).append(spec)
    base = sim.settings.seed * 1000 + phase * 100
    callers = [
        threading.Thread(target=sim.guarded(sim.caller, mine, base + n), name=f"caller-{name}", daemon=True)
        for n, (name, mine) in enumerate(by_caller.items())
    ]
    workers = [
        threading.Thread(target=sim.guarded(sim.worker, base + 50 + n), name=f"worker-{n}", daemon=True)
        for n in range(sim.settings.workers)
    ]
    return callers, workers
