"""``cancel_batch_job``: a live job becomes cancelled and its open targets failed, counted once, their
claims cleared, in one transaction; a runner's later write is ``ClaimLost``; a finished job is left alone."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from helpers import make_job, make_targets, snapshot

from sift import dcache
from sift.dcache import JobStatus

FINISHED = ["done", "partial", "failed", "cancelled"]


def mixed_job(status: str = "running") -> None:
    """Job "j" of 5 targets: 0 done with a result, 1 failed, 2 claimed by runner "r", 3 and 4 pending."""
    dcache.create_batch_job(make_job("j", status=status, targets_total=5), make_targets(5))
    dcache.update_batch_target("j", 0, "done", result="body", now=1_001)
    dcache.update_batch_target("j", 1, "failed", error="404", now=1_002)
    claimed = dcache.claim_batch_targets(1, runner="r", now=1_003)
    assert [(t.job_id, t.idx) for t in claimed] == [("j", 2)]


@pytest.mark.parametrize("status", ["queued", "running"])
def test_a_live_job_is_cancelled_with_its_open_targets(store: Any, status: str) -> None:
    mixed_job(status)
    before = dcache.batch_job("j")
    assert before is not None and before.targets_done == 2
    assert dcache.cancel_batch_job("j", reason="stopped by alice", now=2_000) is True
    job = dcache.batch_job("j")
    assert job is not None
    assert (job.status, job.error, job.lease) == ("cancelled", "stopped by alice", 2_000)
    assert job.targets_done == job.targets_total == 5
    assert job.nbytes == before.nbytes == len("body")
    targets = dcache.batch_targets("j")
    assert targets is not None
    assert [(t.idx, t.status, t.result, t.error, t.runner, t.heartbeat) for t in targets] == [
        (0, "done", "body", None, None, None),
        (1, "failed", None, "404", None, None),
        (2, "failed", None, "stopped by alice", None, None),
        (3, "failed", None, "stopped by alice", None, None),
        (4, "failed", None, "stopped by alice", None, None),
    ]
    assert targets[2].attempts == 1  # its one claim still counted
    assert dcache.check_store().ok
    assert dcache.batch_nbytes() == len("body")


def test_the_default_reason(store: Any) -> None:
    dcache.create_batch_job(make_job("j", targets_total=1), make_targets(1))
    assert dcache.cancel_batch_job("j", now=2_000)
    job, targets = dcache.batch_job("j"), dcache.batch_targets("j")
    assert job is not None and targets is not None
    assert (job.error, targets[0].error) == ("cancelled", "cancelled")


def test_a_job_with_targets_still_to_put_counts_only_those_stored(store: Any) -> None:
    # created now: the check allows a job its missing targets for a while after its creation
    dcache.create_batch_job(make_job("j", targets_total=4, created_at=dcache.unix_now()))
    dcache.put_batch_targets("j", make_targets(2))
    assert dcache.cancel_batch_job("j", now=2_000)
    job = dcache.batch_job("j")
    assert job is not None and (job.status, job.targets_done, job.targets_total) == ("cancelled", 2, 4)
    assert dcache.check_store().ok


@pytest.mark.parametrize("write", ["update_batch_target", "update_batch_targets"])
@pytest.mark.parametrize("status", ["done", "failed", "pending"])
def test_the_runners_later_write_is_claim_lost(store: Any, write: str, status: str) -> None:
    mixed_job()
    dcache.cancel_batch_job("j", now=2_000)
    before = snapshot()
    result = "late" if status == "done" else None
    with pytest.raises(dcache.ClaimLost) as raised:
        if write == "update_batch_target":
            dcache.update_batch_target("j", 2, status, result=result, runner="r", now=2_001)
        else:
            dcache.update_batch_targets("j", [{"idx": 2, "status": status, "result": result}], runner="r")
    assert (raised.value.job_id, raised.value.idx, raised.value.holder) == ("j", 2, None)
    assert snapshot() == before
    assert dcache.renew_claims("r", now=2_002) == 0  # nothing left to renew either


@pytest.mark.parametrize("status", FINISHED)
def test_a_finished_job_is_left_as_it_is(store: Any, status: str) -> None:
    dcache.create_batch_job(make_job("j", status=status, targets_total=2), make_targets(2))
    before = snapshot()
    assert dcache.cancel_batch_job("j", now=2_000) is False
    assert snapshot() == before


def test_cancelling_twice(store: Any) -> None:
    mixed_job()
    assert dcache.cancel_batch_job("j", now=2_000) is True
    before = snapshot()
    assert dcache.cancel_batch_job("j", reason="again", now=2_001) is False
    assert snapshot() == before


def test_an_unknown_job_is_job_not_found(store: Any) -> None:
    mixed_job()
    before = snapshot()
    with pytest.raises(dcache.JobNotFound) as raised:
        dcache.cancel_batch_job("nope", now=2_000)
    assert raised.value.job_id == "nope"
    assert snapshot() == before


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"job_id": ""}, "job_id"),
        ({"job_id": 5}, "job_id"),
        ({"reason": None}, "reason"),
        ({"reason": "a\x00b"}, "reason"),
        ({"now": -1}, "now"),
        ({"now": 1.5}, "now"),
    ],
)
def test_bad_input_names_its_field(store: Any, arguments: dict[str, Any], field: str) -> None:
    mixed_job()
    before = snapshot()
    call: dict[str, Any] = {"job_id": "j", "now": 2_000, **arguments}
    with pytest.raises(dcache.InvalidBatchInput) as raised:
        dcache.cancel_batch_job(call.pop("job_id"), **call)
    assert raised.value.field == field
    assert snapshot() == before


def test_a_cancelled_job_is_not_claimed_again(store: Any) -> None:
    mixed_job()
    dcache.cancel_batch_job("j", now=2_000)
    assert dcache.claim_batch_targets(10, runner="r2", now=2_001) == []


ROUNDS = 200


@pytest.mark.slow
def test_cancel_racing_the_runners_last_write(shared_store: str) -> None:
    """A runner writes its job's last targets and finishes it while another thread cancels it: each job
    ends finished by the runner or cancelled, never both, with exact counts."""
    outcomes: list[tuple[str, Any, Any, Any]] = []
    for n in range(ROUNDS):
        job_id = f"race-{n}"
        dcache.create_batch_job(make_job(job_id, status="running", targets_total=2), make_targets(2))
        claimed = dcache.claim_batch_targets(2, runner="r", per_job=2)
        assert sorted(t.idx for t in claimed) == [0, 1]
        barrier = threading.Barrier(2)
        seen: dict[str, Any] = {}

        def runner(job_id: str = job_id, seen: dict[str, Any] = seen, barrier: Any = barrier) -> None:
            barrier.wait()
            try:
                results = [{"idx": 0, "status": "done", "result": "ok"}, {"idx": 1, "status": "failed"}]
                dcache.update_batch_targets(job_id, results, runner="r")
                seen["wrote"] = True
            except dcache.ClaimLost:
                seen["wrote"] = False
            seen["finished"] = dcache.finish_batch_job(job_id)

        def canceller(job_id: str = job_id, seen: dict[str, Any] = seen, barrier: Any = barrier) -> None:
            barrier.wait()
            seen["cancelled"] = dcache.cancel_batch_job(job_id, reason="raced")

        threads = [threading.Thread(target=runner), threading.Thread(target=canceller)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        outcomes.append((job_id, seen.get("wrote"), seen.get("finished"), seen.get("cancelled")))
    for job_id, wrote, finished, cancelled in outcomes:
        job, targets = dcache.batch_job(job_id), dcache.batch_targets(job_id)
        assert job is not None and targets is not None
        assert (finished is not None) != bool(cancelled), (job_id, wrote, finished, cancelled)
        assert job.targets_done == job.targets_total == 2
        assert all(t.runner is None or t.status == "done" or t.status == "failed" for t in targets)
        if cancelled:
            assert job.status == "cancelled"
            if wrote:  # the runner's write landed first: its results stand
                assert [(t.status, t.result, t.error) for t in targets] == [
                    ("done", "ok", None),
                    ("failed", None, None),
                ]
            else:  # the cancel came first: the write was refused whole
                assert [(t.status, t.error) for t in targets] == [("failed", "raced"), ("failed", "raced")]
        else:
            assert wrote and finished == JobStatus.PARTIAL and job.status == "partial"
            assert [(t.status, t.result) for t in targets] == [("done", "ok"), ("failed", None)]
    assert dcache.check_store().ok
