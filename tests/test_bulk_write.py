"""update_batch_targets: many targets of one job in one transaction, each by update_batch_target's rules
(which tests/test_counting.py and tests/test_lease.py run through both entry points); one bad entry or
missing target anywhere and nothing is written."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import ListedKeys, make_job, make_targets, snapshot

from sift import dcache

#: One call's results: every kind of write, a rewrite and a move back to pending before finishing.
RESULTS: list[dict[str, Any]] = [
    {"idx": 0, "status": "running"},
    {"idx": 1, "status": "done", "result": "é" * 10},
    {"idx": 2, "status": "failed", "error": "timeout", "hint": "slow"},
    {"idx": 0, "status": "done", "result": "😀"},
    {"idx": 1, "status": "done", "result": "abc"},
    {"idx": 3, "status": "running"},
    {"idx": 3, "status": "pending"},
]


@pytest.fixture
def jobs(store: Any) -> None:
    for job_id in ("one-by-one", "bulk"):
        dcache.create_batch_job(make_job(job_id, targets_total=5), make_targets(5))


def state(job_id: str) -> tuple[Any, ...]:
    job = dcache.batch_job(job_id)
    targets = dcache.batch_targets(job_id)
    assert job is not None and targets is not None
    rows = [(t.idx, t.status, t.result, t.error, t.hint) for t in targets]
    return job.targets_done, job.nbytes, job.lease, rows


def test_a_bulk_write_leaves_what_the_same_writes_one_by_one_leave(jobs: None) -> None:
    for entry in RESULTS:
        dcache.update_batch_target("one-by-one", now=2_000, **entry)
    assert dcache.update_batch_targets("bulk", RESULTS, now=2_000) == len(RESULTS)
    assert state("bulk") == state("one-by-one")
    assert state("bulk")[:3] == (3, 4 + 3, 2_000)
    assert dcache.batch_nbytes() == 2 * 7


def test_results_may_be_any_iterable_and_may_be_empty(jobs: None) -> None:
    before = snapshot()
    assert dcache.update_batch_targets("bulk", [], now=2_000) == 0
    assert snapshot() == before
    written = dcache.update_batch_targets("bulk", (dict(e) for e in RESULTS[:2]), now=2_000)
    assert written == 2
    assert state("bulk")[:2] == (1, 20)
    assert (
        dcache.update_batch_targets("bulk", [ListedKeys(idx=4, status="done", result="xy")], now=2_000) == 1
    )
    assert state("bulk")[:2] == (2, 22)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ("done", "results[2]"),
        ((4, "done"), "results[2]"),
        ({"idx": 4, "status": "done", "body": "x"}, "results[2].body"),
        pytest.param(  # the fast lane holds at most 4,000 cases
            ListedKeys(idx=4, status="done", body="x"), "results[2].body", marks=pytest.mark.slow
        ),
        ({"status": "done"}, "results[2].idx"),
        ({"idx": 4}, "results[2].status"),
        ({"idx": -1, "status": "done"}, "results[2].idx"),
        ({"idx": 4, "status": "finished"}, "results[2].status"),
        ({"idx": 4, "status": "running", "result": "x"}, "results[2].result"),
        ({"idx": 4, "status": "done", "result": b"x"}, "results[2].result"),
        ({"idx": 4, "status": "done", "error": "a\x00b"}, "results[2].error"),
        ({"idx": 4, "status": "done", "hint": 3}, "results[2].hint"),
    ],
)
def test_a_bad_entry_anywhere_refuses_the_whole_call(jobs: None, entry: Any, field: str) -> None:
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as raised:
        dcache.update_batch_targets("bulk", [*RESULTS[:2], entry, *RESULTS[2:]], now=2_000)
    assert raised.value.field == field
    assert snapshot() == before


@pytest.mark.parametrize("results", ["done", b"x", 3, None])
def test_results_must_be_an_iterable_of_mappings(jobs: None, results: Any) -> None:
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput, match=r"^results: "):
        dcache.update_batch_targets("bulk", results, now=2_000)
    assert snapshot() == before


@pytest.mark.parametrize(
    ("job_id", "last", "error"),
    [
        ("bulk", {"idx": 9, "status": "done"}, dcache.TargetNotFound),
        ("nope", {"idx": 0, "status": "done"}, dcache.JobNotFound),
        ("bulk", {"idx": 1, "status": "pending"}, dcache.InvalidBatchInput),  # done by RESULTS[1]
    ],
)
def test_a_write_the_store_refuses_undoes_the_writes_before_it(
    jobs: None, job_id: str, last: dict[str, Any], error: type[Exception]
) -> None:
    before = snapshot()
    with pytest.raises(error):
        dcache.update_batch_targets(job_id, [*RESULTS, last], now=2_000)
    assert snapshot() == before
    assert dcache.stats()["target_writes"] == 0


def test_every_target_written_counts_once_in_stats(jobs: None) -> None:
    dcache.update_batch_targets("bulk", RESULTS, now=2_000)
    assert dcache.stats()["target_writes"] == len(RESULTS)


def test_the_bulk_write_is_reexported() -> None:
    assert "update_batch_targets" in dcache.__all__
