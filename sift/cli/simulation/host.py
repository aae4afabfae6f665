"""One host process of ``sift simulate --hosts``: API threads, runner threads and a rescuer on one store."""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import multiprocessing.connection
import random
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sift import dcache
from sift.dcache import BatchTarget, JobNotFound, JobStatus, TargetNotFound, TargetStatus
from sift.dcache.models import LIVE_JOB_STATUSES

from ..store import OPEN_TIMEOUT_S, is_postgres
from .journal import Journal
from .workload import ERRORS, FAIL_P, JobSpec, Settings, corpus, envelope, final_status, submission

__all__ = ["API_THREADS", "RESCUE_REASON", "Host", "HostConfig", "host_main", "job_id_of"]


#: API threads per host.
API_THREADS = 2
#: Jobs an API thread keeps unfinished before it polls instead of submitting more.
IN_FLIGHT = 2
#: Targets one claim takes, and at most how many of one job (so one big job does not starve the rest).
CLAIM_LIMIT = 4
PER_JOB = 2
#: One fetch in this many is slow: it lasts SLOW_TOUCHES * TOUCH_EVERY_S and touches the runner's jobs.
SLOW_EVERY = 40
SLOW_TOUCHES = 3
TOUCH_EVERY_S = 0.02
#: How often each host's rescuer calls rescue_stale_jobs.
RESCUE_EVERY_S = 0.5
#: How long an idle runner or a polling API thread waits before trying again.
IDLE_S = 0.01
POLL_S = 0.005
#: The error a rescued job gets.
RESCUE_REASON = "rescued: its host stopped renewing the lease (simulated SIGKILL)"


@dataclass(frozen=True)
class HostConfig:
    """What a host process is given: the store, its journal, its share of the submissions."""

    target: str
    journal: str
    host: int
    prefix: str
    settings: Settings
    stale_after: int
    specs: tuple[JobSpec, ...]
    fetch_s: float = 0.0  # the mean network time of a fetch


def host_main(config: HostConfig, conn: multiprocessing.connection.Connection) -> None:
    """A host process: open the store, say ready, run on "go" until "stop", say bye."""
    Host(config).serve(conn)


class Host:
    """A host's threads, each with its own connection to the store, and its journal."""

    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.journal = Journal(config.journal)
        self.stop = threading.Event()
        self.failed = threading.Event()
        self.errors: list[str] = []
        self.text = corpus(config.settings.seed)
        self.claim_numbers = itertools.count()
        self.numbers_lock = threading.Lock()
        self.empty_claims = 0  # calls that found nothing to claim (written in the end record)
        self.go = threading.Event()  # the coordinator said go
        self.warmed = threading.Barrier(1)

    def serve(self, conn: multiprocessing.connection.Connection) -> None:
        c = self.config
        threads = API_THREADS + c.settings.workers + 3  # and the rescuer, the main thread, one spare
        options: dict[str, Any] = {"max_connections": threads} if is_postgres(c.target) else {}
        dcache.open_db(c.target, timeout=OPEN_TIMEOUT_S, **options)
        try:
            # Every thread opens a connection (on PostgreSQL, one of the pool's each, given back open) before
            # the host says it is ready, as in a host that has served for a while: the first claims do not
            # time it.
            self.warmed = threading.Barrier(API_THREADS + c.settings.workers + 2)
            seed = c.settings.seed * 1000 + c.host * 100
            api = [
                self.thread(self.api, list(c.specs[n::API_THREADS]), seed + n, name=f"api-{n}")
                for n in range(API_THREADS)
            ]
            runners = [
                self.thread(self.runner, seed + 50 + n, name=f"runner-{n}") for n in range(c.settings.workers)
            ]
            host_threads = [*api, *runners, self.thread(self.rescuer, name="rescuer")]
            try:
                self.warmed.wait()
            except threading.BrokenBarrierError:  # a thread could not connect: the host does not start
                self.halt(host_threads)
                conn.send(("failed", c.host, self.errors))
                return
            conn.send(("ready", c.host))
            if conn.recv() != "go":
                self.halt(host_threads)
                return
            self.journal.write(k="start", t=time.monotonic())
            self.go.set()
            for thread in api:
                while thread.is_alive() and not self.failed.is_set():
                    thread.join(0.05)
            if not self.failed.is_set():
                conn.send(("api_done", c.host))
            while not (self.failed.is_set() or conn.poll(0.05)):
                pass
            self.halt(host_threads)
            self.journal.write(k="end", t=time.monotonic(), empty_claims=self.empty_claims)
            conn.send(("bye", c.host, self.errors))
        finally:
            dcache.close_db()
            self.journal.close()

    def halt(self, threads: list[threading.Thread]) -> None:
        """Stop the host's threads, those still waiting for the start included, and wait for them."""
        self.stop.set()
        self.go.set()
        for thread in threads:
            thread.join()

    def thread(self, fn: Callable[..., None], *args: Any, name: str) -> threading.Thread:
        def body() -> None:
            try:
                dcache.db.connect()  # held through the barrier: each thread opens one of its own
                try:
                    dcache.batch_nbytes()
                    self.warmed.wait()
                finally:
                    dcache.db.close()  # back to the pool, open: the first claims do not time a connect
                self.go.wait()
                fn(*args)
            except threading.BrokenBarrierError:  # another thread of the host failed before the start
                return
            except BaseException:
                text = traceback.format_exc()
                self.errors.append(text)
                self.journal.write(k="error", what=text)
                self.failed.set()
                self.stop.set()
                self.warmed.abort()

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        return thread

    # -- the API side ------------------------------------------------------------------------------------

    def api(self, specs: list[JobSpec], seed: int) -> None:
        outstanding: collections.deque[str] = collections.deque()
        for spec in specs:
            while len(outstanding) >= IN_FLIGHT and not self.stop.is_set():
                self.poll(outstanding)
            if self.stop.is_set():
                return
            answered, created = self.submit(spec)
            self.journal.write(k="sub", n=spec.number, id=answered, new=created, t=time.monotonic())
            if created:
                outstanding.append(answered)
        while outstanding and not self.stop.is_set():
            self.poll(outstanding)

    def submit(self, spec: JobSpec) -> tuple[str, bool]:
        now = dcache.unix_now()
        job, targets = submission(spec, job_id_of(self.config.prefix, spec.number), now)
        return dcache.submit_batch_job(job, targets, self.config.settings.ttl, now=now)

    def poll(self, outstanding: collections.deque[str]) -> None:
        """Read the oldest unfinished job; once finished (or evicted) it is the client's no more."""
        job_id = outstanding[0]
        job = dcache.batch_job(job_id)
        if job is None or job.status not in LIVE_JOB_STATUSES:
            outstanding.popleft()
            if job is not None:
                dcache.batch_targets(job_id)  # the client fetches its results
            return
        outstanding.rotate(-1)
        time.sleep(POLL_S)

    # -- the runner side ---------------------------------------------------------------------------------

    def runner(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            started = time.perf_counter()
            claimed = dcache.claim_batch_targets(CLAIM_LIMIT, per_job=PER_JOB)
            latency = time.perf_counter() - started
            if not claimed:
                with self.numbers_lock:
                    self.empty_claims += 1
                time.sleep(IDLE_S)
                continue
            with self.numbers_lock:
                number = next(self.claim_numbers)
            got = [[target.job_id, target.idx] for target in claimed]
            self.journal.write(k="claim", c=number, t=time.monotonic(), lat=round(latency, 6), got=got)
            held = collections.Counter(target.job_id for target in claimed)
            for target in claimed:
                self.fetch(rng, held)
                self.write_target(rng, target, number)
                held[target.job_id] -= 1
            if evicted := dcache.evict_batch_oldest(self.config.settings.budget):
                self.journal.write(k="evict", n=evicted)

    def fetch(self, rng: random.Random, held: collections.Counter[str]) -> None:
        """A fetch waits on the network from half to one and a half times ``fetch_s`` (none at 0); a slow one
        waits longer besides, and renews the lease of each job the runner holds targets of."""
        if self.config.fetch_s:
            time.sleep(rng.uniform(0.5, 1.5) * self.config.fetch_s)
        if rng.random() >= 1 / SLOW_EVERY:
            return
        for _ in range(SLOW_TOUCHES):
            time.sleep(TOUCH_EVERY_S)
            for job_id, count in held.items():
                if count > 0:
                    try:
                        dcache.touch_batch_job(job_id)
                    except JobNotFound:
                        self.journal.write(k="lost", job=job_id, why="deleted while this host held a claim")

    def write_target(self, rng: random.Random, target: BatchTarget, number: int) -> None:
        job_id, idx, host = target.job_id, target.idx, self.config.host
        try:
            if rng.random() < FAIL_P:
                error, hint = rng.choice(ERRORS)
                text = f"{error} (host {host}, claim {number})"
                dcache.update_batch_target(job_id, idx, TargetStatus.FAILED, error=text, hint=hint)
                ok, size = False, 0
            else:
                result = envelope(rng, self.text, target.url, host=host, claim=number)
                dcache.update_batch_target(job_id, idx, TargetStatus.DONE, result=result)
                ok, size = True, len(result.encode("utf-8"))
        except (JobNotFound, TargetNotFound):
            self.journal.write(k="lost", job=job_id, why="deleted while this host held a claim")
            return
        self.journal.write(k="done", job=job_id, idx=idx, ok=ok, size=size, t=time.monotonic())
        self.finish(job_id)

    def finish(self, job_id: str) -> None:
        """After a write: the job's final status once every target is written (by whichever runner sees
        it first; another seeing it too writes the same status)."""
        job = dcache.batch_job(job_id)
        if job is None:  # finished by another runner and evicted since: nothing left to do
            return
        if job.status == JobStatus.FAILED and job.error == RESCUE_REASON:
            self.journal.write(k="lost", job=job_id, why="rescued while this host held a claim")
            return
        if job.status != JobStatus.RUNNING or job.targets_done < job.targets_total:
            return
        targets = dcache.batch_targets(job_id) or []
        failed = sum(1 for target in targets if target.status == TargetStatus.FAILED)
        status, error = final_status(failed, job.targets_total)
        try:
            dcache.set_batch_job_status(job_id, status, error)
        except JobNotFound:  # finished by another runner and evicted meanwhile
            return
        self.journal.write(k="finish", job=job_id, status=status.value)

    def rescuer(self) -> None:
        while not self.stop.wait(RESCUE_EVERY_S):
            if rescued := dcache.rescue_stale_jobs(self.config.stale_after, RESCUE_REASON):
                self.journal.write(k="rescue", n=rescued)


def job_id_of(prefix: str, number: int) -> str:
    """The id of the job a submission creates (each run has its own prefix)."""
    return f"{prefix}-{number:05d}"
