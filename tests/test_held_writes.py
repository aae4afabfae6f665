"""Model writes are held by the table they write, not by the class that built them: a subclass of a store
model, an SQL expression as a value, a field that names another column, and every Peewee write built
around the models (a query class made directly, a ``peewee.Table``, another model on the same table, a
write inside a CTE) either follow the rules or are refused with every table as it was. Other models of
a user's own keep Peewee's plain behaviour."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import peewee
import pytest
from helpers import make_job, make_targets, snapshot

from sift import dcache
from sift.dcache import BatchJob, BatchTarget

LONG = "k" * (dcache.MAX_KEY_BYTES + 1)


class MyTarget(BatchTarget):
    """A project's subclass adding a helper, on the store's table."""

    class Meta:
        table_name = "batch_target"

    def host_part(self) -> str:
        return str(self.url).split("/")[2]


class MyJob(BatchJob):
    class Meta:
        table_name = "batch_job"


class RenamedJob(BatchJob):
    """A subclass whose fields name the store's columns under other names."""

    total = peewee.IntegerField(column_name="targets_total")
    bytes_held = peewee.IntegerField(column_name="nbytes")
    kind = peewee.TextField(column_name="caller_class")

    class Meta:
        table_name = "batch_job"


class LooseJob(BatchJob):
    """A subclass whose ``caller_class`` converts every value to one the store does not know."""

    caller_class = peewee.TextField()

    class Meta:
        table_name = "batch_job"


LooseJob.caller_class.db_value = lambda value: "bogus"  # type: ignore[method-assign]


class OtherModel(peewee.Model):
    """Another model on the store's table, not a subclass of the store's models."""

    job_id = peewee.TextField()
    idx = peewee.IntegerField()
    status = peewee.TextField()

    class Meta:
        database = dcache.db
        table_name = "batch_target"
        primary_key = False


class Note(peewee.Model):
    """A user's own model on a table of its own, in the store's database."""

    text = peewee.TextField()

    class Meta:
        database = dcache.db
        table_name = "user_note"


@pytest.fixture
def jobs(store: dcache.StoreDatabase) -> Iterator[dcache.StoreDatabase]:
    """Jobs ``a`` (one target done), ``b`` and ``c`` (pending), all queued."""
    for job_id in ("a", "b", "c"):
        dcache.create_batch_job(make_job(job_id, targets_total=2), make_targets(2))
    dcache.update_batch_target("a", 0, "done", result="abc", now=1_000)
    yield store


def refused(write: Callable[[], object], field: str) -> None:
    """``write`` raises a package error naming ``field``, and every table is as it was."""
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as info:
        write()
    assert info.value.field == field, info.value
    assert snapshot() == before


WRITES_AROUND: dict[str, tuple[Callable[[], object], str]] = {
    "subclass: MyTarget.delete()": (lambda: MyTarget.delete().execute(), "query"),
    "subclass: MyTarget.delete().where()": (
        lambda: MyTarget.delete().where(MyTarget.idx == 0).execute(),
        "query",
    ),
    "subclass: MyJob.update(targets_total)": (
        lambda: MyJob.update(targets_total=3).where(MyJob.id == "a").execute(),
        "targets_total",
    ),
    "subclass: MyJob.update(nbytes)": (lambda: MyJob.update(nbytes=0).execute(), "nbytes"),
    "subclass: MyJob.update(targets_done)": (lambda: MyJob.update(targets_done=2).execute(), "targets_done"),
    "subclass: MyJob.update(id)": (lambda: MyJob.update(id="z").where(MyJob.id == "a").execute(), "id"),
    "subclass: MyTarget.update(status)": (lambda: MyTarget.update(status="done").execute(), "status"),
    "subclass: MyTarget.update(runner)": (lambda: MyTarget.update(runner="R").execute(), "runner"),
    "subclass: MyTarget.create(attempts=4)": (
        lambda: MyTarget.create(job="a", idx=1, url="https://x/", options="{}", attempts=4),
        "attempts",
    ),
    "subclass: MyJob.create(nbytes)": (
        lambda: MyJob.create(**{**make_job("n").__data__, "nbytes": 10**12}),
        "nbytes",
    ),
    "renamed field: RenamedJob.update(total)": (
        lambda: RenamedJob.update(total=9).execute(),
        "targets_total",
    ),
    "renamed field: RenamedJob.update(bytes_held)": (
        lambda: RenamedJob.update(bytes_held=0).execute(),
        "nbytes",
    ),
    "renamed field: RenamedJob.update(kind)": (
        lambda: RenamedJob.update(kind="bogus").execute(),
        "caller_class",
    ),
    "converter: LooseJob.update(caller_class)": (
        lambda: LooseJob.update(caller_class="fleet").execute(),
        "caller_class",
    ),
    "another model's field as the key": (
        lambda: BatchJob.update({BatchTarget.status: "bogus"}).execute(),
        "status",
    ),
    "the host column": (lambda: BatchTarget.update({dcache.models.target_host(): "x"}).execute(), "host"),
    "expression: caller_class": (
        lambda: BatchJob.update(caller_class=peewee.Value("bogus")).execute(),
        "caller_class",
    ),
    "expression: caller": (lambda: BatchJob.update(caller=peewee.Value("")).execute(), "caller"),
    "expression: idem_key": (lambda: BatchJob.update(idem_key=peewee.Value(LONG)).execute(), "idem_key"),
    "expression: lease": (lambda: BatchJob.update(lease=peewee.Value(-7)).execute(), "lease"),
    "expression: lease arithmetic": (
        lambda: BatchJob.update(lease=BatchJob.lease - 10**9).execute(),
        "lease",
    ),
    "expression: created_at": (lambda: BatchJob.update(created_at=peewee.Value(-1)).execute(), "created_at"),
    "expression: options": (lambda: BatchTarget.update(options=peewee.Value("{oops")).execute(), "options"),
    "expression: url": (lambda: BatchTarget.update(url=peewee.Value("https://x/")).execute(), "url"),
    "plain: caller too long": (lambda: BatchJob.update(caller=LONG).execute(), "caller"),
    "plain: idem_key too long": (lambda: BatchJob.update(idem_key=LONG).execute(), "idem_key"),
    "plain: url too long": (
        lambda: BatchTarget.update(url="https://x/" + "a" * dcache.MAX_URL_BYTES).execute(),
        "url",
    ),
    "built directly: ModelDelete(BatchTarget)": (lambda: peewee.ModelDelete(BatchTarget).execute(), "query"),
    "built directly: ModelUpdate(BatchJob)": (
        lambda: peewee.ModelUpdate(BatchJob, {BatchJob.nbytes: 0}).execute(),
        "query",
    ),
    "built directly: ModelInsert(BatchJob)": (
        lambda: peewee.ModelInsert(BatchJob, {BatchJob.id: "n"}).execute(),
        "query",
    ),
    "a peewee.Table": (lambda: peewee.Table("batch_target").bind(dcache.db).delete().execute(), "query"),
    "the model's own _meta.table": (lambda: BatchJob._meta.table.delete().execute(dcache.db), "query"),
    "another model on the table": (lambda: OtherModel.delete().execute(), "query"),
    "another model's update": (lambda: OtherModel.update(status="done").execute(), "query"),
    "a write inside a CTE": (
        lambda: list(
            BatchJob.select(peewee.SQL("1")).with_cte(
                peewee.ModelDelete(BatchTarget).returning(BatchTarget.job_id).cte("gone")
            )
        ),
        "query",
    ),
}


@pytest.mark.parametrize("name", sorted(WRITES_AROUND))
def test_a_write_around_the_rules_is_refused_and_writes_nothing(
    jobs: dcache.StoreDatabase, name: str
) -> None:
    write, field = WRITES_AROUND[name]
    refused(write, field)
    assert dcache.check_store().ok


def test_a_subclass_follows_the_rules_where_they_allow(jobs: dcache.StoreDatabase) -> None:
    assert MyJob.update(caller="carol").where(MyJob.id == "b").execute() == 1
    job = MyJob.get_by_id("b")
    job.status = "cancelled"
    job.save()
    assert MyJob.delete().where(MyJob.id == "c").execute() == 1
    MyTarget.update(url="https://other.example/").where(MyTarget.job_id == "a").execute()
    assert [(j.id, j.caller, j.status) for j in BatchJob.select().order_by(BatchJob.id)] == [
        ("a", "alice", "queued"),
        ("b", "carol", "cancelled"),
    ]
    assert BatchTarget.select().where(BatchTarget.job_id == "c").count() == 0  # went with its job
    assert [t.host_part() for t in MyTarget.select().where(MyTarget.job_id == "a")] == ["other.example"] * 2
    hosts = dcache.db.execute_sql("SELECT DISTINCT host FROM batch_target WHERE job_id = 'a'").fetchall()
    assert hosts == [("other.example",)]
    report = dcache.check_store()
    assert report.ok, report.violations


def test_an_expression_whose_result_is_valid_is_written(jobs: dcache.StoreDatabase) -> None:
    lease = dcache.batch_job("b").lease  # type: ignore[union-attr]
    assert BatchJob.update(lease=BatchJob.lease + 60).where(BatchJob.id == "b").execute() == 1
    assert (
        BatchJob.update(caller=peewee.fn.UPPER(peewee.Value("late"))).where(BatchJob.id == "b").execute() == 1
    )
    job = dcache.batch_job("b")
    assert job is not None and (job.lease, job.caller) == (lease + 60, "LATE")


@pytest.mark.parametrize("status", ["queued", "running"])
@pytest.mark.parametrize("how", ["update", "save", "subclass"])
def test_a_finished_job_does_not_go_back_to_live(jobs: dcache.StoreDatabase, how: str, status: str) -> None:
    dcache.set_batch_job_status("b", "done")
    writes: dict[str, Callable[[], object]] = {
        "update": lambda: BatchJob.update(status=status).execute(),
        "save": lambda: _save_status("b", status),
        "subclass": lambda: MyJob.update(status=status).where(MyJob.id == "b").execute(),
    }
    refused(writes[how], "status")


def _save_status(job_id: str, status: str) -> None:
    job = BatchJob.get_by_id(job_id)
    job.status = status
    job.save()


def test_a_live_job_finishes_and_a_finished_one_may_change_its_final_status(
    jobs: dcache.StoreDatabase,
) -> None:
    assert BatchJob.update(status="done").where(BatchJob.id == "b").execute() == 1
    assert BatchJob.update(status="cancelled", error="by hand").where(BatchJob.id == "b").execute() == 1
    assert dcache.batch_job("b").status == "cancelled"  # type: ignore[union-attr]
    dcache.set_batch_job_status("b", "queued")  # the original design's call sets any status
    assert dcache.batch_job("b").status == "queued"  # type: ignore[union-attr]


def test_a_users_own_model_keeps_peewees_plain_writes(store: dcache.StoreDatabase) -> None:
    key = "SERIAL" if store.backend.statement_key == "postgres" else "INTEGER"
    dcache.db.execute_sql(f"CREATE TABLE user_note (id {key} PRIMARY KEY, text TEXT NOT NULL)")
    try:
        Note.insert_many([{"text": "a"}, {"text": "b"}]).execute()
        assert Note.update(text=peewee.fn.UPPER(Note.text)).execute() == 2
        assert Note.delete().where(Note.text == "A").execute() == 1
        assert [n.text for n in Note.select()] == ["B"]
    finally:
        dcache.db.execute_sql("DROP TABLE user_note")
