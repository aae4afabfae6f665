"""A target written back to pending (into the pool) or to failed loses its claim in the same statement:
no runner, no heartbeat. Its runner's later write is ``ClaimLost`` and writes nothing, and neither
``release_claims`` nor ``stale_claims`` sees it; a done target keeps the runner that wrote it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers import make_job, make_targets, snapshot

from sift import dcache


@pytest.fixture
def claimed(store: dcache.StoreDatabase) -> Iterator[dcache.StoreDatabase]:
    """Job ``j`` of two targets, both claimed by runner ``R`` at 100."""
    dcache.create_batch_job(make_job("j", targets_total=2), make_targets(2))
    assert len(dcache.claim_batch_targets(2, runner="R", now=100)) == 2
    yield store


def claim_of(idx: int) -> tuple[Any, ...]:
    target = (dcache.batch_targets("j") or [])[idx]
    return target.status, target.runner, target.heartbeat, target.attempts


def write_one(status: str, *, many: bool, **fields: Any) -> None:
    if many:
        dcache.update_batch_targets("j", [{"idx": 0, "status": status, **fields}], runner="R", now=101)
    else:
        dcache.update_batch_target("j", 0, status, runner="R", now=101, **fields)


@pytest.mark.parametrize("many", [False, True], ids=["update_batch_target", "update_batch_targets"])
@pytest.mark.parametrize(("status", "fields"), [("pending", {}), ("failed", {"error": "gave up"})])
def test_a_runners_write_of_pending_or_failed_ends_its_claim(
    claimed: dcache.StoreDatabase, many: bool, status: str, fields: dict[str, Any]
) -> None:
    write_one(status, many=many, **fields)
    assert claim_of(0) == (status, None, None, 1)
    assert [t.idx for t in dcache.stale_claims(0, now=10**6)] == [1]  # only the target R still holds
    assert dcache.release_claims("R") == 1  # target 1; target 0 is no longer R's
    before = snapshot()
    with pytest.raises(dcache.ClaimLost):
        dcache.update_batch_target("j", 0, "done", result="late", runner="R", now=5_000)
    assert snapshot() == before
    assert dcache.check_store().ok


def test_a_target_back_in_the_pool_is_claimed_by_the_next_runner(claimed: dcache.StoreDatabase) -> None:
    write_one("pending", many=False)
    assert [(t.idx, t.runner) for t in dcache.claim_batch_targets(1, runner="S", now=102)] == [(0, "S")]
    assert claim_of(0) == ("running", "S", 102, 2)
    dcache.update_batch_target("j", 0, "done", result="ok", runner="S", now=103)
    assert claim_of(0) == ("done", "S", 102, 2)  # a done target keeps the runner that wrote it


def test_a_write_without_a_runner_ends_the_claim_too(claimed: dcache.StoreDatabase) -> None:
    dcache.update_batch_target("j", 1, "pending", now=101)  # an operator puts it back
    assert claim_of(1) == ("pending", None, None, 1)
    with pytest.raises(dcache.ClaimLost):
        dcache.update_batch_target("j", 1, "done", result="late", runner="R", now=102)
