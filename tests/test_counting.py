"""Rule 4: exactly-once counting of targets_done, and nbytes in UTF-8 bytes of the stored results."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import TargetWriter, create_partial, make_job, make_targets, snapshot, stored_job

from sift import dcache


def counts(job_id: str = "job-1") -> tuple[int, int]:
    job = dcache.batch_job(job_id)
    assert job is not None
    return int(job.targets_done), int(job.nbytes)


def check_invariants(job_id: str = "job-1") -> None:
    """targets_done and nbytes agree with the job's targets, recomputed in Python."""
    targets = dcache.batch_targets(job_id)
    assert targets is not None
    done = sum(1 for t in targets if t.status in ("done", "failed"))
    nbytes = sum(len(t.result.encode("utf-8")) for t in targets if t.result is not None)
    assert counts(job_id) == (done, nbytes)


def target(idx: int, job_id: str = "job-1") -> dcache.BatchTarget:
    targets = dcache.batch_targets(job_id)
    assert targets is not None
    found = [t for t in targets if t.idx == idx]
    assert len(found) == 1
    return found[0]


@pytest.fixture
def job(store: Any) -> str:
    dcache.create_batch_job(make_job("job-1", targets_total=4), make_targets(4))
    dcache.create_batch_job(make_job("other", targets_total=2), make_targets(2))
    return "job-1"


def test_first_move_into_done_counts_once(job: str, write: TargetWriter) -> None:
    write(job, 0, "running", now=1)
    assert counts() == (0, 0)
    write(job, 0, "done", result="abc", now=2)
    assert counts() == (1, 3)
    write(job, 0, "done", result="abc", now=3)
    assert counts() == (1, 3)
    write(job, 0, "failed", error="boom", now=4)
    assert counts() == (1, 0)
    write(job, 0, "failed", error="boom", now=5)
    assert counts() == (1, 0)
    write(job, 1, "failed", error="x", now=6)
    assert counts() == (2, 0)
    check_invariants()
    assert counts("other") == (0, 0)


@pytest.mark.parametrize("first", ["done", "failed"])
@pytest.mark.parametrize("second", ["done", "failed"])
def test_rewriting_a_finished_target_adds_nothing(
    job: str, first: str, second: str, write: TargetWriter
) -> None:
    write(job, 2, first, now=1)
    write(job, 2, second, now=2)
    write(job, 2, second, now=3)
    assert counts() == (1, 0)
    check_invariants()


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("", 0),
        ("a", 1),
        ("é", 2),
        ("€", 3),
        ("😀", 4),
        ("aé€😀", 10),
        ("a\x01b", 3),
        ("\x01" * 5, 5),
        ("日本語", 9),
        ('{"body":"ü"}', 13),
    ],
)
def test_nbytes_counts_utf8_bytes(job: str, text: str, size: int, write: TargetWriter) -> None:
    write(job, 0, "done", result=text, now=1)
    assert counts() == (1, size)
    assert target(0).result == text
    assert dcache.batch_nbytes() == size


@pytest.mark.parametrize(
    ("old", "new"),
    [("abc", "ééé"), ("ééé", "abc"), ("😀😀", ""), ("", "😀"), ("a\x01b", "a"), ("x", "x")],
)
def test_replacing_a_result_changes_nbytes_by_the_difference(
    job: str, old: str, new: str, write: TargetWriter
) -> None:
    write(job, 1, "done", result="1234567", now=1)
    write(job, 0, "done", result=old, now=2)
    assert counts() == (2, 7 + len(old.encode()))
    write(job, 0, "done", result=new, now=3)
    assert counts() == (2, 7 + len(new.encode()))
    assert target(0).result == new
    check_invariants()


def test_result_replaced_by_none_frees_its_bytes(job: str, write: TargetWriter) -> None:
    write(job, 0, "done", result="€€", now=1)
    write(job, 0, "failed", error="later failure", hint="retry", now=2)
    assert counts() == (1, 0)
    t = target(0)
    assert (t.status, t.result, t.error, t.hint) == ("failed", None, "later failure", "retry")
    write(job, 0, "done", result="ok", now=3)
    t = target(0)
    assert (t.status, t.result, t.error, t.hint) == ("done", "ok", None, None)
    assert counts() == (1, 2)


def test_result_error_and_hint_are_written_as_given(job: str, write: TargetWriter) -> None:
    write(job, 3, "failed", result="partial €", error="timeout", hint="slow", now=1)
    t = target(3)
    assert (t.status, t.result, t.error, t.hint) == ("failed", "partial €", "timeout", "slow")
    assert counts() == (1, 11)
    write(job, 3, "done", result="", error="", hint="", now=2)
    t = target(3)
    assert (t.status, t.result, t.error, t.hint) == ("done", "", "", "")
    assert counts() == (1, 0)


@pytest.mark.parametrize("finished", ["done", "failed"])
@pytest.mark.parametrize("back", ["pending", "running"])
def test_finished_target_cannot_go_back(job: str, finished: str, back: str, write: TargetWriter) -> None:
    write(job, 0, finished, result="abc", now=1)
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput, match=r"^status"):
        write(job, 0, back, now=2)
    assert snapshot() == before
    assert counts() == (1, 3)
    assert target(0).status == finished


@pytest.mark.parametrize("status", ["pending", "running"])
@pytest.mark.parametrize("field", ["result", "error", "hint"])
def test_result_error_hint_only_with_done_or_failed(
    job: str, status: str, field: str, write: TargetWriter
) -> None:
    write(job, 1, "running", now=1)
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput, match=rf"^(results\[0\]\.)?{field}"):
        write(job, 1, status, now=2, **{field: "x"})
    with pytest.raises(dcache.InvalidBatchInput, match=rf"^(results\[0\]\.)?{field}"):
        write(job, 0, status, now=2, **{field: ""})
    assert snapshot() == before


def test_pending_and_running_move_freely_before_finishing(job: str, write: TargetWriter) -> None:
    for status in ("running", "pending", "running", "running", "pending"):
        write(job, 0, status, now=1)
        assert target(0).status == status
        assert counts() == (0, 0)


def test_batch_targets_in_idx_order_when_put_out_of_order(store: Any) -> None:
    create_partial(make_job("job-1", targets_total=10), make_targets(1, start=7) + make_targets(1, start=3))
    dcache.put_batch_targets("job-1", [make_targets(1, start=i)[0] for i in (9, 0, 5)])
    dcache.put_batch_targets("job-1", [make_targets(1, start=i)[0] for i in (8, 1, 6, 2, 4)])
    targets = dcache.batch_targets("job-1")
    assert targets is not None
    assert [t.idx for t in targets] == list(range(10))
    assert [t.url for t in targets] == [f"https://example.com/{i}" for i in range(10)]
    assert all(t.job_id == "job-1" and t.status == "pending" for t in targets)


def test_batch_targets_of_a_job_without_targets_is_empty(store: Any) -> None:
    dcache.create_batch_job(make_job("job-1"))
    assert dcache.batch_targets("job-1") == []


def test_many_targets_mixed_writes_keep_the_invariants(job: str, write: TargetWriter) -> None:
    writes: list[tuple[int, str, str | None]] = [
        (0, "running", None),
        (0, "done", "é" * 10),
        (1, "failed", None),
        (2, "done", "😀"),
        (1, "done", "abc"),
        (0, "done", "x"),
        (2, "failed", "€"),
        (3, "running", None),
    ]
    for now, (idx, status, result) in enumerate(writes):
        write(job, idx, status, result=result, now=now)
        check_invariants()
    assert counts() == (3, 1 + 3 + 3)
    assert dcache.batch_nbytes() == 7
    check_invariants("other")


def test_counts_are_per_job(store: Any, write: TargetWriter) -> None:
    for job_id in ("a", "b"):
        dcache.create_batch_job(make_job(job_id, targets_total=2), make_targets(2))
    write("a", 0, "done", result="12345", now=1)
    write("b", 1, "done", result="€", now=1)
    write("b", 0, "failed", now=1)
    assert counts("a") == (1, 5)
    assert counts("b") == (2, 3)
    assert dcache.batch_nbytes() == 8


def test_counts_no_target_backs_are_moved_by_each_write(store: Any, write: TargetWriter) -> None:
    """Counts a damaged or restored store holds without targets behind them (create refuses them; set here
    by SQL): later writes move them by their delta, never recount them."""
    stored_job(make_job("job-1", targets_total=5), targets_done=2, nbytes=100)
    dcache.put_batch_targets("job-1", make_targets(3))
    assert counts() == (2, 100)
    write("job-1", 0, "done", result="abc", now=1)
    assert counts() == (3, 103)
    assert dcache.batch_nbytes() == 103
