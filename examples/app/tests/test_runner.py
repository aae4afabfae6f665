"""The runner's rules on a fresh store per test: how jobs finish, late writes, the keeper's timers, and a
stop that gives the claims back."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any

import pytest
from sift import dcache
from sift.testing import check_store_invariants

from fetchapp import runner
from fetchapp.fetcher import FetchFailed, StubFetcher, envelope

SETTINGS = runner.Settings()
#: A hang guard for the threaded tests, seconds: never reached when the runner works.
HANG_GUARD = 60


def one_step(urls: list[str], make_job: Any, name: str = "r1") -> str:
    job = make_job(targets_total=len(urls))
    dcache.create_batch_job(job, [dcache.BatchTarget(idx=i, url=u, options={}) for i, u in enumerate(urls)])
    with futures.ThreadPoolExecutor(4) as pool:
        runner.step(StubFetcher(0), name, threading.Event(), pool, SETTINGS)
    return str(job.id)


@pytest.mark.sift_store(check=True)
@pytest.mark.parametrize(
    ("urls", "status"),
    [
        (["https://a.example/", "https://b.example/"], "done"),
        (["https://a.example/", "https://down.invalid/"], "partial"),
        (["https://down.invalid/", "https://gone.invalid/x"], "failed"),
    ],
)
def test_a_job_ends_done_partial_or_failed_by_its_targets(
    sift_store: Any, make_job: Any, urls: list[str], status: str
) -> None:
    job_id = one_step(urls, make_job)
    job = dcache.batch_job(job_id)
    assert job is not None and job.status == status and job.targets_done == len(urls)
    for url, target in zip(urls, dcache.batch_targets(job_id) or [], strict=True):
        if url.split("/")[2].endswith(".invalid"):
            assert (target.status, target.result, target.error) == (
                "failed",
                None,
                f"{url.split('/')[2]}: no such host",
            )
        else:
            assert (target.status, target.result) == ("done", envelope(url))


def test_the_stub_fetcher_fails_invalid_hosts_every_time() -> None:
    fetch = StubFetcher(0)
    assert fetch("https://a.example/p", {}) == envelope("https://a.example/p")
    for _ in range(3):
        with pytest.raises(FetchFailed, match=r"^x\.invalid: no such host$"):
            fetch("https://x.invalid/p", {})


@pytest.mark.sift_store(check=True)
def test_a_late_write_after_a_requeue_is_dropped_and_the_new_runner_finishes(
    sift_store: Any, sift_clock: Any, make_job: Any, make_targets: Any
) -> None:
    job = make_job(targets_total=2)
    dcache.create_batch_job(job, make_targets(2))
    old = dcache.claim_batch_targets(2, runner="slow")
    sift_clock.advance(SETTINGS.stale_after)
    assert dcache.requeue_stale_claims(SETTINGS.stale_after) == 2  # "slow" was taken for dead
    new = dcache.claim_batch_targets(1, runner="fresh")  # target 0 is fresh's; target 1 pending again
    late = [{"idx": t.idx, "status": "done", "result": "late"} for t in old]
    runner.write_results(job.id, late, "slow")  # ClaimLost: nothing lands, nothing raised
    assert [(t.status, t.result) for t in dcache.batch_targets(job.id) or []] == [
        ("running", None),
        ("pending", None),
    ]
    runner.write_results(job.id, [{"idx": new[0].idx, "status": "done", "result": "fresh"}], "fresh")
    assert not runner.finish(job.id)  # target 1 still to do
    dcache.claim_batch_targets(1, runner="fresh")
    runner.write_results(job.id, [{"idx": 1, "status": "failed", "error": "timeout"}], "fresh")
    assert runner.finish(job.id)
    stored = dcache.batch_job(job.id)
    assert stored is not None and (stored.status, stored.targets_done) == ("partial", 2)


@pytest.mark.sift_store(check=True)
def test_a_job_cancelled_while_fetched_stays_cancelled(
    sift_store: Any, make_job: Any, make_targets: Any
) -> None:
    job = make_job()
    dcache.create_batch_job(job, make_targets(1))
    dcache.claim_batch_targets(1, runner="r1")
    dcache.set_batch_job_status(job.id, "cancelled")
    runner.write_results(job.id, [{"idx": 0, "status": "done", "result": "x"}], "r1")
    assert not runner.finish(job.id)
    assert runner.finish_complete_jobs() == 0
    stored = dcache.batch_job(job.id)
    assert stored is not None and stored.status == "cancelled"


def test_finish_complete_jobs_finishes_what_a_dead_runner_wrote_last(
    sift_store: Any, make_job: Any, make_targets: Any
) -> None:
    job = make_job(targets_total=2)
    dcache.create_batch_job(job, make_targets(2))
    dcache.claim_batch_targets(2, runner="died")
    dcache.update_batch_targets(
        job.id,
        [{"idx": 0, "status": "done", "result": "a"}, {"idx": 1, "status": "done", "result": "b"}],
        runner="died",
    )
    assert runner.finish_complete_jobs() == 1  # it died before it finished the job
    stored = dcache.batch_job(job.id)
    assert stored is not None and stored.status == "done"


def wait_for(condition: Any) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        assert time.monotonic() < deadline, "the runner's thread never got there"
        time.sleep(0.01)


def test_the_keeper_renews_its_claims_and_requeues_the_dead_ones_with_no_work_to_do(
    sift_store: Any, sift_clock: Any, make_job: Any, make_targets: Any
) -> None:
    job = make_job(targets_total=2)
    dcache.create_batch_job(job, make_targets(2))
    dcache.claim_batch_targets(1, runner="alive")
    dcache.claim_batch_targets(1, runner="dead")
    sift_clock.advance(SETTINGS.stale_after - 1)
    stop = threading.Event()
    keeper = threading.Thread(
        target=runner.keep_claims, args=("alive", stop, runner.Settings(renew_every=0.01))
    )
    keeper.start()
    try:
        wait_for(lambda: (dcache.batch_targets(job.id) or [])[0].heartbeat == sift_clock.now)
        sift_clock.advance(1)  # "dead" has not renewed for stale_after; "alive" renewed 1 s ago
        wait_for(lambda: (dcache.batch_targets(job.id) or [])[1].status == "pending")
    finally:
        stop.set()
        keeper.join()
    alive, dead = dcache.batch_targets(job.id) or []
    assert (alive.status, alive.runner) == ("running", "alive")
    assert (dead.status, dead.runner, dead.attempts) == ("pending", None, 1)


@pytest.mark.sift_store(check=True)
def test_a_stop_abandons_the_fetches_in_hand_and_releases_their_claims(
    sift_store: Any, make_job: Any, make_targets: Any
) -> None:
    job = make_job(targets_total=3)
    dcache.create_batch_job(job, make_targets(3))
    fetching, hold = threading.Event(), threading.Event()

    def hanging_fetch(url: str, options: Any) -> str:
        fetching.set()
        hold.wait(HANG_GUARD)
        return "late"

    stop = threading.Event()
    loop = threading.Thread(target=runner.run, args=(hanging_fetch, "r1", stop))
    loop.start()
    try:
        fetching.wait(HANG_GUARD)
        assert [t.status for t in dcache.batch_targets(job.id) or []] == ["running"] * 3
        stop.set()  # what SIGTERM does
        loop.join(HANG_GUARD)
    finally:
        stop.set()
        hold.set()
        loop.join()
    targets = dcache.batch_targets(job.id) or []
    assert [(t.status, t.runner, t.attempts, t.result) for t in targets] == [("pending", None, 0, None)] * 3
    check_store_invariants()


@pytest.mark.sift_store(check=True)
def test_claims_of_a_step_that_failed_part_way_go_back_and_are_fetched_again(
    sift_store: Any, make_job: Any, make_targets: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job(targets_total=2)
    dcache.create_batch_job(job, make_targets(2))
    write = dcache.update_batch_targets
    failures = []

    def fails_once(*args: Any, **kwargs: Any) -> int:
        if not failures:
            failures.append(args)
            raise dcache.StoreUnavailable("disk I/O error")
        return write(*args, **kwargs)

    monkeypatch.setattr(dcache, "update_batch_targets", fails_once)
    stop = threading.Event()
    loop = threading.Thread(
        target=runner.run, args=(StubFetcher(0), "r1", stop, runner.Settings(idle_wait=0.01))
    )
    loop.start()
    try:
        wait_for(lambda: (stored := dcache.batch_job(job.id)) is not None and stored.status == "done")
    finally:
        stop.set()
        loop.join()
    assert len(failures) == 1
    assert [(t.status, t.attempts) for t in dcache.batch_targets(job.id) or []] == [("done", 1)] * 2
