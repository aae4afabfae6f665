"""How many worker threads a Runner runs: they start as its fetches need them, up to ``concurrency``. Slow
fetches run at the full concurrency at once; quick ones (``GROW_AFTER``) on the workers already started,
as more threads would only take turns at the interpreter's lock; and workers found stuck in slow fetches
with targets waiting (a look every ``LOOK_EVERY``) are joined by more."""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path

import pytest
from helpers import make_job, make_targets
from test_runner import WAIT, job_final, running, wait_for

from sift import dcache
from sift.runner import Fail, Runner
from sift.runner import runner as runner_module

pytestmark = pytest.mark.slow  # the fast lane holds at most 4,000 cases


def submit_job(job_id: str, targets: int) -> None:
    dcache.create_batch_job(make_job(job_id, targets_total=targets), make_targets(targets))


def meeting(parties: int) -> runner_module.Fetch:
    """A fetch that returns only once ``parties`` fetches are in flight together; else it fails."""
    barrier = threading.Barrier(parties, timeout=WAIT)

    def fetch(target: dcache.BatchTarget) -> str:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            raise Fail(f"fewer than {parties} fetches ran at once") from None
        return "met"

    return fetch


def worker_threads(name: str) -> int:
    return sum(thread.name.startswith(f"sift-worker {name} ") for thread in threading.enumerate())


@pytest.mark.parametrize(
    ("ready", "quick", "busy", "started", "most", "wanted"),
    [
        (5, None, 1, 1, 8, True),  # no fetch has ended yet
        (5, False, 3, 3, 8, True),  # the last fetch was slow
        (5, True, 3, 3, 8, False),  # the last fetch was quick: another thread would only take turns
        (0, False, 3, 3, 8, False),  # no target waits
        (5, False, 2, 3, 8, False),  # a worker is free to take the next
        (5, False, 8, 8, 8, False),  # all have started
    ],
)
def test_a_worker_starts_when_targets_wait_every_worker_fetches_and_the_last_fetch_was_not_quick(
    ready: int, quick: bool | None, busy: int, started: int, most: int, wanted: bool
) -> None:
    assert runner_module._worker_wanted(ready, quick, busy, started, most) is wanted


def test_slow_fetches_run_at_the_full_concurrency_at_once(
    shared_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "LOOK_EVERY", 60.0)  # no look could start them: the workers did
    submit_job("slow", 6)
    runner = Runner(meeting(6), name="w", concurrency=6)
    with running(runner):
        wait_for(lambda: job_final("slow"), "the job to finish")
        assert runner.progress().workers == 6 == worker_threads("w")
    targets = dcache.batch_targets("slow") or []
    assert [(t.status, t.result, t.attempts) for t in targets] == [("done", "met", 1)] * 6


def test_workers_stuck_in_slow_fetches_after_quick_ones_are_joined_by_more(
    shared_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "LOOK_EVERY", 0.05)
    submit_job("stuck", 4)
    runner = Runner(meeting(4), name="w", concurrency=4, prefetch=0)
    runner._quick = True  # as after quick fetches: no worker starts for the next fetch
    with running(runner):
        wait_for(lambda: job_final("stuck"), "the job to finish")
        assert runner.progress().workers == 4
    targets = dcache.batch_targets("stuck") or []
    assert [(t.status, t.result, t.attempts) for t in targets] == [("done", "met", 1)] * 4


def test_quick_fetches_run_on_the_workers_started(file_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every fetch quick however busy the machine, and no look that could find the workers stuck
    monkeypatch.setattr(runner_module, "GROW_AFTER", 60.0)
    monkeypatch.setattr(runner_module, "LOOK_EVERY", 60.0)
    submit_job("quick", 300)
    runner = Runner(lambda target: f"page {target.idx}", name="w", concurrency=16)
    runner._quick = True  # as after a quick fetch
    with running(runner):
        wait_for(lambda: job_final("quick"), "the job to finish")
        assert runner.progress().workers == 1 == worker_threads("w")
    targets = dcache.batch_targets("quick") or []
    assert [t.result for t in targets] == [f"page {i}" for i in range(300)]


@pytest.mark.parametrize(
    ("ready", "taken_since", "busy", "started"),
    [
        (3, False, 2, 2),  # targets waited since the last look, none taken, every worker fetching
        (3, True, 2, 2),  # a target was taken since: the workers move
        (0, False, 2, 2),  # no target waits
        (3, False, 1, 2),  # a worker is free to take the next
    ],
)
def test_the_run_threads_look_starts_a_worker_only_when_the_workers_are_stuck(
    ready: int, taken_since: bool, busy: int, started: int
) -> None:
    """The look's cases, the workers' threads stand-ins that end at once."""
    runner = Runner(lambda target: "page", name="w", concurrency=8)
    runner._workers = runner_module._Workers("w", 8, lambda: None)
    for _ in range(started):
        runner._workers.start_one()
    waiting = dcache.BatchTarget(idx=0, url="https://a.example/0", options="{}")
    runner._ready, runner._busy, runner._taken, runner._quick = deque([waiting] * ready), busy, 10, True
    taken = runner._unstick(10 - taken_since)
    stuck = ready > 0 and not taken_since and busy >= started
    assert (taken, runner._workers.started) == (10, started + stuck)
    assert runner._quick is (None if stuck else True)  # found stuck: fetches are slow now
