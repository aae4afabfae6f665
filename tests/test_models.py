"""Exploring the store as a Peewee project: ``BatchTarget.job`` is a foreign key with ``job.targets``.

The schema stays the original DDL (no FOREIGN KEY constraint); the field only gives joins and accessors.
"""

from __future__ import annotations

from typing import Any

from helpers import make_job, make_targets

from sift import dcache
from sift.dcache import BatchJob, BatchTarget


def test_job_targets_and_target_job(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=3), make_targets(3))
    dcache.create_batch_job(make_job("b", targets_total=1), make_targets(1))
    job = BatchJob.get_by_id("a")
    assert [t.idx for t in job.targets.order_by(BatchTarget.idx)] == [0, 1, 2]
    target = BatchTarget.get((BatchTarget.job_id == "b") & (BatchTarget.idx == 0))
    assert target.job_id == "b"
    assert target.job.id == "b"
    assert target.job.caller == "alice"


def test_join_targets_to_their_jobs(store: Any) -> None:
    dcache.create_batch_job(make_job("a", caller="ann", targets_total=2), make_targets(2))
    dcache.create_batch_job(make_job("b", caller="bob", targets_total=1), make_targets(1))
    rows = (
        BatchTarget.select(BatchTarget.idx, BatchJob.caller)
        .join(BatchJob)
        .where(BatchJob.caller == "ann")
        .order_by(BatchTarget.idx)
        .tuples()
    )
    assert list(rows) == [(0, "ann"), (1, "ann")]


def test_store_functions_return_targets_as_peewee_reads_them(store: Any) -> None:
    """The store's own reads and claims build their targets without Peewee's row handling: each holds what
    Peewee's own read of its row does, every column by its field's name."""
    dcache.create_batch_job(make_job("a", targets_total=3), make_targets(3))
    dcache.update_batch_target("a", 2, "failed", error="gone", hint="retry later", now=1_000)
    claimed = dcache.claim_batch_targets(1, runner="r", now=1_000)
    targets = dcache.batch_targets("a")
    assert targets is not None
    assert [(t.job_id, t.idx) for t in targets] == [("a", 0), ("a", 1), ("a", 2)]
    assert targets[1].job.id == "a"
    peewee_reads = [t.__data__ for t in BatchTarget.select().order_by(BatchTarget.idx)]
    assert [t.__data__ for t in targets] == peewee_reads
    assert [t.__data__ for t in claimed] == peewee_reads[:1]
    assert all(list(t.__data__) == list(peewee_reads[0]) for t in (*targets, *claimed))  # the fields' order


def test_a_target_built_with_job_id_is_put(store: Any) -> None:
    dcache.create_batch_job(make_job("a", targets_total=1))
    dcache.put_batch_targets("a", [BatchTarget(job_id="a", idx=0, url="https://e.x/", options="{}")])
    assert BatchTarget.select().where(BatchTarget.job == "a").count() == 1


def test_create_needs_only_the_fields_a_user_gives(store: Any) -> None:
    """The model defaults what the DDL defaults (``error``, ``targets_done``, ``nbytes``) and a target's
    ``status`` (pending)."""
    BatchJob.create(
        id="a",
        caller="c",
        caller_class="fleet",
        idem_key="",
        status="queued",
        targets_total=1,
        created_at=5,
        lease=5,
    )
    BatchTarget.create(job="a", idx=0, url="https://e.x/", options={"render": False})
    job, target = BatchJob.get_by_id("a"), BatchTarget.get(BatchTarget.job_id == "a")
    assert (job.error, job.targets_done, job.nbytes) == ("", 0, 0)
    assert (target.status, target.options, target.result) == ("pending", '{"render":false}', None)
    assert dcache.check_store().ok
    assert [t.idx for t in dcache.claim_batch_targets(5)] == [0]
