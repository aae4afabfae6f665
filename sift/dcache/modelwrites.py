"""Peewee writes through ``BatchJob`` and ``BatchTarget``, held to the store's rules.

Each write either does what the manager's function would (the same checks, counts, byte total and lease) or
is refused with :class:`ModelWriteRefused` naming what to call instead, with nothing written. The docs'
table "Writing through the models" lists every operation. The manager's own statements are compiled from
the same query classes but never executed through them, so its hot paths pay nothing for this.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import peewee

from . import jsontext, manager, validation
from .backends import cleared, written_table
from .clock import unix_now
from .database import db
from .errors import ModelWriteRefused
from .hosts import url_host
from .models import (
    FINAL_TARGET_STATUSES,
    FINISHED_JOB_STATUSES,
    LIVE_JOB_STATUSES,
    BatchJob,
    BatchTarget,
    PeeweeSave,
    RunQuery,
    hold_writes_to,
    target_host,
)

__all__ = ["ModelWriteGuard"]

#: A target's fields that move its job's counts: written only as ``update_batch_target`` writes them.
TARGET_RUN_FIELDS = ("status", "result", "error", "hint")
#: A target's claim fields: written only by the claim functions (a hand-written runner would forge a claim,
#: and ``attempts`` counts claims), so a model write may not set them.
TARGET_CLAIM_FIELDS = {
    "runner": "is the claim's runner; claim_batch_targets(limit, runner=...) claims a target and "
    "release_claims(runner) gives it back",
    "heartbeat": "is the claim's heartbeat; renew_claims(runner) renews it and "
    "requeue_stale_claims(stale_after) requeues a stale claim",
    "attempts": "counts the target's claims; claim_batch_targets(...) counts one more and "
    "requeue_stale_claims(stale_after, max_attempts=...) fails a target past its last attempt",
}
#: The values a new target's claim fields take (the tables' defaults): no other value may be inserted.
TARGET_CLAIM_DEFAULTS = {"runner": None, "heartbeat": None, "attempts": 0}
#: Job fields no write through the model may set: the key, the job's shape, and what follows its targets.
JOB_FIXED = {
    "id": "is the job's key; create_batch_job(...) a new job instead",
    "targets_total": "is fixed when the job is created; create_batch_job(...) a new job instead",
    "targets_done": "follows the job's targets; call update_batch_target(job_id, idx, status, ...)",
    "nbytes": "follows the job's targets' results; call update_batch_target(job_id, idx, status, result=...)",
}
#: Job fields whose change moves the lease to now, as set_batch_job_status does.
JOB_STATUS_FIELDS = ("status", "error")
#: How many jobs one model delete removes per statement (an ``IN`` list).
IDS_PER_STATEMENT = 500


def refuse(field: str, problem: str) -> NoReturn:
    raise ModelWriteRefused(field, problem)


class ModelWriteGuard:
    """The guard every model write goes through, holding it to the store's rules (installed on the models
    by :func:`install`)."""

    def save(self, instance: Any, force_insert: bool, only: Any, save: PeeweeSave) -> Any:
        """An instance whose whole key was set here is inserted; a target's status, result, error or hint
        is written by ``update_batch_target``; anything else is Peewee's ``save`` (through ``update``)."""
        key_set = _key_fields(instance) & set(instance._dirty)
        if not force_insert and key_set == _key_fields(instance):
            force_insert = True
        if not force_insert and key_set:
            name = min(key_set)
            refuse(name, f"{_target_problem(name)}; set the whole key to save a new row")
        if force_insert or not isinstance(instance, BatchTarget):
            return save(force_insert, only)
        dirty: set[str] = instance._dirty
        names = {f if isinstance(f, str) else f.name for f in only} if only is not None else set(dirty)
        for name in sorted(names & TARGET_CLAIM_FIELDS.keys()):
            refuse(name, f"{TARGET_CLAIM_FIELDS[name]} (target.save() may not set it)")
        run_fields = [name for name in TARGET_RUN_FIELDS if name in names]
        if not run_fields:
            return save(False, only)
        rest = [name for name in names if name not in TARGET_RUN_FIELDS]
        with db.write():
            _write_target(instance, run_fields)
            if rest:
                save(False, rest)
        dirty -= set(run_fields)
        return 1

    def insert(self, query: Any, run: RunQuery) -> Any:
        """Rows are created as ``create_batch_job`` (a job, no targets) and ``put_batch_targets`` (pending
        targets) create them, all in one transaction; ``replace``, ``on_conflict`` and ``insert_from`` are
        refused, and so is a target whose claim fields are not a new target's (no runner, no heartbeat, no
        attempt). Returns the key of a single row, or the keys of every row (as PostgreSQL's RETURNING)."""
        model = _store_model(query)
        if model is None:  # a subclass on a table of its own: Peewee's plain insert
            return run(query)
        if query._on_conflict is not None:
            refuse(
                "query",
                f"{model.__name__}.replace()/on_conflict() would overwrite a row's counts; {_add(model)}",
            )
        if isinstance(query._insert, peewee.SelectBase):
            refuse("query", f"{model.__name__}.insert_from() is not checked row by row; {_add(model)}")
        single = isinstance(query._insert, dict)
        rows = [query._insert] if single else query._insert
        named_rows = _named_rows(model, query.model, rows, query._columns)
        if model is BatchTarget:
            for named in named_rows:
                for name, default in TARGET_CLAIM_DEFAULTS.items():
                    if named.get(name, default) != default:
                        refuse(name, f"{TARGET_CLAIM_FIELDS[name]} (a new target is unclaimed)")
        instances = [model(**named) for named in named_rows]
        with db.write():
            if model is BatchJob:
                for job in instances:
                    manager.create_batch_job(job)
            else:
                for job_id, targets in _by_job(instances).items():
                    manager.put_batch_targets(job_id, targets)
        for instance in instances:
            instance._dirty.clear()
        keys = [_key(instance) for instance in instances]
        if query._as_rowcount:
            return len(keys)
        return keys[0][0] if single and model is BatchJob else keys[0] if single else keys

    def update(self, query: Any, run: RunQuery) -> Any:
        """A job's status and error move its lease to now (unless the update sets the lease); its key,
        shape and counts are refused, and so is a finished job's status going back to live. A target's key,
        run and claim fields are refused. What the update stored is checked as the functions check their
        arguments (an SQL expression or a subclass's own field included) before it commits."""
        model = _store_model(query)
        if model is None:  # a subclass on a table of its own: Peewee's plain update
            return run(query)
        if query._returning:
            refuse("query", f"RETURNING on a {model.__name__} update is not held to the rules; read after")
        names = _named_values(model, query._update)
        if model is BatchJob:
            for name, problem in JOB_FIXED.items():
                if name in names:
                    refuse(name, f"{problem} (BatchJob.update/save may not set it)")
            _check_job_values(names)
            if "lease" not in names and any(name in names for name in JOB_STATUS_FIELDS):
                query = query.clone()
                query._update = {**query._update, BatchJob.lease: unix_now()}
                names["lease"] = query._update[BatchJob.lease]
        else:
            for name in ("job", "idx", *TARGET_RUN_FIELDS):
                if name in names:
                    refuse(name, _target_problem(name))
            for name, problem in TARGET_CLAIM_FIELDS.items():
                if name in names:
                    refuse(name, f"{problem} (BatchTarget.update/save may not set it)")
            _check_target_values(names)
            if "url" in names:  # the target's host follows its URL, as every insert writes it
                query = query.clone()
                query._update = {**query._update, target_host(): url_host(names["url"])}
        return _run_checked(model, query, sorted(names), run)

    def delete(self, query: Any, run: RunQuery) -> Any:
        """A job goes with its targets, in one transaction (the byte total follows); a target alone is
        refused, since its job could then never finish. Returns how many jobs were deleted."""
        model = _store_model(query)
        if model is None:
            return run(query)
        if model is BatchTarget:
            refuse(
                "query",
                "a target is deleted with its job: BatchJob.delete_instance(), BatchJob.delete().where(...), "
                "sweep_batch(ttl) or evict_batch_oldest(max_bytes)",
            )
        # The ids the delete's own WHERE picks, read from the table the query names (a subclass's fields
        # compile against it), in id order (one lock order for every deleter) unless its ORDER BY picks its
        # LIMIT.
        job_id = peewee.Column(query.model._meta.table, "id")
        chosen = query.model.select(job_id).where(query._where).order_by(*(query._order_by or [job_id]))
        if query._limit is not None:
            chosen = chosen.limit(query._limit)
        deleted = 0
        with db.removals():  # as a sweep's chunk: jobs locked before their targets, one removal at a time
            ids = [row[0] for row in db.execute(db.backend.lock_rows(chosen)).fetchall()]
            for start in range(0, len(ids), IDS_PER_STATEMENT):
                chunk = ids[start : start + IDS_PER_STATEMENT]
                _execute_cleared(peewee.ModelDelete(BatchTarget).where(BatchTarget.job_id.in_(chunk)))
                deleted += _execute_cleared(peewee.ModelDelete(BatchJob).where(BatchJob.id.in_(chunk)))
        return deleted


def _store_model(query: Any) -> Any:
    """The store's model of the table ``query`` writes, whichever class built it (a subclass too)."""
    table = written_table(query.table)
    return None if table is None else BatchJob if table == "batch_job" else BatchTarget


def _column(key: Any) -> str:
    return key.column_name if isinstance(key, peewee.Field) else str(getattr(key, "name", key))


def _named_values(model: type[peewee.Model], update: dict[Any, Any]) -> dict[str, Any]:
    """An update's values by the store model's field names, read from the columns the keys write (a
    subclass's field may name another column); a column that is not the model's is refused."""
    named: dict[str, Any] = {}
    for key, value in update.items():
        field = model._meta.columns.get(_column(key))
        if field is None:
            refuse(_column(key), f"is not a column a {model.__name__} write may set")
        named[field.name] = value
    return named


def _execute_cleared(query: Any) -> Any:
    with cleared(query):
        return query.execute()


def _run_checked(model: type[peewee.Model], query: Any, names: list[str], run: RunQuery) -> int:
    """Runs the update in a write and checks the values each row now holds, so an SQL expression or a
    subclass's converter cannot store what a plain value may not; a failed check writes nothing."""
    key = [peewee.Entity(f.column_name) for f in _key_field_list(model)]
    columns = [peewee.Entity(model._meta.fields[name].column_name) for name in names]
    returned = query.clone().returning(*key, *columns).tuples()
    with db.write():
        finished = _finished_jobs(query) if model is BatchJob and "status" in names else set()
        with cleared(returned):
            rows = [tuple(row) for row in run(returned)]
        checks = JOB_CHECKS if model is BatchJob else TARGET_CHECKS
        for row in rows:
            values = dict(zip(names, row[len(key) :], strict=True))
            for name, value in values.items():
                checks[name](value)
            if row[0] in finished and values.get("status") in LIVE_JOB_STATUSES:
                refuse(
                    "status",
                    f"job {row[0]!r} is finished and does not go back to {values['status']}; submit a new "
                    "job (set_batch_job_status, the original design's call, sets any status)",
                )
    return len(rows)


def _key_field_list(model: type[peewee.Model]) -> list[peewee.Field]:
    key: Any = model._meta.primary_key
    return [model._meta.fields[n] for n in key.field_names] if model._meta.composite_key else [key]


def _finished_jobs(query: Any) -> set[str]:
    """The ids of finished jobs an update's WHERE picks, locked until the write ends."""
    table = query.model._meta.table
    chosen = query.model.select(peewee.Column(table, "id")).where(
        peewee.Column(table, "status").in_(FINISHED_JOB_STATUSES)
    )
    if query._where is not None:
        chosen = chosen.where(query._where)
    return {row[0] for row in db.execute(db.backend.lock_rows(chosen)).fetchall()}


def _add(model: type[peewee.Model]) -> str:
    if model is BatchJob:
        return "call create_batch_job(job) or submit_batch_job(...), then set_batch_job_status(...)"
    return "call put_batch_targets(job_id, targets), then update_batch_target(job_id, idx, status, ...)"


def _target_problem(name: str) -> str:
    if name in ("job", "idx"):
        return "is part of the target's key; a target stays in its job at its idx"
    return f"moves the job's counts; call update_batch_target(job_id, idx, status, {name}=...)"


def _key_fields(instance: Any) -> set[str]:
    """The names of the instance's key fields: set since it was made or read (a read clears ``_dirty``),
    they make ``save()`` insert."""
    key = instance._meta.primary_key
    return set(key.field_names if instance._meta.composite_key else (key.name,))


def _key(instance: Any) -> tuple[Any, ...]:
    if isinstance(instance, BatchJob):
        return (instance.id,)
    return (instance.job_id, instance.idx)


def _named_rows(
    model: type[peewee.Model], built_by: type[peewee.Model], rows: Iterable[Any], columns: Any
) -> list[dict[str, Any]]:
    """Each row to insert as {the store model's field name: value}, read from the column each key writes
    (a subclass's field may name another column); an SQL expression as a value is refused."""
    fields = columns if columns is not None else built_by._meta.sorted_fields
    named_rows = []
    for row in rows:
        items = row.items() if isinstance(row, dict) else zip(fields, row, strict=True)
        named: dict[str, Any] = {}
        for key, value in items:
            if not isinstance(key, peewee.Field | peewee.Column):
                key = built_by._meta.combined.get(key, key)
            field = model._meta.columns.get(_column(key))
            if field is None:
                refuse(_column(key), f"is not a field of {model.__name__}")
            if isinstance(value, peewee.Node):
                refuse(field.name, f"must be a value, not an SQL expression; {_add(model)}")
            named[field.name] = value
        named_rows.append(named)
    return named_rows


def _by_job(targets: list[Any]) -> dict[Any, list[Any]]:
    groups: dict[Any, list[Any]] = {}
    for target in targets:
        groups.setdefault(target.__data__.get("job"), []).append(target)
    return groups


def _url(value: Any) -> None:
    if type(value) is not str or not value:
        validation.invalid("url", "must be a non-empty str")
    validation.at_most("url", validation.text("url", value), validation.MAX_URL_BYTES)


#: How each column a model update may set is checked: as the functions check the same argument. The plain
#: values of an update are checked before it runs, and what every row holds after it, before it commits.
JOB_CHECKS: dict[str, Callable[[Any], object]] = {
    "caller": lambda value: validation.key("caller", value),
    "caller_class": validation.caller_class,
    "idem_key": lambda value: validation.key("idem_key", value, allow_empty=True),
    "status": validation.job_status,
    "error": lambda value: validation.message("error", value),
    "created_at": lambda value: validation.count("created_at", value),
    "lease": lambda value: validation.count("lease", value),
}
TARGET_CHECKS: dict[str, Callable[[Any], object]] = {"url": _url, "options": jsontext.checked_options}


def _check_job_values(names: dict[str, Any]) -> None:
    """Plain values are checked as the functions check them; a status must be one value."""
    if isinstance(names.get("status"), peewee.Node):
        refuse("status", "must be one value per update; call set_batch_job_status(job_id, status)")
    for name, value in names.items():
        if not isinstance(value, peewee.Node):
            JOB_CHECKS[name](value)


def _check_target_values(names: dict[str, Any]) -> None:
    """The URL is one plain str (its host is computed from it), the options one value (JSON on PostgreSQL,
    which would refuse bad JSON itself); plain options are checked by their field."""
    if isinstance(names.get("url"), peewee.Node):
        refuse("url", "as an SQL expression would leave the target's host behind; give a str")
    if isinstance(names.get("options"), peewee.Node):
        refuse("options", "must be a value (a dict, a list or JSON text), not an SQL expression")
    if "url" in names:
        _url(names["url"])


def _write_target(target: Any, run_fields: list[str]) -> None:
    """Inside a write: ``update_batch_target`` with the fields set on ``target`` and the stored values of
    the others (read under the target's lock); going back from a final status clears them, so the rule's
    own error names the status."""
    data = target.__data__
    job_id = validation.job_id(data.get("job"))
    idx = validation.count("idx", data.get("idx"))
    db.backend.lock_target(job_id, idx)
    stored = (
        BatchTarget.select(*[getattr(BatchTarget, n) for n in TARGET_RUN_FIELDS])
        .where((BatchTarget.job_id == job_id) & (BatchTarget.idx == idx))
        .tuples()
        .first()
    )
    values = dict(zip(TARGET_RUN_FIELDS, stored or ("pending", None, None, None), strict=True))
    given = {name: data.get(name) for name in run_fields}
    if given.get("status", values["status"]) not in FINAL_TARGET_STATUSES:
        values.update(result=None, error=None, hint=None)
    values.update(given)
    manager.update_batch_target(
        job_id, idx, values["status"], result=values["result"], error=values["error"], hint=values["hint"]
    )


def install() -> None:
    """Hold every write through the models to this guard (``sift.dcache`` does it on import)."""
    hold_writes_to(ModelWriteGuard())


install()
