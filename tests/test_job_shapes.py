"""A job's shape: it comes with all its targets, or its targets follow in ``put_batch_targets`` calls.

``submit_batch_job`` refuses an empty iterable of targets and a ``targets_total`` that disagrees with the
targets given; ``create_batch_job`` with targets refuses a disagreeing total (both ``InvalidBatchInput``,
nothing written). Either without targets (None), then ``put_batch_targets``, stays allowed; ``check_store``
reports a job still short of its targets ``MISSING_TARGETS_GRACE`` seconds after its ``created_at``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import make_job, make_target, make_targets, snapshot

from sift import dcache
from sift.dcache import clock, db
from sift.dcache.integrity import MISSING_TARGETS_GRACE

NOW = 1_000_000


@pytest.fixture
def fixed_clock() -> Iterator[None]:
    previous = clock.set_test_clock(lambda: NOW)
    yield
    clock.set_test_clock(previous)


def assert_refused(call: Callable[[], Any], field: str) -> None:
    before, nbytes = snapshot(), dcache.batch_nbytes()
    with pytest.raises(dcache.InvalidBatchInput) as info:
        call()
    assert info.value.field == field, str(info.value)
    assert snapshot() == before
    assert dcache.batch_nbytes() == nbytes


def some_job(**fields: Any) -> dcache.BatchJob:
    return make_job("new", **{"idem_key": "k", **fields})


def generated(count: int) -> Iterator[dcache.BatchTarget]:
    yield from make_targets(count)


REFUSED: dict[str, tuple[Callable[[], Any], str]] = {
    "submit-empty-list": (lambda: dcache.submit_batch_job(some_job(), [], 60), "targets"),
    "submit-empty-list-total-0": (
        lambda: dcache.submit_batch_job(some_job(targets_total=0), [], 60),
        "targets",
    ),
    "submit-empty-generator": (lambda: dcache.submit_batch_job(some_job(), generated(0), 60), "targets"),
    "submit-fewer": (lambda: dcache.submit_batch_job(some_job(), make_targets(2), 60), "targets_total"),
    "submit-fewer-generator": (
        lambda: dcache.submit_batch_job(some_job(), generated(2), 60),
        "targets_total",
    ),
    "submit-gap": (
        lambda: dcache.submit_batch_job(some_job(), [make_target(0), make_target(2)], 60),
        "targets_total",
    ),
    "create-fewer": (lambda: dcache.create_batch_job(some_job(), make_targets(2)), "targets_total"),
    "create-empty-list": (lambda: dcache.create_batch_job(some_job(), []), "targets_total"),
    "create-fewer-generator": (lambda: dcache.create_batch_job(some_job(), generated(1)), "targets_total"),
    # More targets than the total: the first idx past it is named.
    "create-more": (lambda: dcache.create_batch_job(some_job(targets_total=1), make_targets(2)), "idx"),
    "submit-more": (lambda: dcache.submit_batch_job(some_job(targets_total=1), make_targets(2), 60), "idx"),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_a_job_of_the_wrong_shape_is_refused(store: Any, case: str) -> None:
    dcache.create_batch_job(make_job("job-1", targets_total=1), make_targets(1))
    call, field = REFUSED[case]
    assert_refused(call, field)


@pytest.mark.parametrize("how", ["list", "generator"])
def test_a_whole_job_is_submitted_and_created(store: Any, how: str) -> None:
    targets = make_targets(3) if how == "list" else generated(3)
    assert dcache.submit_batch_job(some_job(), targets, 60, now=1_000) == ("new", True)
    dcache.create_batch_job(make_job("other"), make_targets(3) if how == "list" else generated(3))
    assert dcache.check_store().ok


def test_a_resubmit_that_finds_its_job_reads_no_targets(store: Any) -> None:
    """The idempotent hit writes nothing and does not read ``targets``: an empty list returns the job."""
    dcache.submit_batch_job(some_job(), make_targets(3), 60, now=1_000)
    before = snapshot()
    assert dcache.submit_batch_job(some_job(id="again"), [], 60, now=1_000) == ("new", False)
    assert snapshot() == before


@pytest.mark.parametrize("first", ["create", "submit"])
def test_the_two_call_path_stays_allowed(store: Any, fixed_clock: None, first: str) -> None:
    """A job without targets (None), then its targets in ``put_batch_targets`` calls."""
    job = make_job("job-1", targets_total=3, created_at=NOW, lease=NOW, idem_key="k")
    if first == "create":
        dcache.create_batch_job(job)
    else:
        assert dcache.submit_batch_job(job, None, 60) == ("job-1", True)
    dcache.put_batch_targets("job-1", [make_target(0)])
    dcache.put_batch_targets("job-1", [make_target(2), make_target(1)])
    assert [t.idx for t in dcache.batch_targets("job-1") or []] == [0, 1, 2]
    assert dcache.check_store().ok


@pytest.mark.parametrize(
    "age,reported",
    [(0, False), (MISSING_TARGETS_GRACE - 1, False), (MISSING_TARGETS_GRACE, True), (10**6, True)],
    ids=["new", "within-grace", "at-grace", "old"],
)
@pytest.mark.parametrize("stored", [0, 2])
def test_check_reports_a_job_short_of_its_targets_past_the_grace_period(
    store: Any, fixed_clock: None, age: int, reported: bool, stored: int
) -> None:
    created = NOW - age
    dcache.create_batch_job(make_job("short", targets_total=3, created_at=created, lease=created))
    dcache.put_batch_targets("short", make_targets(stored))
    dcache.create_batch_job(make_job("whole", targets_total=3, created_at=0, lease=0), make_targets(3))
    report = dcache.check_store()
    found = [(v.kind, v.job_id) for v in report.violations]
    assert found == ([("missing_targets", "short")] if reported else [])
    if reported:
        assert f"holds {stored} of its 3 targets" in report.violations[0].detail
        repaired = dcache.check_store(repair=True)
        assert repaired.repairs == []  # a person decides: put the rest, or delete the job
        assert dcache.check_store().violations == report.violations


@pytest.mark.sqlite_only
def test_check_reports_targets_whose_options_are_not_json(store: Any, fixed_clock: None) -> None:
    """Only another program can write them (PostgreSQL's json column cannot hold them at all)."""
    dcache.create_batch_job(make_job("job-1", targets_total=3), make_targets(3))
    db.execute_sql("UPDATE batch_target SET options = '{''render'': False}' WHERE idx > 0")
    report = dcache.check_store()
    assert [(v.kind, v.job_id, v.detail) for v in report.violations] == [
        ("target_options", "job-1", "2 targets whose options are not valid JSON")
    ]
    assert dcache.check_store(repair=True).repairs == []


@pytest.mark.postgres
def test_postgres_json_column_holds_only_json(pg_target: str) -> None:
    dcache.open_db(pg_target)
    try:
        dcache.create_batch_job(make_job("job-1", targets_total=1), make_targets(1))
        with pytest.raises(dcache.BatchError):
            db.execute_sql("UPDATE batch_target SET options = '{''render'': False}'")
        assert dcache.check_store().ok
    finally:
        dcache.close_db()
