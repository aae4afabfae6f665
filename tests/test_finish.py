"""finish_batch_job: a live job whose every target is final ends done, partial or failed, in one
transaction; anything else is left alone. On every backend."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import make_job, make_targets, snapshot

from sift import dcache


def _job_with(statuses: list[str], *, job_status: str = "running") -> None:
    dcache.create_batch_job(
        make_job("j", status=job_status, targets_total=len(statuses)), make_targets(len(statuses))
    )
    for idx, status in enumerate(statuses):
        fields = {"done": {"result": "r"}, "failed": {"error": "boom"}}.get(status, {})
        if status != "pending":
            dcache.update_batch_target("j", idx, status, now=1_500, **fields)


@pytest.mark.parametrize(
    ("targets", "ends"),
    [
        (["done", "done", "done"], "done"),
        (["done", "failed", "done"], "partial"),
        (["failed", "failed", "failed"], "failed"),
        (["failed"], "failed"),
        ([], "done"),  # no target: nothing failed
    ],
)
@pytest.mark.parametrize("job_status", ["queued", "running"])
def test_a_complete_live_job_ends_by_its_targets(
    store: Any, targets: list[str], ends: str, job_status: str
) -> None:
    _job_with(targets, job_status=job_status)
    assert dcache.finish_batch_job("j", now=3_000) == ends
    job = dcache.batch_job("j")
    assert job is not None and (job.status, job.lease) == (ends, 3_000)
    assert dcache.finish_batch_job("j", now=4_000) is None  # once: a finished job is left alone
    assert dcache.batch_job("j").lease == 3_000  # type: ignore[union-attr]


@pytest.mark.parametrize("targets", [["done", "pending"], ["running", "done"], ["pending"]])
def test_a_job_with_work_left_is_left_alone(store: Any, targets: list[str]) -> None:
    _job_with(targets)
    before = snapshot()
    assert dcache.finish_batch_job("j", now=3_000) is None
    assert snapshot() == before


@pytest.mark.parametrize("job_status", ["done", "partial", "failed", "cancelled"])
def test_a_finished_job_keeps_its_status(store: Any, job_status: str) -> None:
    _job_with(["done", "failed"], job_status=job_status)
    before = snapshot()
    assert dcache.finish_batch_job("j", now=3_000) is None
    assert snapshot() == before


def test_no_such_job_is_job_not_found_and_bad_input_names_the_field(store: Any) -> None:
    _job_with(["done"])
    before = snapshot()
    with pytest.raises(dcache.JobNotFound):
        dcache.finish_batch_job("nope")
    with pytest.raises(dcache.InvalidBatchInput) as info:
        dcache.finish_batch_job("")
    assert info.value.field == "job_id"
    with pytest.raises(dcache.InvalidBatchInput) as info:
        dcache.finish_batch_job("j", now=-1)
    assert info.value.field == "now"
    assert snapshot() == before
