"""The runner: ``python -m fetchapp.runner --db URL``. Run one per host or several; each claims its own work
under its own name, fetches it, writes the results, and finishes each job done, partial or failed.

Beside its loop, a timer renews this runner's claims and requeues any runner's stale claims (a runner that
died), sweeps expired jobs and finishes jobs whose last write came from a runner that died before
finishing them: whether or not there is work. SIGTERM or SIGINT stops it: the fetches in hand are
abandoned, what it still holds goes back to pending at once (``release_claims``), and it exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import peewee
from sift import dcache
from sift.dcache import BatchJob, BatchTarget, TargetStatus

from .fetcher import StubFetcher
from .web import LIVE, TTL

Fetch = Callable[[str, Any], str]
log = logging.getLogger("fetchapp.runner")


@dataclass(frozen=True)
class Settings:
    """How a runner claims and keeps its claims."""

    claim: int = 16  # targets per claim, fetched at once
    per_job: int = 4  # at most this many from one job per claim: one huge job cannot starve the rest
    renew_every: float = 10.0  # seconds between heartbeats (renew_claims) and requeues of stale claims
    stale_after: int = 60  # a claim not renewed for this long is taken for its runner's death
    max_attempts: int = 3  # a target whose runner died with it this many times fails instead
    sweep_every: float = 60.0  # seconds between sweeps of expired jobs
    budget: int = 512 * 1024 * 1024  # bytes of stored results across all jobs; the oldest go first
    idle_wait: float = 0.5  # seconds to wait when nothing is pending


def run(fetch: Fetch, runner: str, stop: threading.Event, settings: Settings = Settings()) -> None:
    """Claim, fetch and write until ``stop`` is set; the keeper thread runs beside. On the way out, every
    claim still held goes back to pending."""
    keeper = threading.Thread(target=keep_claims, args=(runner, stop, settings), name="keeper", daemon=True)
    keeper.start()
    pool = futures.ThreadPoolExecutor(settings.claim, thread_name_prefix="fetch")
    holding = False  # a step failed part-way: claims it took may be left, which the keeper would renew
    try:
        while not stop.is_set():
            try:
                if holding:  # give them back first, so they never stay running under a live heartbeat
                    dcache.release_claims(runner)
                    holding = False
                handled = step(fetch, runner, stop, pool, settings)
            except dcache.StoreUnavailable as exc:  # the store is down or locked: wait, try again
                log.warning("store unavailable: %s", exc)
                holding, handled = True, 0
            if not handled:
                stop.wait(settings.idle_wait)
    finally:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)  # abandoned fetches: their claims are released below
        keeper.join()
        released = dcache.release_claims(runner)
        log.info("%s stopped; released %d claims", runner, released)


def step(fetch: Fetch, runner: str, stop: threading.Event, pool: futures.Executor, settings: Settings) -> int:
    """One claim: fetch its targets at once, write each job's results in one transaction, finish the
    jobs they complete. A stop abandons the fetches still running (their claims are released). Returns
    how many targets were claimed."""
    claimed = dcache.claim_batch_targets(settings.claim, per_job=settings.per_job, runner=runner)
    running = {pool.submit(fetch, t.url, t.parsed_options()): t for t in claimed}
    writes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    while running and not stop.is_set():
        finished, _ = futures.wait(running, timeout=0.2, return_when=futures.FIRST_COMPLETED)
        for future in finished:
            target = running.pop(future)
            writes[target.job_id].append(outcome(target, future))
    for future in running:
        future.cancel()
    for job_id, results in writes.items():
        write_results(job_id, results, runner)
        finish(job_id)
    if claimed:
        dcache.evict_batch_oldest(settings.budget)
    return len(claimed)


def outcome(target: BatchTarget, future: futures.Future[str]) -> dict[str, Any]:
    """The write for one fetch: done with its result, or failed with the fetch's error."""
    try:
        return {"idx": target.idx, "status": TargetStatus.DONE.value, "result": future.result()}
    except Exception as exc:
        return {
            "idx": target.idx,
            "status": TargetStatus.FAILED.value,
            "error": str(exc) or type(exc).__name__,
        }


def write_results(job_id: str, results: list[dict[str, Any]], runner: str) -> None:
    """One transaction for the job's results; if this runner lost a claim among them (it was taken for
    dead and the target requeued), the others are written one by one and the lost ones dropped: their
    new runner writes them."""
    try:
        dcache.update_batch_targets(job_id, results, runner=runner)
        return
    except dcache.ClaimLost:
        pass
    except dcache.JobNotFound:
        return  # swept or evicted meanwhile: nobody will read it
    for result in results:
        try:
            dcache.update_batch_target(job_id, runner=runner, **result)
        except (dcache.ClaimLost, dcache.JobNotFound):
            continue


def finish_complete_jobs() -> int:
    """Finish every live job whose targets are all final (its runner died between its last write and
    finishing it). Returns how many finished."""
    # The statuses inline, not as parameters: then SQLite reads the store's partial index of live jobs
    # (batch_job_claim) instead of every job in the table.
    live = peewee.ValueLiterals(BatchJob.status.in_(LIVE))
    complete = BatchJob.select(BatchJob.id).where(live & (BatchJob.targets_done >= BatchJob.targets_total))
    return sum(finish(job.id) for job in complete)


def finish(job_id: str) -> bool:
    """Finish the job if its every target is final (``finish_batch_job``); whether it finished. A job
    swept or evicted meanwhile has nothing left to finish."""
    try:
        return dcache.finish_batch_job(job_id) is not None
    except dcache.JobNotFound:
        return False


def keep_claims(runner: str, stop: threading.Event, settings: Settings) -> None:
    """On timers, whether or not there is work: renew this runner's claims (a slow fetch keeps its claim)
    and requeue any runner's stale ones; now and then sweep expired jobs and finish complete ones. A store
    error is logged and the next tick tries again."""
    ticks_per_sweep = max(1, round(settings.sweep_every / settings.renew_every))
    tick = 0
    while not stop.wait(settings.renew_every):
        tick += 1
        try:
            dcache.renew_claims(runner)
            dcache.requeue_stale_claims(settings.stale_after, max_attempts=settings.max_attempts)
            if tick % ticks_per_sweep == 0:
                dcache.sweep_batch(TTL)
                finish_complete_jobs()
        except dcache.StoreUnavailable as exc:
            log.warning("keeper: store unavailable: %s", exc)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fetchapp.runner --db URL [--name NAME]``: runs until SIGTERM or SIGINT, then exits 0."""
    parser = argparse.ArgumentParser(prog="python -m fetchapp.runner", description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="the store: a SQLite path or a postgresql:// URL")
    parser.add_argument("--name", help="this runner's name in its claims (default: host name and pid)")
    parser.add_argument("--fetch-delay", type=float, default=0.02, help="the stub fetcher's sleep, seconds")
    parser.add_argument("--renew-every", type=float, default=Settings.renew_every)
    parser.add_argument("--stale-after", type=int, default=Settings.stale_after)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    dcache.open_db(args.db, create=False)  # a runner never makes a store from a mistyped --db
    runner = args.name or dcache.runner_name()
    log.info("%s started", runner)
    settings = Settings(renew_every=args.renew_every, stale_after=args.stale_after)
    try:
        run(StubFetcher(args.fetch_delay), runner, stop, settings)
    finally:
        dcache.close_db()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
