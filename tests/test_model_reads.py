"""Instances built by the store's own reads (``batch_job``, ``batch_targets``, claims, ``stale_claims``) are
Peewee instances as its reads make them: unchanged until a field is set, and then saved field by field. A
row read and left alone is one object for the collector: its set of changed fields is made when first used.
"""

from __future__ import annotations

import copy
import gc
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest
from helpers import make_job, make_targets

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, models

TARGETS = 200

#: Each read of the store that builds targets itself, on a job whose target 0 the runner "r" holds.
TARGET_READS: dict[str, Callable[[], list[BatchTarget]]] = {
    "batch_targets": lambda: dcache.batch_targets("j") or [],
    "batch_targets page": lambda: dcache.batch_targets("j", after=0, limit=TARGETS) or [],
    "claim_batch_targets": lambda: dcache.claim_batch_targets(TARGETS, runner="r", now=1_000),
    "stale_claims": lambda: dcache.stale_claims(0, runner="r", now=1_000),
}


@pytest.fixture
def job(store: Any) -> str:
    dcache.create_batch_job(make_job("j", targets_total=TARGETS), make_targets(TARGETS))
    assert len(dcache.claim_batch_targets(1, runner="r", now=1_000)) == 1
    return "j"


def tracked_parts(instance: Any) -> list[str]:
    """The instance's attributes that the collector tracks (what it must visit at each collection of the
    instance): none for a dict of text and numbers, every set, a dict holding any of them."""
    return [name for name, value in vars(instance).items() if gc.is_tracked(value)]


@pytest.mark.parametrize("read", TARGET_READS)
def test_a_target_read_and_left_alone_is_one_object_for_the_collector(job: str, read: str) -> None:
    targets = TARGET_READS[read]()
    assert targets
    assert {name for target in targets for name in tracked_parts(target)} == set()
    assert all(not gc.is_tracked(value) for target in targets for value in target.__data__.values())


def test_a_target_read_and_changed_holds_its_set_and_its_attributes_dict(job: str) -> None:
    """Its set, made at the first field set, and the dict its attributes then move to: two objects, where
    Peewee's own read holds one (its set) all along."""
    targets = TARGET_READS["batch_targets"]()
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for target in targets:
            target.hint = "checked by hand"
        made = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert made == 2 * len(targets)
    assert all(target.dirty_fields == [BatchTarget.hint] for target in targets)


def fresh_targets(count: int, model: type[BatchTarget] = BatchTarget) -> list[BatchTarget]:
    """``count`` targets of job "j" as a store's read builds them, of ``model``, without a store."""
    rows = [
        ("j", idx, "https://e.x/", "{}", "pending", None, None, None, None, None, 0) for idx in range(count)
    ]
    return model.from_rows(models.TARGET_COLUMNS, rows)


def test_threads_setting_fields_on_fresh_reads_at_once_lose_none() -> None:
    """Each first use makes the set in one step: two threads setting fields on the same fresh targets, taking
    turns as often as the interpreter allows, leave both fields in every target's set for ``save()``."""
    targets = fresh_targets(20_000)
    start = threading.Barrier(2, timeout=60)

    def set_all(field: str) -> None:
        start.wait()
        for target in targets:
            setattr(target, field, "set")

    threads = [threading.Thread(target=set_all, args=(field,)) for field in ("hint", "error")]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert not any(thread.is_alive() for thread in threads)
    lost = [target.idx for target in targets if target._dirty != {"hint", "error"}]
    assert lost == []


class LabelledTarget(BatchTarget):
    """A user's subclass with a property that reads a field it misspells, counting its runs."""

    runs = 0

    @property
    def label(self) -> str:
        LabelledTarget.runs += 1
        return f"{self.idx}: {self.hnt}"  # type: ignore[attr-defined]


def test_a_property_s_own_error_is_the_error_and_it_runs_once() -> None:
    target = cast(LabelledTarget, fresh_targets(1, LabelledTarget)[0])
    LabelledTarget.runs = 0
    with pytest.raises(AttributeError, match="'LabelledTarget' object has no attribute 'hnt'"):
        target.label  # noqa: B018
    assert LabelledTarget.runs == 1


def test_a_job_read_and_left_alone_is_one_object_for_the_collector(job: str) -> None:
    read = dcache.batch_job(job)
    assert read is not None
    assert tracked_parts(read) == []
    read.status = "cancelled"  # its set of changed fields, made now
    assert tracked_parts(read) == ["_dirty"]


@pytest.mark.parametrize("read", TARGET_READS)
def test_a_target_read_is_unchanged_until_a_field_is_set(job: str, read: str) -> None:
    target = TARGET_READS[read]()[0]
    peewee_read = BatchTarget.get((BatchTarget.job_id == job) & (BatchTarget.idx == target.idx))
    assert target.is_dirty() is False and target.dirty_fields == []
    assert target.__data__ == peewee_read.__data__
    target.hint = "checked by hand"
    assert target.is_dirty() is True and target.dirty_fields == [BatchTarget.hint]


@pytest.mark.parametrize("read", TARGET_READS)
def test_a_target_read_saves_only_the_field_set(job: str, read: str) -> None:
    target = TARGET_READS[read]()[-1]
    idx = int(target.idx)
    dcache.update_batch_target(job, idx, "done", result="kept", now=1_100)  # between the read and the save
    target.hint = "checked by hand"
    target.save()
    saved = BatchTarget.get((BatchTarget.job_id == job) & (BatchTarget.idx == idx))
    assert (saved.status, saved.result, saved.hint) == ("done", "kept", "checked by hand")
    assert target.is_dirty() is False


def test_a_job_read_saves_only_the_field_set(job: str) -> None:
    read = dcache.batch_job(job)
    assert read is not None and read.is_dirty() is False
    dcache.update_batch_target(job, 1, "done", result="abc", now=1_100)  # between the read and the save
    read.lease = 1
    read.save()
    saved = BatchJob.get_by_id(job)
    assert (saved.targets_done, saved.nbytes, saved.lease) == (1, 3, 1)


@pytest.mark.parametrize("made", [pickle.loads, copy.deepcopy], ids=["pickle", "deepcopy"])
def test_a_target_read_copies_as_it_is(job: str, made: Callable[[Any], Any]) -> None:
    original = TARGET_READS["batch_targets"]()[0]
    twin = made(pickle.dumps(original)) if made is pickle.loads else made(original)
    assert twin.__data__ == original.__data__ and twin.is_dirty() is False
    twin.hint = "only the copy"
    assert twin.dirty_fields == [BatchTarget.hint] and original.is_dirty() is False


def test_a_read_target_has_no_attribute_it_does_not_declare(job: str) -> None:
    targets = dcache.batch_targets(job)
    assert targets is not None
    target = targets[0]
    with pytest.raises(AttributeError, match="'BatchTarget' object has no attribute 'reslt'"):
        target.reslt  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(target, "reslt")
    assert target.job.id == job  # the foreign key's instance, which Peewee keeps beside the values
