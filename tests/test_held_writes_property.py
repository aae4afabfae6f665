"""Any Peewee write to the store's tables, built from the store's models, their subclasses, another model
on the same table or a ``peewee.Table``, with plain values or SQL expressions: it either keeps the store
sound with exact counts (``check_store``, and each job's counts recomputed from its targets), or it is
refused with a package error and every table as it was."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import peewee
import pytest
from helpers import make_job, make_targets, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_held_writes import MyJob, MyTarget, OtherModel, RenamedJob

from sift import dcache
from sift.dcache import BatchJob, BatchTarget

JOB_MODELS = [BatchJob, MyJob, RenamedJob]
TARGET_MODELS = [BatchTarget, MyTarget]
JOB_COLUMNS = ["id", "caller", "caller_class", "idem_key", "status", "error", "targets_total", "targets_done",
               "created_at", "lease", "nbytes"]  # fmt: skip
TARGET_COLUMNS = ["job_id", "idx", "url", "options", "status", "result", "error", "hint", "runner",
                  "heartbeat", "attempts"]  # fmt: skip

plain = st.one_of(
    st.sampled_from(
        ["", "fleet", "restricted", "queued", "running", "done", "failed", "cancelled", "pending"]
    ),
    st.sampled_from(['{"a":1}', "{oops", "https://x.example/", "a\x00b", "k" * 1100]),
    st.text(max_size=8),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, 2, 10**12, True, None, 1.5]),
)


def expression(column: Any) -> st.SearchStrategy[Any]:
    """An SQL expression for a value: a bound Value, arithmetic on the column, a function of it."""
    return st.one_of(
        plain.map(peewee.Value),
        st.integers(-(10**12), 10**12).map(lambda n: column + n),
        st.just(peewee.fn.UPPER(column)),
        st.just(peewee.fn.LOWER(peewee.Value("DONE"))),
    )


def field_of(model: Any, column: str) -> Any:
    return model._meta.columns.get(column) or peewee.Column(model._meta.table, column)


@st.composite
def writes(draw: st.DrawFn) -> tuple[str, Callable[[], object]]:
    """One write: which model or table builds it, and how."""
    jobs = draw(st.booleans())
    model = draw(st.sampled_from(JOB_MODELS if jobs else TARGET_MODELS))
    columns = JOB_COLUMNS if jobs else TARGET_COLUMNS
    kind = draw(st.sampled_from(["update", "update", "insert", "delete", "save", "raw"]))
    column = draw(st.sampled_from(columns))
    key = field_of(model, column)
    value = draw(st.one_of(plain, expression(key)))
    chosen = dcache.db.execute_sql(
        f"SELECT {'id' if jobs else 'job_id'} FROM batch_{'job' if jobs else 'target'}"
    )
    ids = sorted({row[0] for row in chosen.fetchall()})
    # drawn whatever the store holds: the examples share one store, and a draw shaped by its rows would
    # make the same choices draw differently when Hypothesis replays them
    pick = draw(st.integers(min_value=0, max_value=63))
    where_id = ids[pick % len(ids)] if ids else "none"
    id_column = field_of(model, "id" if jobs else "job_id")
    label = f"{kind} {model.__name__}.{column} = {value!r} where {where_id!r}"
    if kind == "update":
        return label, lambda: model.update({key: value}).where(id_column == where_id).execute()
    if kind == "delete":
        return label, lambda: model.delete().where(id_column == where_id).execute()
    if kind == "insert":
        row = dict(make_job(uuid.uuid4().hex).__data__) if jobs else {"job_id": where_id, "idx": 1, "url": "https://a/",
                                                                      "options": "{}"}  # fmt: skip
        row[column] = value
        fields = {field_of(model, name): v for name, v in row.items()}
        return label, lambda: model.insert(fields).execute()
    if kind == "save":

        def save() -> None:
            instance = model.select().where(id_column == where_id).first()
            if instance is None:
                raise dcache.JobNotFound(where_id)
            setattr(
                instance, field_of(model, column).name if column in model._meta.columns else column, value
            )
            instance.save()

        return label, save
    if draw(st.booleans()):
        return f"raw OtherModel {label}", lambda: OtherModel.delete().execute()
    bound = peewee.Table(f"batch_{'job' if jobs else 'target'}").bind(dcache.db)
    return f"raw Table {label}", lambda: bound.update({column: value}).execute()


def assert_exact() -> None:
    """check_store finds nothing (but jobs awaiting their targets, which an insert of a job without them
    makes, as create_batch_job(job) does), and each job's counts are its targets'."""
    report = dcache.check_store()
    violations = [v for v in report.violations if v.kind != "missing_targets"]
    assert violations == [], violations
    for job in BatchJob.select():
        targets = list(BatchTarget.select().where(BatchTarget.job_id == job.id))
        assert job.targets_done == sum(t.status in ("done", "failed") for t in targets)
        assert job.nbytes == sum(len((t.result or "").encode()) for t in targets)
    assert dcache.batch_nbytes() == sum(job.nbytes for job in BatchJob.select())


def seed() -> None:
    """Two jobs of two targets (one done) when fewer than two are left."""
    if BatchJob.select().count() >= 2:
        return
    for _ in range(2):
        job_id = uuid.uuid4().hex[:8]
        dcache.create_batch_job(make_job(job_id, targets_total=2), make_targets(2))
        dcache.update_batch_target(job_id, 0, "done", result="abc")


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_write_is_held_or_refused(store: dcache.StoreDatabase, data: st.DataObject) -> None:
    seed()
    label, write = data.draw(writes())
    before = snapshot()
    try:
        write()
    except dcache.BatchError:
        assert snapshot() == before, label
    except (peewee.IntegrityError, peewee.DataError, peewee.OperationalError) as exc:  # pragma: no cover
        pytest.fail(f"{label}: a driver error escaped: {exc!r}")
    assert_exact()
