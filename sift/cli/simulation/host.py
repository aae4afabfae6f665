"""One host process of ``sift simulate --hosts``: API threads, runner threads and a claim keeper."""

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
from sift.dcache import BatchJob, BatchTarget, ClaimLost, JobNotFound, JobStatus, TargetNotFound, TargetStatus
from sift.dcache.models import LIVE_JOB_STATUSES

from ..store import OPEN_TIMEOUT_S, is_postgres
from .journal import Journal
from .workload import (
    ERRORS,
    FAIL_P,
    NO_OPTIONS,
    ClaimOptions,
    JobSpec,
    Settings,
    corpus,
    envelope,
    final_status,
    submission,
)

__all__ = ["API_THREADS", "MAX_ATTEMPTS", "STALE_REASON", "Host", "HostConfig", "host_main", "job_id_of"]


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
#: How often each host's keeper renews its claims and requeues any host's stale claims (whether or not
#: there is work): ``stale_after`` is whole seconds, at least ten renewals.
RENEW_EVERY_S = 0.5
#: A target's claims before a stale one fails it: one host killed once leaves every target an attempt.
MAX_ATTEMPTS = 3
#: How long an idle runner or a polling API thread waits before trying again.
IDLE_S = 0.01
POLL_S = 0.005
#: The error of a target whose last attempt's claim went stale.
STALE_REASON = "its host stopped renewing the claim (simulated SIGKILL)"


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
    claim: ClaimOptions = NO_OPTIONS  # the claim's options (per_host, weights, fair)


def host_main(config: HostConfig, conn: multiprocessing.connection.Connection) -> None:
    """A host process: open the store, say ready, run on "go" until "stop", say bye."""
    Host(config).serve(conn)


def runner_names(prefix: str, host: int, workers: int) -> list[str]:
    """The names host ``host``'s runner threads claim under, one a thread."""
    return [f"{prefix}-host-{host}-{n}" for n in range(workers)]


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
        # Each runner thread's name, which its claims record: a late write of one thread's requeued claim
        # must not pass as another's (their claims would share a name).
        self.names = runner_names(config.prefix, config.host, config.settings.workers)
        self.go = threading.Event()  # the coordinator said go
        self.warmed = threading.Barrier(1)

    def serve(self, conn: multiprocessing.connection.Connection) -> None:
        c = self.config
        threads = API_THREADS + c.settings.workers + 3  # and the keeper, the main thread, one spare
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
                self.thread(self.runner, seed + 50 + n, self.names[n], name=f"runner-{n}")
                for n in range(c.settings.workers)
            ]
            host_threads = [*api, *runners, self.thread(self.keeper, name="keeper")]
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
        # A flood's callers do not wait for their jobs before they send more: that is the flood.
        in_flight = len(specs) if self.config.settings.workload == "flood" else IN_FLIGHT
        for spec in specs:
            while len(outstanding) >= max(1, in_flight) and not self.stop.is_set():
                self.poll(outstanding)
            if self.stop.is_set():
                return
            # Its time is the call's start: another host may claim the job's targets before the call
            # returns, and every claim of them must come after the submission in the merged journals.
            started = time.monotonic()
            answered, created = self.submit(spec)
            self.journal.write(k="sub", n=spec.number, id=answered, new=created, t=started)
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

    def runner(self, seed: int, name: str) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            started = time.perf_counter()
            claimed = dcache.claim_batch_targets(
                CLAIM_LIMIT, per_job=PER_JOB, runner=name, **self.config.claim.kwargs()
            )
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
            by_job: dict[str, list[BatchTarget]] = {}
            for target in claimed:
                by_job.setdefault(target.job_id, []).append(target)
            for job_id, targets in by_job.items():
                results = []
                for target in targets:
                    self.fetch(rng, held)
                    results.append(self.outcome(rng, target, number))
                    held[job_id] -= 1
                self.write_results(job_id, results, name)
            if evicted := dcache.evict_batch_oldest(self.config.settings.budget):
                self.journal.write(k="evict", n=evicted)

    def fetch(self, rng: random.Random, held: collections.Counter[str]) -> None:
        """A fetch waits on the network from half to one and a half times ``fetch_s`` (none at 0); a slow one
        waits longer besides, and renews the lease of each job the runner holds targets of (the claims are
        the keeper's to renew)."""
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

    def outcome(self, rng: random.Random, target: BatchTarget, number: int) -> dict[str, Any]:
        """A fetched target's write: failed with an error and hint naming this host and claim, or done with
        a page that names them."""
        if rng.random() < FAIL_P:
            error, hint = rng.choice(ERRORS)
            text = f"{error} (host {self.config.host}, claim {number})"
            return {"idx": target.idx, "status": TargetStatus.FAILED, "error": text, "hint": hint}
        result = envelope(rng, self.text, target.url, host=self.config.host, claim=number)
        return {"idx": target.idx, "status": TargetStatus.DONE, "result": result}

    def write_results(self, job_id: str, results: list[dict[str, Any]], name: str) -> None:
        """The job's arrived results in one call (``update_batch_targets``, as runner ``name``); when a
        claim among them was lost, each target alone, and a lost claim's write is dropped, as the README's
        runner drops it: the target's new holder writes it."""
        try:
            dcache.update_batch_targets(job_id, results, runner=name)
            written = results
        except ClaimLost:
            written = [entry for entry in results if self.write_one(job_id, entry, name)]
        except (JobNotFound, TargetNotFound):
            self.journal.write(k="lost", job=job_id, why="deleted while this host held a claim")
            return
        t = time.monotonic()
        for entry in written:
            size = len(entry["result"].encode("utf-8")) if "result" in entry else 0
            ok = entry["status"] == TargetStatus.DONE
            self.journal.write(k="done", job=job_id, idx=entry["idx"], ok=ok, size=size, t=t)
        if written:
            self.finish(job_id)

    def write_one(self, job_id: str, entry: dict[str, Any], name: str) -> bool:
        """One target's write as runner ``name``: False when its claim was lost, or its job deleted
        (nothing written)."""
        fields = {name: entry[name] for name in ("result", "error", "hint") if name in entry}
        try:
            dcache.update_batch_target(job_id, entry["idx"], entry["status"], runner=name, **fields)
        except ClaimLost:
            self.journal.write(k="claim_lost", job=job_id, idx=entry["idx"])
            return False
        except (JobNotFound, TargetNotFound):
            self.journal.write(k="lost", job=job_id, why="deleted while this host held a claim")
            return False
        return True

    def finish(self, job_id: str) -> None:
        """After a write: the job's final status once every target is written (by whichever runner sees
        it first; another seeing it too writes the same status)."""
        job = dcache.batch_job(job_id)
        if job is None:  # finished by another runner and evicted since: nothing left to do
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

    def keeper(self) -> None:
        """On a timer, whether or not there is work: renew the claims of this host's runners, requeue any
        host's stale claims (recording how many went back to pending and how many failed at their last
        attempt), and finish a job whose every target is written but whose status is not (its last writer
        died first)."""
        while not self.stop.wait(RENEW_EVERY_S):
            for name in self.names:
                dcache.renew_claims(name)
            before = dcache.stats()  # this thread alone requeues in this process: the difference is its own
            if dcache.requeue_stale_claims(
                self.config.stale_after, max_attempts=MAX_ATTEMPTS, reason=STALE_REASON
            ):
                after = dcache.stats()
                requeued, failed = (
                    after[n] - before[n] for n in ("targets_requeued", "targets_failed_stale")
                )
                self.journal.write(k="requeue", n=requeued, failed=failed)
            written: Any = BatchJob.select(BatchJob.id).where(
                BatchJob.id.startswith(f"{self.config.prefix}-")
                & (BatchJob.status == JobStatus.RUNNING)
                & (BatchJob.targets_done >= BatchJob.targets_total)
            )
            for (job_id,) in written.tuples():
                self.finish(job_id)


def job_id_of(prefix: str, number: int) -> str:
    """The id of the job a submission creates (each run has its own prefix)."""
    return f"{prefix}-{number:05d}"
