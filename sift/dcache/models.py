"""Peewee models on the two batch tables, and the named status values."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar, overload

import peewee

from . import jsontext
from .database import db


class JobStatus(enum.StrEnum):
    """Status of a batch job; ``queued`` and ``running`` are live, the rest finished."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    PARTIAL = "partial"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TargetStatus(enum.StrEnum):
    """Status of one target; ``done`` and ``failed`` are final."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class CallerClass(enum.StrEnum):
    """Who submitted a job."""

    FLEET = "fleet"
    RESTRICTED = "restricted"


LIVE_JOB_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)
FINISHED_JOB_STATUSES = (JobStatus.DONE, JobStatus.PARTIAL, JobStatus.FAILED, JobStatus.CANCELLED)
IDEM_JOB_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DONE, JobStatus.PARTIAL)
FINAL_TARGET_STATUSES = (TargetStatus.DONE, TargetStatus.FAILED)


M = TypeVar("M", bound="_StoreModel")


class _ChangedFields:
    """Peewee's set of the fields changed since an instance was made or read (its ``_dirty``), on an instance
    a store's read built (``from_row``), which has none: made empty at its first use, in one step
    (``dict.setdefault``), so that threads setting fields on it at once add them to one set."""

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> _ChangedFields: ...
    @overload
    def __get__(self, instance: object, owner: type[Any] | None = None) -> set[str]: ...
    def __get__(self, instance: object | None, owner: type[Any] | None = None) -> Any:
        if instance is None:
            return self
        # the instance's attributes become a dict here: once a field is set it holds one object more than
        # Peewee's own read does; a read left alone, as most are, holds neither
        return instance.__dict__.setdefault("_dirty", set())


#: Runs a Peewee write query as Peewee would, unguarded (the model-write guard calls it once it allows the
#: write).
RunQuery = Callable[[Any], Any]
#: Peewee's own ``Model.save(force_insert, only)`` on the instance.
PeeweeSave = Callable[[bool, Any], Any]


class WriteGuard(Protocol):
    """What every write through the models goes through (:mod:`sift.dcache.modelwrites`)."""

    def save(self, instance: Any, force_insert: bool, only: Any, save: PeeweeSave) -> Any: ...

    def insert(self, query: Any, run: RunQuery) -> Any: ...

    def update(self, query: Any, run: RunQuery) -> Any: ...

    def delete(self, query: Any, run: RunQuery) -> Any: ...


_GUARD: list[WriteGuard] = []


def hold_writes_to(guard: WriteGuard) -> None:
    """Route every write through the models to ``guard``: ``sift.dcache`` does it once, on import, with the
    guard of :mod:`sift.dcache.modelwrites` (which builds on the manager, which builds on these models)."""
    _GUARD[:] = [guard]


class RuledInsert(peewee.ModelInsert):
    """``insert``, ``insert_many``, ``insert_from``, ``replace``: run by the guard when executed. Compiling
    it (``.sql()``, as the manager's statements do) is Peewee's own."""

    def _execute(self, database: Any) -> Any:
        run = peewee.ModelInsert._execute  # type: ignore[attr-defined]
        return _GUARD[0].insert(self, lambda query: run(query, database))


class RuledUpdate(peewee.ModelUpdate):
    """``update`` (and so ``save`` of a stored row, and ``bulk_update``): run by the guard when executed."""

    def _execute(self, database: Any) -> Any:
        run = peewee.ModelUpdate._execute  # type: ignore[attr-defined]
        return _GUARD[0].update(self, lambda query: run(query, database))


class RuledDelete(peewee.ModelDelete):
    """``delete`` (and so ``delete_instance`` and ``delete_by_id``): run by the guard when executed."""

    def _execute(self, database: Any) -> Any:
        run = peewee.ModelDelete._execute  # type: ignore[attr-defined]
        return _GUARD[0].delete(self, lambda query: run(query, database))


class _StoreModel(peewee.Model):
    class Meta:
        database = db
        legacy_table_names = False
        # save() writes only the fields set since the row was read: a stale instance never writes back
        # targets_done, nbytes or lease that the store's functions moved meanwhile.
        only_save_dirty = True

    #: Peewee's names of the fields set since the instance was made or read: an attribute of each instance;
    #: this, reached only through an instance without one, makes it (a store's read builds none).
    _dirty = _ChangedFields()

    @classmethod
    def from_row(cls: type[M], names: tuple[str, ...], row: tuple[Any, ...]) -> M:
        """An unmodified instance from a row, as Peewee's ``__init__(__no_default__=1)`` builds it,
        without setting each field through its descriptor."""
        obj = cls.__new__(cls)
        obj.__data__ = dict(zip(names, row, strict=False))  # strict=True costs a third more
        obj.__rel__ = {}
        return obj

    @classmethod
    def from_rows(cls: type[M], names: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> list[M]:
        """:meth:`from_row` of each row (columns past ``names`` are left out), in one call, not one a row."""
        made = []
        for row in rows:
            obj = cls.__new__(cls)
            obj.__data__ = dict(zip(names, row, strict=False))
            obj.__rel__ = {}
            made.append(obj)
        return made

    # -- Writes: Peewee's, through the store's rules (see sift.dcache.modelwrites and the docs) ----------

    def save(self, force_insert: bool = False, only: Any = None) -> Any:
        """Peewee's ``save``, held to the rules; an instance whose whole key was set since it was made or
        read is inserted (Peewee alone would UPDATE a row that is not there: the key is not generated)."""
        return _GUARD[0].save(
            self, force_insert, only, lambda insert, fields: super(_StoreModel, self).save(insert, fields)
        )

    def delete_instance(self, recursive: bool = False, delete_nullable: bool = False) -> Any:
        """This row's ``delete()``: a job's targets go with it, whatever ``recursive`` says."""
        return type(self).delete().where(self._pk_expr()).execute()  # type: ignore[attr-defined]

    @classmethod
    def insert(cls, __data: Any = None, **insert: Any) -> RuledInsert:
        return RuledInsert(cls, cls._normalize_data(__data, insert))  # type: ignore[attr-defined]

    @classmethod
    def insert_many(cls, rows: Any, fields: Any = None) -> RuledInsert:
        return RuledInsert(cls, insert=rows, columns=fields)

    @classmethod
    def insert_from(cls, query: Any, fields: Any) -> RuledInsert:
        return RuledInsert(
            cls, insert=query, columns=[getattr(cls, f) if isinstance(f, str) else f for f in fields]
        )

    @classmethod
    def update(cls, __data: Any = None, **update: Any) -> RuledUpdate:
        return RuledUpdate(cls, cls._normalize_data(__data, update))  # type: ignore[attr-defined]

    @classmethod
    def delete(cls) -> RuledDelete:
        return RuledDelete(cls)


class JSONTextField(peewee.TextField):
    """JSON text: a dict or list written through the model is stored as compact JSON, a str must already
    be JSON; anything else is ``InvalidBatchInput`` naming ``options``. Reads give the stored text."""

    def db_value(self, value: Any) -> Any:
        # Every Peewee write (create, save, insert, insert_many, update) converts its values here; the
        # store's functions bind theirs directly and check JSON text in SQL on their hot path.
        return jsontext.checked_options(value)


class BatchJob(_StoreModel):
    """One submitted batch: who sent it, its status, progress, lease (unix seconds) and stored bytes."""

    id = peewee.TextField(primary_key=True)
    caller = peewee.TextField()
    caller_class = peewee.TextField()
    idem_key = peewee.TextField()
    status = peewee.TextField()
    error = peewee.TextField(default="", constraints=[peewee.SQL("DEFAULT ''")])
    targets_total = peewee.IntegerField()
    targets_done = peewee.IntegerField(default=0, constraints=[peewee.SQL("DEFAULT 0")])
    created_at = peewee.IntegerField()
    lease = peewee.IntegerField()
    nbytes = peewee.IntegerField(default=0, constraints=[peewee.SQL("DEFAULT 0")])
    targets: Any  # the backref of BatchTarget.job: a query of this job's targets

    class Meta:
        table_name = "batch_job"  # the schema, indexes included, is created by open_db from the DDL


class BatchTarget(_StoreModel):
    """One URL of a job, at position ``idx``; result, error and hint stay NULL until it finishes. ``runner``
    and ``heartbeat`` are its last claim's runner and that claim's last renewal (NULL before any claim, and
    after a write of pending or failed ends the claim); ``attempts`` counts its claims."""

    # The DDL has no foreign key; Peewee's field only gives joins, ``target.job`` and ``job.targets``.
    job = peewee.ForeignKeyField(BatchJob, column_name="job_id", backref="targets", lazy_load=True)
    job_id: Any  # Peewee's accessor for the raw column: BatchTarget.job_id == "…", target.job_id
    idx = peewee.IntegerField()
    url = peewee.TextField()
    options = JSONTextField()
    status = peewee.TextField(default=TargetStatus.PENDING.value)
    result = peewee.TextField(null=True)
    error = peewee.TextField(null=True)
    hint = peewee.TextField(null=True)
    runner = peewee.TextField(null=True)
    heartbeat = peewee.IntegerField(null=True)
    attempts = peewee.IntegerField(default=0, constraints=[peewee.SQL("DEFAULT 0")])
    #: Not stored: on a target a claim took from a paced host, the latest time (unix seconds) its request may
    #: leave for the host's ``min_interval`` to hold; None on every other target.
    send_by: float | None = None

    class Meta:
        table_name = "batch_target"
        primary_key = peewee.CompositeKey("job", "idx")

    @classmethod
    def from_rows(cls, names: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> list[BatchTarget]:
        """:meth:`_StoreModel.from_rows`. Rows of ``TARGET_COLUMNS`` (a claim's, a page's) take a dict
        display, which CPython builds at its size in one step: half the time of ``dict(zip(...))``, which
        grows it pair by pair (tests/test_models.py holds the display to Peewee's own reads)."""
        if names is not TARGET_COLUMNS:
            return super().from_rows(names, rows)
        made = []
        for row in rows:
            obj = cls.__new__(cls)
            obj.__data__ = {
                "job": row[0],
                "idx": row[1],
                "url": row[2],
                "options": row[3],
                "status": row[4],
                "result": row[5],
                "error": row[6],
                "hint": row[7],
                "runner": row[8],
                "heartbeat": row[9],
                "attempts": row[10],
            }
            obj.__rel__ = {}
            made.append(obj)
        return made

    def parsed_options(self) -> Any:
        """``options`` parsed from its JSON (a new object on each call); unsaved options a dict or list
        are checked and copied as storing them would. Python's parser stops at about 1,000 levels."""
        return json.loads(jsontext.checked_options(self.options))


JOB_COLUMNS: tuple[str, ...] = tuple(BatchJob._meta.sorted_field_names)
TARGET_COLUMNS: tuple[str, ...] = tuple(BatchTarget._meta.sorted_field_names)


class _HostColumn(peewee.Column):
    """``batch_target.host``: placed after the model's fields where Peewee sorts an INSERT's columns."""

    def get_sort_key(self, ctx: Any) -> tuple[int, int]:
        return (3, 0)  # a field's key is (1 or 2, its order)


def target_host(target: Any = None) -> peewee.Column:
    """The ``host`` column of ``target`` (BatchTarget, or an alias of it): ``url_host(url)``, written by
    every insert of a target. Not a model field: model reads and writes never carry it, so a model write
    cannot make it disagree with the URL."""
    return _HostColumn(BatchTarget._meta.table if target is None else target, "host")


def target_not_before(target: Any = None) -> peewee.Column:
    """The ``not_before`` column of ``target`` (BatchTarget, or an alias of it): when a retried pending
    target may be claimed again (unix seconds; NULL: now). Not a model field, like the host: only the
    rules that delay and claim targets read or write it."""
    return _NotBeforeColumn(BatchTarget._meta.table if target is None else target, "not_before")


class _NotBeforeColumn(peewee.Column):
    """``batch_target.not_before``: placed after the model's fields (and the host) where Peewee sorts an
    UPDATE's columns."""

    def get_sort_key(self, ctx: Any) -> tuple[int, int]:
        return (3, 1)
