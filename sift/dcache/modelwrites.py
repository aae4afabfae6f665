"""Peewee writes through ``BatchJob`` and ``BatchTarget``, held to the store's rules.

Each write either does what the manager's function would (the same checks, counts, byte total and lease) or
is refused with :class:`ModelWriteRefused` naming what to call instead, with nothing written. The docs'
table "Writing through the models" lists every operation. The manager's own statements are compiled from
the same query classes but never executed through them, so its hot paths pay nothing for this.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

import peewee

from . import manager, validation
from .clock import unix_now
from .database import db
from .errors import ModelWriteRefused
from .hosts import url_host
from .models import (
    FINAL_TARGET_STATUSES,
    BatchJob,
    BatchTarget,
    PeeweeSave,
    RunQuery,
    hold_writes_to,
    target_host,
)

__all__ = ["ModelRules"]

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


class ModelRules:
    """The rules every model write goes through (installed on the models by :func:`install`)."""

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
        dirty: set[str] = instance.__dict__["_dirty"]
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
        model = query.model
        if query._on_conflict is not None:
            refuse(
                "query",
                f"{model.__name__}.replace()/on_conflict() would overwrite a row's counts; {_add(model)}",
            )
        if isinstance(query._insert, peewee.SelectBase):
            refuse("query", f"{model.__name__}.insert_from() is not checked row by row; {_add(model)}")
        single = isinstance(query._insert, dict)
        rows = [query._insert] if single else query._insert
        named_rows = _named_rows(model, rows, query._columns)
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
        shape and counts are refused. A target's key and run fields are refused (they move the counts),
        and so are its claim fields (``runner``, ``heartbeat``, ``attempts``: the claim functions')."""
        names = {field.name: value for field, value in query._update.items()}
        if query.model is BatchJob:
            for name, problem in JOB_FIXED.items():
                if name in names:
                    refuse(name, f"{problem} (BatchJob.update/save may not set it)")
            _check_job_values(names)
            if "lease" not in names and any(name in names for name in JOB_STATUS_FIELDS):
                query = query.clone()
                query._update = {**query._update, BatchJob.lease: unix_now()}
        else:
            for name in ("job", "idx", *TARGET_RUN_FIELDS):
                if name in names:
                    refuse(name, _target_problem(name))
            for name, problem in TARGET_CLAIM_FIELDS.items():
                if name in names:
                    refuse(name, f"{problem} (BatchTarget.update/save may not set it)")
            _check_target_values(names)
            if "url" in names:  # the target's host follows its URL, as every insert writes it
                if isinstance(names["url"], peewee.Node):
                    refuse("url", "as an SQL expression would leave the target's host behind; give a str")
                query = query.clone()
                query._update = {**query._update, target_host(): url_host(names["url"])}
        return run(query)

    def delete(self, query: Any, run: RunQuery) -> Any:
        """A job goes with its targets, in one transaction (the byte total follows); a target alone is
        refused, since its job could then never finish. Returns how many jobs were deleted."""
        if query.model is BatchTarget:
            refuse(
                "query",
                "a target is deleted with its job: BatchJob.delete_instance(), BatchJob.delete().where(...), "
                "sweep_batch(ttl) or evict_batch_oldest(max_bytes)",
            )
        # In id order (one lock order for every deleter), unless the delete's own ORDER BY picks its LIMIT.
        chosen = (
            BatchJob.select(BatchJob.id).where(query._where).order_by(*(query._order_by or [BatchJob.id]))
        )
        if query._limit is not None:
            chosen = chosen.limit(query._limit)
        deleted = 0
        with db.removals():  # as a sweep's chunk: jobs locked before their targets, one removal at a time
            ids = [row[0] for row in db.execute(db.backend.lock_rows(chosen)).fetchall()]
            for start in range(0, len(ids), IDS_PER_STATEMENT):
                chunk = ids[start : start + IDS_PER_STATEMENT]
                peewee.ModelDelete(BatchTarget).where(BatchTarget.job_id.in_(chunk)).execute()
                deleted += peewee.ModelDelete(BatchJob).where(BatchJob.id.in_(chunk)).execute()
        return deleted


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


def _named_rows(model: type[peewee.Model], rows: Iterable[Any], columns: Any) -> list[dict[str, Any]]:
    """Each row to insert as {field name: value}; an SQL expression as a value is refused."""
    fields = columns if columns is not None else model._meta.sorted_fields
    named_rows = []
    for row in rows:
        items = row.items() if isinstance(row, dict) else zip(fields, row, strict=True)
        named: dict[str, Any] = {}
        for key, value in items:
            field = key if isinstance(key, peewee.Field) else model._meta.combined.get(key)
            if field is None or field.model is not model:
                refuse(str(getattr(key, "name", key)), f"is not a field of {model.__name__}")
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


def _check_job_values(names: dict[str, Any]) -> None:
    """Plain values are checked as the functions check them; a status must be one value."""
    if "status" in names:
        if isinstance(names["status"], peewee.Node):
            refuse("status", "must be one value per update; call set_batch_job_status(job_id, status)")
        validation.job_status(names["status"])
    for name in ("error", "caller", "idem_key"):
        if name in names and not isinstance(names[name], peewee.Node):
            validation.text(name, names[name], allow_empty=name != "caller")
    if "caller_class" in names and not isinstance(names["caller_class"], peewee.Node):
        validation.caller_class(names["caller_class"])
    for name in ("lease", "created_at"):
        if name in names and not isinstance(names[name], peewee.Node):
            validation.count(name, names[name])


def _check_target_values(names: dict[str, Any]) -> None:
    url = names.get("url")
    if "url" in names and not isinstance(url, peewee.Node):
        if type(url) is not str or not url:
            validation.invalid("url", "must be a non-empty str")
        if "\x00" in url:
            validation.invalid("url", validation.NUL_PROBLEM)


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
    """Hold every write through the models to these rules (``sift.dcache`` does it on import)."""
    hold_writes_to(ModelRules())


install()
