"""The single-process simulation: callers, runner threads that claim from the store, a claim keeper, a
runner that crashes half-way and restarts, a simulated clock.

Callers of both classes submit jobs from their own threads; some repeat an idempotency key and must be
answered from the store. Runner threads run the documented runner loop (docs/how-to/runners.md): each calls
``claim_batch_targets`` under its own runner name, writes a synthetic JSON result envelope of random size
per target, each job's results in one ``update_batch_targets``, sets a job's final status once its every
target is written, and calls ``evict_batch_oldest(budget)`` after each claim. A keeper thread renews the
runners' claims and requeues stale ones on a timer, whether or not there is work. Time is a simulated clock
(every store call gets ``now=`` from it): it advances ``STEP_S`` seconds per target written, and a sweep
runs whenever it passes the next multiple of a quarter of the ttl. Once half the submissions are handled,
the runner crashes at its next claim: its threads stop where they are (the targets they hold, that claim's
at least, stay running in the store), the callers wait, the store is reopened as a new runner process would
open it, and that runner, at its start, calls ``requeue_in_flight`` to put the targets its previous run
held back to pending; queued jobs are left alone and no job fails because of the restart. Then the callers
carry on. Reconciliation is the runner's alone, as in a real deployment: the callers (the web workers)
never call it.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sift import dcache
from sift.dcache import JobNotFound, JobStatus

from ..report import format_size
from ..store import OPEN_TIMEOUT_S
from .fairness import FairnessLog
from .runners import CLAIM_LIMIT, MAX_ATTEMPTS, PER_JOB, RunnerThreads
from .tally import SimClock, Tally
from .workload import (
    FLOOD_CALLER,
    ClaimOptions,
    JobSpec,
    Settings,
    corpus,
    plan,
    submission,
)

__all__ = ["CLAIM_LIMIT", "MAX_ATTEMPTS", "PER_JOB", "RESTART_REASON", "SimClock", "Simulation", "Tally"]

#: Simulated seconds that pass per target result written.
STEP_S = 2
#: Chance that a caller polls one of its earlier jobs after a submission.
POLL_P = 0.3
#: Jobs a caller of the mixed workload keeps unfinished before it waits for one (polling) to send more: a
#: client that waits for its results, which keeps the queue as short as the runners keep up with. The flood's
#: callers do not wait.
CALLER_IN_FLIGHT = 4
#: How long (real seconds) a waiting caller sleeps between its polls.
WAIT_POLL_S = 0.002
RESTART_REASON = "runner restarted (simulated crash)"


class Simulation:
    """One run: the planned submissions, the callers', runners' and keeper's threads, the crash and the
    restart."""

    def __init__(self, settings: Settings, path: str, bar: Any, claim: ClaimOptions | None = None) -> None:
        self.settings = settings
        self.path = path
        self.bar = bar
        self.claim = claim or ClaimOptions()
        self.prefix = f"sim-{secrets.token_hex(3)}"
        # Ids and keys carry the run's prefix, so they cannot collide with jobs of another run.
        self.specs = [
            replace(spec, idem_key=f"{self.prefix}-{spec.idem_key}" if spec.idem_key else "")
            for spec in plan(settings)
        ]
        planned_span = sum(spec.targets for spec in self.specs) * STEP_S
        self.clock = SimClock(dcache.unix_now() - planned_span, STEP_S, settings.ttl // 4)
        #: A claim is stale after half the ttl of simulated time: the keeper renews far more often.
        self.stale_after = max(1, settings.ttl // 2)
        self.lock = threading.Lock()
        #: Held around each claim and each write with the in-flight bookkeeping they change, so the hosts'
        #: running counts are the store's at every moment.
        self.store_lock = threading.Lock()
        self.spec_of: dict[str, JobSpec] = {}
        self.created: dict[tuple[str, str], set[str]] = {}
        self.tally = Tally()
        self.fairness = FairnessLog(self.specs)
        self.held: dict[str, dict[tuple[str, int], str]] = {}  # runner -> its in-flight targets' URLs
        self.counters_before_restart: dict[str, int] = {}
        # The crash: set once half the submissions are handled; runners stop, callers park until resumed.
        self.crashing = threading.Event()
        self.resumed = threading.Event()
        self.stopping = threading.Event()  # every caller done and no job live: the runners stop
        self.flood_in = threading.Event()  # the flooding caller sent all its jobs (flood workload)
        self.crash_after = max(1, len(self.specs) // 2)
        #: Set once half the submissions are handled: the runner crashes at its next claim, holding it.
        self.crash_due = threading.Event()
        self.callers_parked = 0
        self.callers_finished = 0
        self.parking = threading.Condition(self.lock)
        self.abort = threading.Event()
        self.errors: list[BaseException] = []
        self.corpus = corpus(settings.seed)
        self.handled = 0
        self.runners = RunnerThreads(self)

    # -- bookkeeping ------------------------------------------------------------------------------------

    def add(self, **amounts: int) -> None:
        with self.lock:
            for name, amount in amounts.items():
                setattr(self.tally, name, getattr(self.tally, name) + amount)

    def resolved(self, n: int = 1) -> None:
        with self.lock:
            self.bar.update(n)

    def guarded(self, fn: Callable[..., None], *args: Any) -> Callable[[], None]:
        def body() -> None:
            try:
                fn(*args)
            except BaseException as exc:
                with self.lock:
                    self.errors.append(exc)
                self.abort.set()

        return body

    def halted(self) -> bool:
        return self.crashing.is_set() or self.stopping.is_set() or self.abort.is_set()

    # -- callers (the API side) -------------------------------------------------------------------------

    def caller(self, specs: list[JobSpec], seed: int) -> None:
        try:
            if specs and specs[0].flood and specs[0].caller != FLOOD_CALLER[0]:
                while not (self.flood_in.wait(0.05) or self.abort.is_set()):
                    pass  # the small callers submit once the flood is in
            self.submissions(specs, random.Random(seed))
        finally:
            if specs and specs[0].caller == FLOOD_CALLER[0]:
                self.flood_in.set()
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
        unfinished: list[str] = []
        for spec in specs:
            self.checkpoint()
            if not spec.flood:
                self.wait_for_room(unfinished)
            if self.abort.is_set():
                return
            if job_id := self.submit_one(spec, rng, mine):
                unfinished.append(job_id)
            with self.lock:
                self.handled += 1
                if self.handled == self.crash_after:
                    self.crash_due.set()

    def wait_for_room(self, unfinished: list[str]) -> None:
        """Until fewer than CALLER_IN_FLIGHT of the caller's jobs are unfinished: poll them, parking while
        the runner is down."""
        while not self.abort.is_set():
            unfinished[:] = [job_id for job_id in unfinished if self.live(job_id)]
            if len(unfinished) < CALLER_IN_FLIGHT:
                return
            time.sleep(WAIT_POLL_S)
            self.checkpoint()

    def live(self, job_id: str) -> bool:
        job = dcache.batch_job(job_id)
        return job is not None and job.status in (JobStatus.QUEUED, JobStatus.RUNNING)

    def submit_one(self, spec: JobSpec, rng: random.Random, mine: list[str]) -> str | None:
        """Submit ``spec``; the id of the job it created, None when the store answered a repeat."""
        self.add(submissions=1)
        job_id = f"{self.prefix}-{spec.number:05d}"
        now = self.clock.now()
        job, targets = submission(spec, job_id, now)
        with self.lock:
            self.spec_of[job_id] = spec  # before the runners can claim it
        # Under the runners' lock: no claim falls between the submission and its record, so the flood's
        # targets counted before a caller's first are those of claims that could have seen its job.
        with self.store_lock:
            t = time.monotonic()
            found, created = dcache.submit_batch_job(job, targets, self.settings.ttl, now=now)
            self.fairness.submitted(spec.caller, t)
        if not created:
            with self.lock:
                right = found in self.created.get((spec.caller, spec.idem_key), set())
            self.add(idem_hits=1, idem_wrong=0 if right else 1)
            self.resolved()
            return None
        with self.lock:
            self.created.setdefault((spec.caller, spec.idem_key), set()).add(job_id)
            self.tally.jobs_created += 1
        if spec.repeat:
            self.add(idem_started_anew=1)
        mine.append(job_id)
        if rng.random() < POLL_P:
            self.poll(rng.choice(mine))
        return job_id

    def poll(self, job_id: str) -> None:
        """A caller reads one of its jobs; a finished one's results are fetched, which renews its lease."""
        self.add(polls=1)
        job = dcache.batch_job(job_id)
        if job is None or job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
            return
        dcache.batch_targets(job_id)
        with contextlib.suppress(JobNotFound):  # swept or evicted in between
            dcache.touch_batch_job(job_id, now=self.clock.now())

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
        callers, runners = threads(self, 0)
        running = callers + runners
        try:
            for thread in running:
                thread.start()
            # The crash, once half the submissions are handled: runners and keeper stop after their current
            # step, callers park; what the runners held stays running in the store.
            while not (self.crashing.wait(0.05) or self.abort.is_set()):
                self.show_status()
                if self.crash_due.is_set() and self.nothing_left(callers):
                    self.crash_due.clear()
                    self.crashing.set()  # no claim is left to make: it crashes holding nothing
            self.wait(runners)
            self.wait_for(lambda: self.callers_parked + self.callers_finished == len(callers))
            if not self.abort.is_set():
                self.restart()
            # A new runner process takes over; the callers carry on.
            runners = threads(self, 1)[1]
            running = callers + runners
            self.crashing.clear()
            for thread in runners:
                thread.start()
            self.resumed.set()
            self.wait(callers)
            while not (self.abort.is_set() or dcache.live_batch_jobs_total() == 0):
                self.show_status()
                time.sleep(0.02)
            self.stopping.set()
            self.wait(runners)
        except BaseException:
            self.abort.set()
            raise
        finally:
            self.stopping.set()
            for thread in running:
                if thread.ident is not None:
                    thread.join()
        if self.errors:
            raise self.errors[0]

    def nothing_left(self, callers: list[threading.Thread]) -> bool:
        """Every caller done and no job live: no claim will come."""
        with self.lock:
            done = self.callers_finished == len(callers)
        return done and dcache.live_batch_jobs_total() == 0

    def restart(self) -> None:
        """The runner process starts again: it opens the store and, before it takes any work, puts back to
        pending what its previous run held (``requeue_in_flight``), leaving queued jobs alone. Only the
        runner does this; the callers, which stand for web workers, never do."""
        if self.path != ":memory:":  # a new process: its counters start again from zero
            self.counters_before_restart = dcache.stats()
            dcache.close_db()
            dcache.open_db(self.path, timeout=OPEN_TIMEOUT_S)
        before = dcache.stats()
        with self.store_lock:
            dcache.requeue_in_flight(max_attempts=MAX_ATTEMPTS, reason=RESTART_REASON, now=self.clock.now())
            for held in self.held.values():
                self.fairness.finished(held.values())
                held.clear()
        after = dcache.stats()
        evicted = dcache.evict_batch_oldest(self.settings.budget)
        self.add(
            restart_requeued=after["targets_requeued"] - before["targets_requeued"],
            restart_failed=after["targets_failed_stale"] - before["targets_failed_stale"],
            jobs_evicted=evicted,
        )

    def counters(self) -> dict[str, int]:
        """stats() over the whole run: the first process's counters plus the restarted one's."""
        now = dcache.stats()
        return {name: now[name] + self.counters_before_restart.get(name, 0) for name in now}


def threads(sim: Simulation, phase: int) -> tuple[list[threading.Thread], list[threading.Thread]]:
    """The callers' threads (one per caller) and the runner process's threads (``phase`` 0 or 1): its
    runners, each with its own runner name, and its keeper."""
    by_caller: dict[str, list[JobSpec]] = {}
    for spec in sim.specs:
        by_caller.setdefault(spec.caller, []).append(spec)
    base = sim.settings.seed * 1000 + phase * 100
    callers = [
        threading.Thread(target=sim.guarded(sim.caller, mine, base + n), name=f"caller-{name}", daemon=True)
        for n, (name, mine) in enumerate(by_caller.items())
    ]
    runners = [
        threading.Thread(
            target=sim.guarded(sim.runners.runner, f"{sim.prefix}-runner-{phase}-{n}", base + 50 + n),
            name=f"runner-{n}",
            daemon=True,
        )
        for n in range(sim.settings.workers)
    ]
    runners.append(threading.Thread(target=sim.guarded(sim.runners.keeper), name="keeper", daemon=True))
    return callers, runners
