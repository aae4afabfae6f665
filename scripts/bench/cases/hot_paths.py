"""The store's hot paths as timed operations, on sift.dcache's public API only: the comparison with
another commit runs them against that commit's ``sift``, whose private modules may differ."""

from __future__ import annotations

import random

from sift import dcache

from ..harness import Op
from ..sizes import BUDGET, RESULT_1K, T0

#: The hot paths the flat group times at two sizes of history.
FLAT_CASES = (
    "runner_step",
    "batch_job_by_idem",
    "live_batch_jobs",
    "live_batch_jobs_total",
    "batch_nbytes",
    "sweep_batch_noop",
    "batch_job",
)
#: The hot paths a comparison with another commit times, side by side.
COMPARED_CASES = ("runner_step", "claim_batch_targets", "sweep_batch_noop", "evict_batch_oldest_noop")
#: Targets each claim_batch_targets call asks for.
CLAIM_LIMIT = 10
#: The job whose pending targets the runner step finishes, one a call.
RUNNER_JOB = "runner"


def runner_step(now: int) -> Op:
    """A runner's step: target i of the runner's job done with 1 KB, then a no-op eviction."""

    def step(i: int) -> None:
        dcache.update_batch_target(RUNNER_JOB, i, "done", result=RESULT_1K, now=now)
        dcache.evict_batch_oldest(BUDGET)

    return step


def sweep_noop(now: int) -> Op:
    """A sweep whose cutoff is just below the fixtures' oldest lease: nothing is due."""
    ttl = now - T0 + 1

    def sweep(i: int) -> None:
        if dcache.sweep_batch(ttl, now=now):
            raise AssertionError("sweep removed jobs")

    return sweep


def evict_noop(i: int) -> None:
    """An eviction to a budget no fixture reaches."""
    if dcache.evict_batch_oldest(BUDGET):
        raise AssertionError("eviction removed jobs")


def claim(now: int) -> Op:
    """claim_batch_targets(CLAIM_LIMIT); the fixture must hold enough pending targets."""

    def run(i: int) -> None:
        if not dcache.claim_batch_targets(CLAIM_LIMIT, now=now):
            raise AssertionError("claims: no pending target left; the fixture is too small")

    return run


def flat_paths(n: int) -> dict[str, Op]:
    """The flat group's hot paths on the open store of ``n`` retained jobs."""
    rng = random.Random(n)
    now = T0 + n + 1000
    # Hits of the idempotency lookup: jobs in done or partial, spread over the whole store.
    idem = [(f"caller-{i % 100}", f"job-idem-{i}") for i in (rng.randrange(n // 4) * 4 for _ in range(4096))]
    ids = [f"job-{rng.randrange(n):07d}" for _ in range(4096)]

    def by_idem(i: int) -> None:
        caller, key = idem[i % 4096]
        if dcache.batch_job_by_idem(caller, key, 10**6, now=now) is None:
            raise AssertionError(f"idem miss for {key}")

    def get_job(i: int) -> None:
        if dcache.batch_job(ids[i % 4096]) is None:
            raise AssertionError("batch_job miss")

    return {
        "runner_step": runner_step(now),
        "batch_job_by_idem": by_idem,
        "live_batch_jobs": lambda i: dcache.live_batch_jobs("caller-3"),
        "live_batch_jobs_total": lambda i: dcache.live_batch_jobs_total(),
        "batch_nbytes": lambda i: dcache.batch_nbytes(),
        "sweep_batch_noop": sweep_noop(now),
        "batch_job": get_job,
    }


def compared_paths(now: int) -> dict[str, Op]:
    """The hot paths a comparison times, on a store built by ``fixtures.build_compared``."""
    return {
        "runner_step": runner_step(now),
        "claim_batch_targets": claim(now),
        "sweep_batch_noop": sweep_noop(now),
        "evict_batch_oldest_noop": evict_noop,
    }
