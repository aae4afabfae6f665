"""freezegun controls the default ``now`` of every function that takes one: it is read at call time."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from helpers import make_job, make_targets

from sift import dcache


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def lease(job_id: str = "job-1") -> int:
    job = dcache.batch_job(job_id)
    assert job is not None
    return int(job.lease)


def setup_job() -> None:
    dcache.create_batch_job(make_job("job-1", idem_key="k", lease=1_000), make_targets(3))
    dcache.create_batch_job(make_job("job-2", lease=1_000, status="done"))


LEASE_WRITES: dict[str, Callable[[], object]] = {
    "update_batch_target": lambda: dcache.update_batch_target("job-1", 0, "running"),
    "update_batch_target-done": lambda: dcache.update_batch_target("job-1", 1, "done", result="x"),
    "set_batch_job_status": lambda: dcache.set_batch_job_status("job-1", "running"),
    "touch_batch_job": lambda: dcache.touch_batch_job("job-1"),
    "mark_in_flight_failed": lambda: dcache.mark_in_flight_failed("restart"),
    "claim_batch_targets": lambda: dcache.claim_batch_targets(1),
    "rescue_stale_jobs": lambda: dcache.rescue_stale_jobs(0, "host lost"),
}


@pytest.mark.parametrize("write", list(LEASE_WRITES.values()), ids=list(LEASE_WRITES))
def test_default_now_of_lease_writes(store: Any, write: Callable[[], object]) -> None:
    setup_job()
    with freeze_time(at(1_700_000_000)) as frozen:
        write()
        assert lease() == 1_700_000_000
        frozen.move_to(at(1_700_000_123))
        dcache.set_batch_job_status(
            "job-1", "queued", now=1
        )  # live again, for mark_in_flight_failed and rescue_stale_jobs
        write()
        assert lease() == 1_700_000_123
    assert lease("job-2") == 1_000


@pytest.mark.parametrize("write", list(LEASE_WRITES.values()), ids=list(LEASE_WRITES))
def test_default_now_is_whole_seconds(store: Any, write: Callable[[], object]) -> None:
    setup_job()
    with freeze_time(at(2_000.999)):
        write()
    assert lease() == 2_000


def test_default_now_can_go_back(store: Any) -> None:
    setup_job()
    with freeze_time(at(500)):
        dcache.touch_batch_job("job-1")
    assert lease() == 500


@pytest.mark.parametrize(("now", "swept"), [(1_099, 0), (1_100, 2), (1_100.5, 2), (1_099.99, 0)])
def test_sweep_default_now(store: Any, now: float, swept: int) -> None:
    setup_job()
    with freeze_time(at(now)):
        assert dcache.sweep_batch(100) == swept
        assert dcache.sweep_batch(timedelta(seconds=100)) == 0


@pytest.mark.parametrize(("now", "found"), [(1_099, True), (1_099.99, True), (1_100, False), (1_200, False)])
def test_idem_default_now(store: Any, now: float, found: bool) -> None:
    setup_job()
    with freeze_time(at(now)):
        assert dcache.batch_job_by_idem("alice", "k", 100) == ("job-1" if found else None)
        assert dcache.batch_job_by_idem("alice", "k", timedelta(seconds=100)) == ("job-1" if found else None)


def test_clock_moves_between_calls(store: Any) -> None:
    """The default is read at each call, not once: a ticking clock expires the job between two calls."""
    setup_job()
    with freeze_time(at(1_050)) as frozen:
        dcache.touch_batch_job("job-1")
        assert dcache.batch_job_by_idem("alice", "k", 10) == "job-1"
        frozen.tick(9)
        assert dcache.batch_job_by_idem("alice", "k", 10) == "job-1"
        frozen.tick(1)
        assert dcache.batch_job_by_idem("alice", "k", 10) is None
        assert dcache.sweep_batch(10) == 2  # job-1 and job-2 (lease 1_000)
        assert dcache.batch_job("job-1") is None


def test_mark_in_flight_failed_default_now_only_on_marked_jobs(store: Any) -> None:
    setup_job()
    with freeze_time(at(3_000)):
        assert dcache.mark_in_flight_failed("restart") == 1
    job = dcache.batch_job("job-1")
    assert job is not None and (job.status, job.error, job.lease) == ("failed", "restart", 3_000)
    assert lease("job-2") == 1_000


def test_explicit_now_wins_over_the_clock(store: Any) -> None:
    setup_job()
    with freeze_time(at(9_000)):
        dcache.touch_batch_job("job-1", now=1_234)
        assert lease() == 1_234
        assert dcache.sweep_batch(300, now=1_233) == 0
        assert dcache.batch_job_by_idem("alice", "k", 1, now=1_234) == "job-1"
