"""What a Runner keeps once its outcomes are written: nothing of them. An idle runner holds none of the
targets it fetched, nor their results, however large (a result may be up to 64 MiB); nor does one whose
claims keep failing."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest
from helpers import make_job, make_targets
from test_runner import job_final, running, wait_for

from sift import dcache
from sift.runner import Runner
from sift.runner import runner as runner_module

TARGETS = 40


def test_an_idle_runner_holds_none_of_the_targets_it_fetched(store: Any) -> None:
    dcache.create_batch_job(make_job("j", targets_total=TARGETS), make_targets(TARGETS))
    fetched: list[weakref.ref[dcache.BatchTarget]] = []

    def fetch(target: dcache.BatchTarget) -> str:
        fetched.append(weakref.ref(target))
        return "x" * 100_000  # the target's outcome holds it, and the outcome the target

    def held() -> int:
        gc.collect()
        return sum(ref() is not None for ref in fetched)

    with running(Runner(fetch, name="r", concurrency=4)) as runner:
        wait_for(lambda: job_final("j"), "the job to finish")
        assert runner.progress().done == TARGETS
        # the runner goes on, idle: neither a worker nor its writer keeps a target whose outcome is written
        wait_for(lambda: held() == 0, "the runner to let go of every target it fetched", timeout=10)
    assert len(fetched) == TARGETS


def test_a_runner_whose_claims_fail_holds_none_of_the_targets_it_fetched(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    dcache.create_batch_job(make_job("j", targets_total=TARGETS), make_targets(TARGETS))
    fetched: list[weakref.ref[dcache.BatchTarget]] = []
    claims_fail = threading.Event()
    claim = dcache.claim_batch_targets
    claimed = failed_claims = 0

    def claim_unless_failing(limit: int, **request: Any) -> list[dcache.BatchTarget]:
        """Claims one at a time (the runner's claim lock): once every target is claimed, each fails, so
        that no worker's claim ever comes back empty (after which it would take no target for a while)."""
        nonlocal claimed, failed_claims
        if claims_fail.is_set():
            failed_claims += 1
            raise dcache.StoreUnavailable("database: the connection was lost (a test's)")
        got = claim(limit, **request)
        claimed += len(got)
        if claimed == TARGETS:
            claims_fail.set()
        return got

    def fetch(target: dcache.BatchTarget) -> str:
        fetched.append(weakref.ref(target))
        return "x" * 100_000

    def held() -> int:
        gc.collect()
        return sum(ref() is not None for ref in fetched)

    monkeypatch.setattr(runner_module, "claim_batch_targets", claim_unless_failing)
    with running(Runner(fetch, name="r", concurrency=4)) as runner:
        wait_for(lambda: job_final("j"), "the job to finish")
        assert runner.progress().done == TARGETS

        # the workers claim again and again, each claim failing: none keeps the target it fetched last
        def let_go() -> bool:
            return failed_claims >= 3 and held() == 0

        wait_for(let_go, "the runner to let go of every target", timeout=10)
    assert len(fetched) == TARGETS
