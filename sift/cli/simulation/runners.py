"""The single-process simulation's runner process: runner threads that claim from the store and write
each job's results in one call, and the keeper that renews their claims and requeues stale ones."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from sift import dcache
from sift.dcache import BatchTarget, ClaimLost, JobNotFound, JobStatus, TargetNotFound, TargetStatus

from .workload import ERRORS, FAIL_P, envelope, final_status

if TYPE_CHECKING:
    from .single import Simulation

__all__ = ["CLAIM_LIMIT", "KEEP_EVERY_S", "MAX_ATTEMPTS", "PER_JOB", "STALE_REASON", "RunnerThreads"]

#: Targets one claim takes, and at most how many of one job.
CLAIM_LIMIT = 4
PER_JOB = 2
#: How often (real seconds) the keeper renews the runners' claims and requeues stale ones.
KEEP_EVERY_S = 0.02
#: A target's claims before a stale one fails it: one restart leaves every target attempts to spare.
MAX_ATTEMPTS = 3
#: How long an idle runner waits (real seconds) before it claims again.
IDLE_S = 0.005
STALE_REASON = "its runner stopped renewing the claim"


class RunnerThreads:
    """What the runner threads and the keeper of one simulation run: the documented runner loop."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def runner(self, name: str, seed: int) -> None:
        rng = random.Random(seed)
        sim = self.sim
        held = sim.held.setdefault(name, {})
        while not self.sim.halted():
            with self.sim.store_lock:
                claimed = dcache.claim_batch_targets(
                    CLAIM_LIMIT,
                    per_job=PER_JOB,
                    runner=name,
                    now=self.sim.clock.now(),
                    **self.sim.claim.kwargs(),
                )
                held.update({(t.job_id, t.idx): t.url for t in claimed})
                sim.fairness.claimed((sim.spec_of[t.job_id].caller, t.url) for t in claimed)
                if claimed and sim.crash_due.is_set():
                    sim.crash_due.clear()
                    sim.crashing.set()  # the crash, at the first claim past the mark: this claim is lost
            if not claimed:
                time.sleep(IDLE_S)
                continue
            self.sim.add(claims=1, targets_claimed=len(claimed))
            by_job: dict[str, list[BatchTarget]] = {}
            for target in claimed:
                by_job.setdefault(target.job_id, []).append(target)
            for job_id, targets in by_job.items():
                if self.sim.crashing.is_set() or self.sim.abort.is_set():
                    return  # the crash: what this runner holds stays running, for the restart to requeue
                self.run_job_targets(rng, name, job_id, targets)
            self.sim.add(jobs_evicted=dcache.evict_batch_oldest(self.sim.settings.budget))

    def run_job_targets(self, rng: random.Random, name: str, job_id: str, targets: list[BatchTarget]) -> None:
        """Fetch the job's claimed targets, then write their results in one call; sweep when it is due."""
        results: list[dict[str, Any]] = []
        sweep_at: int | None = None
        now = self.sim.clock.now()
        for target in targets:
            if self.sim.crashing.is_set() or self.sim.abort.is_set():
                return  # the crash: the results fetched so far are lost with the process; its claims stay
            now, due = self.sim.clock.tick()
            sweep_at = now if due else sweep_at
            if rng.random() < FAIL_P:
                error, hint = rng.choice(ERRORS)
                results.append(
                    {"idx": target.idx, "status": TargetStatus.FAILED, "error": error, "hint": hint}
                )
            else:
                result = envelope(rng, self.sim.corpus, target.url)
                results.append({"idx": target.idx, "status": TargetStatus.DONE, "result": result})
        written = self.write(name, job_id, results, now)
        if written is None:
            return
        failed = sum(1 for entry in written if entry["status"] == TargetStatus.FAILED)
        self.sim.add(targets_written=len(written), targets_failed=failed)
        if written:
            self.finish(job_id, now)
        if sweep_at is not None:
            swept = dcache.sweep_batch(self.sim.settings.ttl, now=sweep_at)
            self.sim.add(sweeps=1, jobs_swept=swept)

    def write(
        self, name: str, job_id: str, results: list[dict[str, Any]], now: int
    ) -> list[dict[str, Any]] | None:
        """The job's results in one ``update_batch_targets`` as runner ``name``; when a claim among them was
        lost (requeued as stale), each alone, dropping a lost one's write as the documented runner does. A
        job swept meanwhile loses them all. Returns the entries written; None if the runner crashed first
        (they stay running in the store)."""
        held = self.sim.held[name]
        with self.sim.store_lock:
            if self.sim.crashing.is_set():
                return None
            try:
                dcache.update_batch_targets(job_id, results, runner=name, now=now)
                written = results
            except ClaimLost:
                written = [entry for entry in results if self.write_one(name, job_id, entry, now)]
            except (JobNotFound, TargetNotFound):
                written = []
            urls = [held.pop((job_id, entry["idx"])) for entry in results if (job_id, entry["idx"]) in held]
            self.sim.fairness.finished(urls)
            if written:
                self.sim.fairness.results(self.sim.spec_of[job_id].caller, time.monotonic())
        self.sim.add(targets_lost=len(results) - len(written))
        return written

    def write_one(self, name: str, job_id: str, entry: dict[str, Any], now: int) -> bool:
        fields = {key: entry[key] for key in ("result", "error", "hint") if key in entry}
        try:
            dcache.update_batch_target(job_id, entry["idx"], entry["status"], runner=name, now=now, **fields)
        except ClaimLost:
            self.sim.add(claims_lost=1)
            return False
        except (JobNotFound, TargetNotFound):
            return False
        return True

    def finish(self, job_id: str, now: int) -> None:
        """After a write: the job's final status once every target is written (by whichever runner sees it
        first; another seeing it too writes the same status)."""
        job = dcache.batch_job(job_id)
        if job is None or job.status != JobStatus.RUNNING or job.targets_done < job.targets_total:
            return
        targets = dcache.batch_targets(job_id) or []
        failed = sum(1 for target in targets if target.status == TargetStatus.FAILED)
        status, error = final_status(failed, job.targets_total)
        try:
            dcache.set_batch_job_status(job_id, status, error, now=now)
        except JobNotFound:
            return
        self.sim.resolved()

    def keeper(self) -> None:
        """On a timer, whether or not there is work: renew every runner's claims, requeue stale claims
        (none should be: the renewals come far more often than ``stale_after`` of simulated time)."""
        while not (self.sim.halted() or self.sim.abort.wait(KEEP_EVERY_S)):
            now = self.sim.clock.now()
            for name in list(self.sim.held):
                dcache.renew_claims(name, now=now)
            before = dcache.stats()  # this thread alone requeues while it runs: the difference is its own
            if dcache.requeue_stale_claims(
                self.sim.stale_after, max_attempts=MAX_ATTEMPTS, reason=STALE_REASON, now=now
            ):
                after = dcache.stats()
                self.sim.add(
                    stale_requeued=after["targets_requeued"] - before["targets_requeued"],
                    stale_failed=after["targets_failed_stale"] - before["targets_failed_stale"],
                )
