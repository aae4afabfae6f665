"""Pause and resume of jobs and callers: each call one transaction that says whether it changed anything;
claims take no pending target of paused work, and take it up again where it stood once resumed."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import make_job, make_targets, snapshot

from sift import dcache


def test_a_job_is_paused_once_and_resumed_once(store: Any) -> None:
    dcache.create_batch_job(make_job("j"), make_targets(3))
    assert dcache.paused_jobs() == []
    assert dcache.pause_batch_job("j", now=1_100) is True
    assert dcache.pause_batch_job("j", now=1_200) is False
    assert dcache.paused_jobs() == ["j"]
    job = dcache.batch_job("j")
    assert job is not None and (job.status, job.lease) == ("queued", 1_000)  # the lease runs on, untouched
    assert dcache.resume_batch_job("j") is True
    assert dcache.resume_batch_job("j") is False
    assert dcache.paused_jobs() == []


def test_a_finished_job_has_nothing_to_pause(store: Any) -> None:
    dcache.create_batch_job(make_job("j"), make_targets(3))
    assert dcache.cancel_batch_job("j", now=1_100)
    before = snapshot()
    assert dcache.pause_batch_job("j") is False
    assert snapshot() == before


def test_an_unknown_job_is_job_not_found(store: Any) -> None:
    before = snapshot()
    for call in (dcache.pause_batch_job, dcache.resume_batch_job):
        with pytest.raises(dcache.JobNotFound) as caught:
            call("nope")
        assert caught.value.field == "job_id"
    assert snapshot() == before


def test_callers_are_paused_before_they_send_anything(store: Any) -> None:
    assert dcache.pause_caller("bob") is True
    assert dcache.pause_caller("bob") is False
    assert dcache.pause_caller("alice") is True
    assert dcache.paused_callers() == ["alice", "bob"]
    assert dcache.resume_caller("bob") is True
    assert dcache.resume_caller("bob") is False
    assert dcache.paused_callers() == ["alice"]


@pytest.mark.parametrize(
    ("call", "args", "field"),
    [
        (dcache.pause_batch_job, (7,), "job_id"),
        (dcache.pause_batch_job, ("",), "job_id"),
        (dcache.resume_batch_job, (None,), "job_id"),
        (dcache.pause_caller, ("",), "caller"),
        (dcache.pause_caller, ("a\x00b",), "caller"),
        (dcache.resume_caller, (b"bob",), "caller"),
        (dcache.pause_caller, ("x" * 2000,), "caller"),
    ],
)
def test_bad_input_names_its_field_and_changes_nothing(store: Any, call: Any, args: Any, field: str) -> None:
    dcache.create_batch_job(make_job("j"), make_targets(3))
    dcache.pause_caller("carol")
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as caught:
        call(*args)
    assert caught.value.field == field
    assert snapshot() == before
