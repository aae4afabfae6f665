"""Every Peewee write through ``BatchJob`` and ``BatchTarget``, written as a user writes it in a shell, on
every backend: it keeps ``targets_done``, ``nbytes``, the byte total and the lease as the store's functions
would, or it is refused with a package error naming what to call instead, every table as it was.

The table "Writing through the models" of docs/explanation/database.md lists the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import peewee
import pytest
from freezegun import freeze_time
from helpers import make_job, make_target, make_targets, snapshot

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, db, models, modelwrites

NOW = 2_000_000_000  # the clock while a write runs: a lease the write moves becomes this
J, T = BatchJob, BatchTarget


@pytest.fixture
def jobs(store: dcache.StoreDatabase) -> Iterator[dcache.StoreDatabase]:
    """Job ``j``: target 0 done with ``abc``, 1 and 2 pending. Job ``k``: target 0 done with ``héllo``,
    1 failed. Job ``p``: target 0 of its 2 (the two-call path, target 1 still to come), created now."""
    dcache.create_batch_job(make_job("j", targets_total=3), make_targets(3))
    dcache.update_batch_target("j", 0, "done", result="abc", now=1_000)
    dcache.create_batch_job(make_job("k", targets_total=2, status="done"), make_targets(2))
    dcache.update_batch_target("k", 0, "done", result="héllo", now=1_000)
    dcache.update_batch_target("k", 1, "failed", error="timeout", now=1_000)
    dcache.create_batch_job(make_job("p", targets_total=2, created_at=NOW, lease=NOW))
    dcache.put_batch_targets("p", [make_target(0)])
    with freeze_time("2033-05-18 03:33:20"):  # NOW
        assert dcache.unix_now() == NOW
        yield store


def target(job_id: str, idx: int) -> Any:
    return T.get((T.job_id == job_id) & (T.idx == idx))


def new_job(job_id: str, **fields: Any) -> dict[str, Any]:
    """The fields a user gives to create a job (the model defaults the rest)."""
    values = {"id": job_id, "caller": "bob", "caller_class": "fleet", "idem_key": "", "status": "queued"}
    return {**values, "targets_total": 1, "created_at": NOW, "lease": NOW, **fields}


def new_target(idx: int = 1, **fields: Any) -> dict[str, Any]:
    """Target ``idx`` of job ``p``, as a user gives it."""
    return {"job": "p", "idx": idx, "url": f"https://example.com/{idx}", "options": {"a": 1}, **fields}


def assert_counts_exact() -> None:
    """Each job's targets_done and nbytes follow its targets, the byte total the jobs, and check_store
    finds nothing."""
    for job in J.select():
        targets = list(T.select().where(T.job_id == job.id))
        assert job.targets_done == sum(t.status in ("done", "failed") for t in targets), job.id
        assert job.nbytes == sum(len((t.result or "").encode()) for t in targets), job.id
    assert dcache.batch_nbytes() == sum(job.nbytes for job in J.select())
    assert T.select().where(T.job_id.not_in(J.select(J.id))).count() == 0
    report = dcache.check_store()
    assert report.ok, report


def job_row(job_id: str) -> tuple[Any, ...]:
    job = J.get_by_id(job_id)
    return (job.status, job.error, job.targets_done, job.nbytes, job.lease)


def save_changed(get: Callable[[], Any], **changes: Any) -> Callable[[], Any]:
    """Read an instance, set ``changes`` on it, ``save()`` it: what a shell user types."""

    def write() -> Any:
        instance = get()
        for name, value in changes.items():
            setattr(instance, name, value)
        return instance.save()

    return write


def _bulk_update_error() -> Any:
    found = list(J.select().where(J.id.in_(["j", "k"])).order_by(J.id))
    for job in found:
        job.error = f"checked {job.id}"
    return J.bulk_update(found, fields=[J.error])  # type: ignore[no-untyped-call]


def both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def check() -> None:
        first()
        second()

    return check


def assert_equal(got: Any, expected: Any) -> None:
    assert got == expected


def assert_job(job_id: str, expected: tuple[Any, ...]) -> None:
    assert job_row(job_id) == expected


def assert_target(job_id: str, idx: int, expected: tuple[Any, ...]) -> None:
    found = target(job_id, idx)
    assert (found.status, found.result, found.options) == expected


def assert_gone(job_id: str) -> None:
    assert J.select().where(J.id == job_id).count() == 0
    assert T.select().where(T.job_id == job_id).count() == 0
    assert J.select().count() == 2  # the others stay, with their targets
    assert T.select().count() == 4


#: operation -> (the write, what it changed, checked after it)
ALLOWED: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "BatchJob.create": (
        lambda: J.create(**new_job("n")),
        lambda: assert_job("n", ("queued", "", 0, 0, NOW)),
    ),
    "BatchJob(...).save()": (
        lambda: J(**new_job("n")).save(),
        lambda: assert_job("n", ("queued", "", 0, 0, NOW)),
    ),
    "BatchJob.insert": (
        lambda: J.insert(**new_job("n")).execute(),
        lambda: assert_job("n", ("queued", "", 0, 0, NOW)),
    ),
    "BatchJob.insert_many": (
        lambda: J.insert_many([new_job("n"), new_job("m", lease=5)]).execute(),
        both(
            lambda: assert_job("n", ("queued", "", 0, 0, NOW)),
            lambda: assert_job("m", ("queued", "", 0, 0, 5)),
        ),
    ),
    "BatchJob.insert_many(tuples, fields)": (
        lambda: J.insert_many([tuple(new_job("n").values())], fields=list(new_job("n"))).execute(),
        lambda: assert_job("n", ("queued", "", 0, 0, NOW)),
    ),
    "BatchJob.bulk_create": (
        lambda: J.bulk_create([J(**new_job("n")), J(**new_job("m"))]),
        both(
            lambda: assert_job("n", ("queued", "", 0, 0, NOW)),
            lambda: assert_job("m", ("queued", "", 0, 0, NOW)),
        ),
    ),
    "BatchJob.update(status)": (
        lambda: J.update(status="cancelled").where(J.id == "j").execute(),
        lambda: assert_job("j", ("cancelled", "", 1, 3, NOW)),
    ),
    "BatchJob.update(status, lease)": (
        lambda: J.update(status="cancelled", lease=7).where(J.id == "j").execute(),
        lambda: assert_job("j", ("cancelled", "", 1, 3, 7)),
    ),
    "BatchJob.update(lease expression)": (
        lambda: J.update(lease=J.lease + 60).where(J.id == "j").execute(),
        lambda: assert_job("j", ("queued", "", 1, 3, 1_060)),
    ),
    "BatchJob.update(caller)": (
        lambda: J.update(caller="carol").execute(),
        both(
            lambda: assert_job("j", ("queued", "", 1, 3, 1_000)),
            lambda: assert_equal(J.get_by_id("k").caller, "carol"),
        ),
    ),
    "job.save() of status and error": (
        save_changed(lambda: J.get_by_id("j"), status="failed", error="by hand"),
        lambda: assert_job("j", ("failed", "by hand", 1, 3, NOW)),
    ),
    "job.save() of the lease": (
        save_changed(lambda: J.get_by_id("j"), lease=5),
        lambda: assert_job("j", ("queued", "", 1, 3, 5)),
    ),
    "BatchJob.bulk_update(error)": (
        _bulk_update_error,
        both(
            lambda: assert_job("j", ("queued", "checked j", 1, 3, NOW)),
            lambda: assert_job("k", ("done", "checked k", 2, 6, NOW)),
        ),
    ),
    "job.delete_instance()": (
        lambda: J.get_by_id("k").delete_instance(),
        lambda: assert_gone("k"),
    ),
    "job.delete_instance(recursive=True)": (
        lambda: J.get_by_id("k").delete_instance(recursive=True),
        lambda: assert_gone("k"),
    ),
    "BatchJob.delete().where()": (
        lambda: J.delete().where(J.status == "done").execute(),
        lambda: assert_gone("k"),
    ),
    "BatchJob.delete().order_by().limit()": (
        lambda: J.delete().order_by(J.lease.desc(), J.id).limit(1).execute(),
        lambda: assert_equal(sorted(j.id for j in J.select()), ["j", "k"]),
    ),
    "BatchJob.delete_by_id": (
        lambda: J.delete_by_id("k"),  # type: ignore[no-untyped-call]
        lambda: assert_gone("k"),
    ),
    "BatchTarget.create": (
        lambda: T.create(**new_target()),
        lambda: assert_target("p", 1, ("pending", None, '{"a":1}')),
    ),
    "BatchTarget(...).save()": (
        lambda: T(**new_target()).save(),
        lambda: assert_target("p", 1, ("pending", None, '{"a":1}')),
    ),
    "BatchTarget(job_id=...).save()": (
        lambda: T(job_id="p", idx=1, url="https://e.x/", options="[]").save(),
        lambda: assert_target("p", 1, ("pending", None, "[]")),
    ),
    "BatchTarget.insert": (
        lambda: T.insert(**new_target()).execute(),
        lambda: assert_target("p", 1, ("pending", None, '{"a":1}')),
    ),
    "BatchTarget.insert_many": (
        lambda: T.insert_many([new_target()]).execute(),
        lambda: assert_target("p", 1, ("pending", None, '{"a":1}')),
    ),
    "BatchTarget.bulk_create": (
        lambda: T.bulk_create([T(**new_target())]),
        lambda: assert_target("p", 1, ("pending", None, '{"a":1}')),
    ),
    "target.save() of a result": (
        save_changed(lambda: target("j", 0), result="abcdef"),
        both(
            lambda: assert_target("j", 0, ("done", "abcdef", '{"render":false}')),
            lambda: assert_job("j", ("queued", "", 1, 6, NOW)),
        ),
    ),
    "target.save() of a finish": (
        save_changed(lambda: target("j", 1), status="done", result="xy"),
        both(
            lambda: assert_target("j", 1, ("done", "xy", '{"render":false}')),
            lambda: assert_job("j", ("queued", "", 2, 5, NOW)),
        ),
    ),
    "target.save() of a claim": (
        save_changed(lambda: target("j", 1), status="running"),
        both(
            lambda: assert_target("j", 1, ("running", None, '{"render":false}')),
            lambda: assert_job("j", ("queued", "", 1, 3, NOW)),
        ),
    ),
    "target.save() of a failure over a result": (
        save_changed(lambda: target("k", 0), status="failed", result=None, error="gone"),
        lambda: assert_job("k", ("done", "", 2, 0, NOW)),
    ),
    "target.save() of its options": (
        save_changed(lambda: target("j", 2), options=[1]),
        both(
            lambda: assert_target("j", 2, ("pending", None, "[1]")),
            lambda: assert_job("j", ("queued", "", 1, 3, 1_000)),
        ),
    ),
    "BatchTarget.update(url)": (
        lambda: T.update(url="https://moved/").where(T.status == "pending").execute(),
        lambda: assert_equal(target("j", 1).url, "https://moved/"),
    ),
}


@pytest.mark.parametrize("operation", list(ALLOWED))
def test_a_write_the_rules_allow_keeps_the_counts_exact(jobs: Any, operation: str) -> None:
    write, check = ALLOWED[operation]
    write()
    check()
    assert_counts_exact()


#: operation -> (the write, the exception, its field, a function the message names)
REFUSED: dict[str, tuple[Callable[[], Any], type[Exception], str, str]] = {
    "BatchJob.update(targets_done)": (
        lambda: J.update(targets_done=3).where(J.id == "j").execute(),
        dcache.ModelWriteRefused,
        "targets_done",
        "update_batch_target",
    ),
    "BatchJob.update(nbytes)": (
        lambda: J.update(nbytes=J.nbytes + 1).execute(),
        dcache.ModelWriteRefused,
        "nbytes",
        "update_batch_target",
    ),
    "BatchJob.update(targets_total)": (
        lambda: J.update(targets_total=9).execute(),
        dcache.ModelWriteRefused,
        "targets_total",
        "create_batch_job",
    ),
    "BatchJob.update(id)": (
        lambda: J.update(id="z").where(J.id == "j").execute(),
        dcache.ModelWriteRefused,
        "id",
        "create_batch_job",
    ),
    "BatchJob.update(status expression)": (
        lambda: J.update(status=peewee.Case(None, [(J.id == "j", "done")], "failed")).execute(),
        dcache.ModelWriteRefused,
        "status",
        "set_batch_job_status",
    ),
    "BatchJob.update(status unknown)": (
        lambda: J.update(status="finished").execute(),
        dcache.InvalidBatchInput,
        "status",
        "",
    ),
    "job.save() of targets_done": (
        save_changed(lambda: J.get_by_id("j"), targets_done=0),
        dcache.ModelWriteRefused,
        "targets_done",
        "update_batch_target",
    ),
    "job.save() of nbytes": (
        save_changed(lambda: J.get_by_id("j"), nbytes=0),
        dcache.ModelWriteRefused,
        "nbytes",
        "update_batch_target",
    ),
    "BatchJob.bulk_update(nbytes)": (
        lambda: J.bulk_update(list(J.select()), fields=["nbytes"]),  # type: ignore[no-untyped-call]
        dcache.ModelWriteRefused,
        "nbytes",
        "update_batch_target",
    ),
    "BatchJob.replace": (
        lambda: J.replace(**new_job("j")).execute(),  # type: ignore[no-untyped-call]
        dcache.ModelWriteRefused,
        "query",
        "create_batch_job",
    ),
    "BatchJob.replace_many": (
        lambda: J.replace_many([new_job("n")]).execute(),  # type: ignore[no-untyped-call]
        dcache.ModelWriteRefused,
        "query",
        "create_batch_job",
    ),
    "BatchJob.insert().on_conflict_ignore()": (
        lambda: J.insert(**new_job("n")).on_conflict_ignore().execute(),
        dcache.ModelWriteRefused,
        "query",
        "create_batch_job",
    ),
    "BatchJob.insert_from": (
        lambda: J.insert_from(
            J.select().where(J.id == "none"), fields=list(J._meta.sorted_field_names)
        ).execute(),
        dcache.ModelWriteRefused,
        "query",
        "create_batch_job",
    ),
    "BatchJob.insert(expression)": (
        lambda: J.insert(**new_job("n", lease=peewee.SQL("5"))).execute(),
        dcache.ModelWriteRefused,
        "lease",
        "create_batch_job",
    ),
    "BatchJob.create of an existing id": (
        lambda: J.create(**new_job("j")),
        dcache.DuplicateJob,
        "id",
        "",
    ),
    "BatchJob.insert_many, one bad row": (
        lambda: J.insert_many([new_job("n"), new_job("m", caller_class="vip")]).execute(),
        dcache.InvalidBatchInput,
        "caller_class",
        "",
    ),
    "BatchTarget.update(status)": (
        lambda: T.update(status="done").where(T.job_id == "j").execute(),
        dcache.ModelWriteRefused,
        "status",
        "update_batch_target",
    ),
    "BatchTarget.update(result)": (
        lambda: T.update(result="x").execute(),
        dcache.ModelWriteRefused,
        "result",
        "update_batch_target",
    ),
    "BatchTarget.update(idx)": (
        lambda: T.update(idx=T.idx + 10).execute(),
        dcache.ModelWriteRefused,
        "idx",
        "",
    ),
    "BatchTarget.update(job)": (
        lambda: T.update(job="k").where(T.job_id == "p").execute(),
        dcache.ModelWriteRefused,
        "job",
        "",
    ),
    "BatchTarget.update(url empty)": (
        lambda: T.update(url="").execute(),
        dcache.InvalidBatchInput,
        "url",
        "",
    ),
    "BatchTarget.delete()": (
        lambda: T.delete().where(T.job_id == "k").execute(),
        dcache.ModelWriteRefused,
        "query",
        "BatchJob.delete_instance()",
    ),
    "target.delete_instance()": (
        lambda: target("j", 0).delete_instance(),
        dcache.ModelWriteRefused,
        "query",
        "sweep_batch",
    ),
    "BatchTarget.replace": (
        lambda: T.replace(**new_target(0)).execute(),  # type: ignore[no-untyped-call]
        dcache.ModelWriteRefused,
        "query",
        "put_batch_targets",
    ),
    "BatchTarget.insert of a done target": (
        lambda: T.insert(**new_target(status="done", result="x")).execute(),
        dcache.InvalidBatchInput,
        "status",
        "",
    ),
    "BatchTarget.insert_many past targets_total": (
        lambda: T.insert_many([new_target(1), new_target(2)]).execute(),
        dcache.InvalidBatchInput,
        "idx",
        "",
    ),
    "BatchTarget.create of a stored target": (
        lambda: T.create(**new_target(0)),
        dcache.InvalidBatchInput,
        "idx",
        "",
    ),
    "BatchTarget.create for no job": (
        lambda: T.create(**new_target(0, job="none")),
        dcache.JobNotFound,
        "job_id",
        "",
    ),
    "target.save(): done back to pending": (
        save_changed(lambda: target("j", 0), status="pending"),
        dcache.InvalidBatchInput,
        "status",
        "",
    ),
    "target.save(): failed back to running": (
        save_changed(lambda: target("k", 1), status="running"),
        dcache.InvalidBatchInput,
        "status",
        "",
    ),
    "target.save(): a result while pending": (
        save_changed(lambda: target("j", 1), result="early"),
        dcache.InvalidBatchInput,
        "result",
        "",
    ),
    "target.save() of its idx": (
        save_changed(lambda: target("j", 1), idx=7),
        dcache.ModelWriteRefused,
        "idx",
        "",
    ),
    "BatchTarget.update(runner)": (
        lambda: T.update(runner="forged").where(T.job_id == "j").execute(),
        dcache.ModelWriteRefused,
        "runner",
        "claim_batch_targets",
    ),
    "BatchTarget.update(heartbeat)": (
        lambda: T.update(heartbeat=NOW).execute(),
        dcache.ModelWriteRefused,
        "heartbeat",
        "renew_claims",
    ),
    "BatchTarget.update(attempts)": (
        lambda: T.update(attempts=T.attempts + 1).execute(),
        dcache.ModelWriteRefused,
        "attempts",
        "requeue_stale_claims",
    ),
    "target.save() of its runner": (
        save_changed(lambda: target("j", 1), runner="forged"),
        dcache.ModelWriteRefused,
        "runner",
        "release_claims",
    ),
    "target.save() of its heartbeat and status": (
        save_changed(lambda: target("j", 1), heartbeat=NOW, status="running"),
        dcache.ModelWriteRefused,
        "heartbeat",
        "renew_claims",
    ),
    "target.save() of its attempts": (
        save_changed(lambda: target("j", 1), attempts=0),
        dcache.ModelWriteRefused,
        "attempts",
        "claim_batch_targets",
    ),
    "BatchTarget.insert of a claimed target": (
        lambda: T.insert(**new_target(heartbeat=NOW)).execute(),
        dcache.ModelWriteRefused,
        "heartbeat",
        "renew_claims",
    ),
    "BatchTarget.create with attempts": (
        lambda: T.create(**new_target(attempts=2)),
        dcache.ModelWriteRefused,
        "attempts",
        "claim_batch_targets",
    ),
    "BatchTarget.bulk_create with a runner": (
        lambda: T.bulk_create([T(**new_target(runner="forged"))]),
        dcache.ModelWriteRefused,
        "runner",
        "claim_batch_targets",
    ),
    "target.save() of options not JSON": (
        save_changed(lambda: target("j", 1), options="{'a': 1}"),
        dcache.InvalidBatchInput,
        "options",
        "",
    ),
}


@pytest.mark.parametrize("operation", list(REFUSED))
def test_a_write_the_rules_forbid_is_refused_and_changes_nothing(jobs: Any, operation: str) -> None:
    write, error, field, instead = REFUSED[operation]
    before = snapshot()
    with pytest.raises(error) as info:
        write()
    assert isinstance(info.value, dcache.BatchError)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert instead in str(info.value)
    assert snapshot() == before


def test_every_peewee_write_is_in_a_table() -> None:
    """Every write Peewee's Model offers is a row above (a new one would need a decision and a row)."""
    writes = {"create", "save", "delete_instance", "insert", "insert_many", "insert_from", "update", "delete"}
    writes |= {"replace", "replace_many", "bulk_create", "bulk_update", "delete_by_id"}
    assert writes <= set(dir(peewee.Model))
    named = " ".join(list(ALLOWED) + list(REFUSED))
    for name in writes:
        assert f".{name}" in named or f"{name}(" in named, name


def test_a_job_and_its_targets_go_in_one_transaction(jobs: Any) -> None:
    before = snapshot()
    with db.atomic() as transaction:
        assert J.get_by_id("k").delete_instance() == 1
        assert T.select().where(T.job_id == "k").count() == 0
        transaction.rollback()
    assert snapshot() == before


def test_saving_a_new_target_twice_inserts_then_updates(jobs: Any) -> None:
    """The key is composite and not generated: ``save()`` of an instance whose key was set inserts it;
    once saved, the next ``save()`` updates it, as for any Peewee model with an auto-increment key."""
    new = T(job_id="p", idx=1, url="https://e.x/", options={})
    assert new.save() == 1
    assert new.dirty_fields == []
    new.url = "https://e.y/"
    assert new.save() == 1
    new.status = "done"
    new.result = "r"
    assert new.save() == 1
    assert_target("p", 1, ("done", "r", "{}"))
    assert job_row("p") == ("queued", "", 1, 1, NOW)
    assert T.select().where(T.job_id == "p").count() == 2
    assert_counts_exact()


def test_saving_a_new_job_inserts_it_once(jobs: Any) -> None:
    new = J(**new_job("n"))
    assert new.save() == 1
    assert new.save() is False  # nothing changed since
    with pytest.raises(dcache.DuplicateJob):
        J(**new_job("n")).save()
    assert J.select().where(J.id == "n").count() == 1


def test_get_or_create_finds_or_creates(jobs: Any) -> None:
    found, created = J.get_or_create(id="j", defaults=new_job("j"))  # type: ignore[no-untyped-call]
    assert (found.id, created) == ("j", False)
    made, created = J.get_or_create(id="n", defaults=new_job("n"))  # type: ignore[no-untyped-call]
    assert (made.id, created) == ("n", True)
    assert_counts_exact()


class _NoModelWrites:
    """A guard that fails any write through the models."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the manager wrote through the models ({name})")


def test_the_manager_never_writes_through_the_models(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The functions run their compiled statements: the model-write guard never runs on their paths."""
    monkeypatch.setattr(models, "_GUARD", [_NoModelWrites()])
    dcache.create_batch_job(make_job("a", targets_total=2, lease=10), make_targets(2))
    dcache.submit_batch_job(
        make_job("b", targets_total=1, idem_key="k", lease=10), make_targets(1), 60, now=10
    )
    dcache.create_batch_job(make_job("c", targets_total=1, lease=10))
    dcache.put_batch_targets("c", make_targets(1))
    assert len(dcache.claim_batch_targets(2, now=20)) == 2
    dcache.update_batch_target("a", 0, "done", result="x" * 10, now=20)
    dcache.set_batch_job_status("a", "partial", now=20)
    dcache.touch_batch_job("b", now=20)
    dcache.rescue_stale_jobs(5, "stale", now=30)
    dcache.mark_in_flight_failed("restart", now=30)
    assert dcache.evict_batch_oldest(0) == 1
    assert dcache.sweep_batch(0, now=100) == 2
    assert J.select().count() == 0


def test_the_guards_old_name_imports_with_a_deprecation_warning() -> None:
    old, missing = "ModelRules", "ModelRulez"
    with pytest.warns(DeprecationWarning, match=r"sift\.dcache\.modelwrites\.ModelWriteGuard"):
        guard = getattr(dcache, old)
    assert guard is modelwrites.ModelWriteGuard
    with pytest.raises(AttributeError, match="no attribute 'ModelRulez'"):
        getattr(dcache, missing)
