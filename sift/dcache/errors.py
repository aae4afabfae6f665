"""Every exception the batch store raises. Messages start with the field at fault.

A failure of the database itself (disk full, I/O error, a damaged file, a lock held too long) is a
:class:`StoreUnavailable` or one of its subclasses, with the driver's exception as
``__cause__`` (a ``sqlite3.Error`` or a ``psycopg.Error``); :mod:`sift.dcache.driver_errors` decides which.
"""

from __future__ import annotations

from typing import Any, Self


class BatchError(Exception):
    """Base class of every error raised by :mod:`sift.dcache`. Each carries its facts as attributes:
    ``field`` names the argument at fault (the message starts with it), when one is."""

    field: str | None = None


class InvalidBatchInput(BatchError, ValueError):
    """An argument or model field is malformed; nothing was written. ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:  # so it crosses process boundaries (pickle) intact
        return type(self), (self.field, self.problem)


class ModelWriteRefused(InvalidBatchInput):
    """A write through ``BatchJob`` or ``BatchTarget`` that would break the store's counts; nothing was
    written. ``field`` names the field (or ``query``); the message names what to call instead."""


class JobNotFound(BatchError, LookupError):
    """A write named a job id that is not in the store: ``job_id``."""

    field = "job_id"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job_id: no job {job_id!r}")
        self.job_id = job_id

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.job_id,)


class TargetNotFound(BatchError, LookupError):
    """A write named a (``job_id``, ``idx``) that is not in the store."""

    field = "idx"

    def __init__(self, job_id: str, idx: int) -> None:
        super().__init__(f"idx: job {job_id!r} has no target {idx}")
        self.job_id = job_id
        self.idx = idx

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.job_id, self.idx)


class DuplicateJob(BatchError):
    """A job with this id (``job_id``) already exists."""

    field = "id"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"id: a job with id {job_id!r} already exists")
        self.job_id = job_id

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.job_id,)


class IdempotencyConflict(BatchError):
    """``submit`` named an ``idem_key`` whose job (``job_id``) was submitted with other URLs, options or
    caller class; nothing was written. Send the same request again, or use a new key."""

    field = "idem_key"

    def __init__(self, job_id: str, idem_key: str) -> None:
        super().__init__(
            f"idem_key: {idem_key!r} already names job {job_id!r}, submitted with other URLs, options or "
            "caller class; use a new key for a different request"
        )
        self.job_id = job_id
        self.idem_key = idem_key

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.job_id, self.idem_key)


class ClaimLost(BatchError):
    """A runner wrote a target it no longer holds: its claim went stale, was requeued, and the target is
    pending again or another runner's. Nothing was written; the target's current holder writes it."""

    field = "runner"

    def __init__(self, job_id: str, idx: int, runner: str, holder: str | None) -> None:
        now_with = f"now held by {holder!r}" if holder else "no longer held by any runner"
        super().__init__(
            f"runner: {runner!r} no longer holds target {idx} of job {job_id!r} ({now_with}); "
            "its claim was requeued, so this late write is refused"
        )
        self.job_id, self.idx, self.runner, self.holder = job_id, idx, runner, holder

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.job_id, self.idx, self.runner, self.holder)


class StoreNotOpen(BatchError, RuntimeError):
    """No database is open: call ``open_db(path)`` first."""


class StoreUnavailable(BatchError):
    """The file cannot be used now: unreadable, an I/O error, or locked past the busy timeout."""

    #: The store (as shown in messages) whose database raised the driver error, when one did.
    path: str | None = None

    @classmethod
    def of_target(cls, problem: str) -> Self:
        """The error for a target (``open_db``'s ``path``) that cannot be a store, and why."""
        error = cls(f"path: {problem}")
        error.field = "path"
        return error


class StoreMissing(StoreUnavailable):
    """No store where ``open_db`` looked: a missing SQLite file, or a PostgreSQL schema without the store's
    tables. Raised with ``readonly=True`` or ``create=False``, which never create a store."""


class StoreFull(StoreUnavailable):
    """The disk holding the store is full; the failed transaction was rolled back. Free space, retry."""


class StoreConflict(StoreUnavailable):
    """A deadlock or serialization failure on PostgreSQL persisted through the package's retries."""


class StoreCorrupt(StoreUnavailable):
    """The file is not a SQLite database, or is damaged: `sift check` (`check_store()`) names the damage."""


class StoreReadOnly(StoreUnavailable):
    """A write to a store opened with ``readonly=True``, or to a file, folder or file system SQLite may
    not write."""
