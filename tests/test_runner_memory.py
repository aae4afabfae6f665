"""What a Runner keeps once its outcomes are written: nothing of them. An idle runner holds none of the
targets it fetched, nor their results, however large (a result may be up to 64 MiB)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from helpers import make_job, make_targets
from test_runner import job_final, running, wait_for

from sift import dcache
from sift.runner import Runner

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
        # the runner goes on, idle: a worker lets go of its last target at its next look for work
        wait_for(lambda: held() == 0, "the runner to let go of every target it fetched", timeout=10)
    assert len(fetched) == TARGETS
