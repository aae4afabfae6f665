"""Targets streamed from a generator that itself reads the store are stored, on every backend: the
iterable is read in chunks before each insert statement, never while the driver holds the connection
(psycopg holds its connection's lock while it pulls rows from an iterable it is given)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from helpers import make_job, make_target, make_targets

from sift import dcache
from sift.dcache import BatchTarget, manager

#: How long a call may take before the test calls it hung: a guard only, far above any honest run.
HANG_GUARD_S = 120


def finishes(call: Callable[[], object]) -> None:
    """Run ``call`` in a thread; fail if it does not return within the guard, re-raise what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test's thread
            raised.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(HANG_GUARD_S)
    assert not worker.is_alive(), "the call never returned: it waits for the connection it holds"
    if raised:
        raise raised[0]


def reading(count: int) -> Iterator[BatchTarget]:
    """Targets whose options copy the template job's targets_total, read from the store per target."""
    for idx in range(count):
        template = dcache.batch_job("template")
        assert template is not None
        yield make_target(idx, options={"copied_from": template.id, "n": template.targets_total})


@pytest.fixture
def template(store: dcache.StoreDatabase) -> None:
    dcache.create_batch_job(make_job("template", targets_total=1), make_targets(1))


@pytest.mark.parametrize("count", [3, manager.TARGETS_PER_STATEMENT + 5])
def test_create_batch_job_with_a_generator_that_reads_the_store(template: None, count: int) -> None:
    finishes(lambda: dcache.create_batch_job(make_job("b", targets_total=count), reading(count)))
    targets = dcache.batch_targets("b")
    assert targets is not None and len(targets) == count
    assert targets[-1].options == '{"copied_from":"template","n":1}'
    assert dcache.check_store().ok


def test_put_batch_targets_with_a_generator_that_reads_the_store(template: None) -> None:
    dcache.create_batch_job(make_job("b", targets_total=3))
    finishes(lambda: dcache.put_batch_targets("b", reading(3)))
    targets = dcache.batch_targets("b")
    assert targets is not None and [t.idx for t in targets] == [0, 1, 2]


def test_submit_batch_job_with_a_generator_that_reads_the_store(template: None) -> None:
    finishes(lambda: dcache.submit_batch_job(make_job("b", targets_total=3, idem_key="k"), reading(3), 60))
    assert dcache.batch_job_by_idem("alice", "k", 60, now=1_000) == "b"


def test_a_bad_target_in_a_later_chunk_leaves_the_store_as_it_was(template: None) -> None:
    count = manager.TARGETS_PER_STATEMENT + 5

    def targets() -> Iterator[BatchTarget]:
        yield from reading(count - 1)
        yield make_target(count - 1, url="https://x/\udc80")

    with pytest.raises(dcache.InvalidBatchInput) as info:
        finishes(lambda: dcache.create_batch_job(make_job("b", targets_total=count), targets()))
    assert info.value.field == "url"
    assert dcache.batch_job("b") is None and dcache.batch_targets("b") is None
