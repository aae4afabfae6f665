"""Reading the store's rows for output: a job as a dict, rows counted by status, a result's size."""

from __future__ import annotations

from typing import Any

import peewee

from sift import dcache
from sift.dcache import BatchJob

__all__ = ["JOB_FIELDS", "counts_by_status", "job_row", "result_size"]

JOB_FIELDS: tuple[str, ...] = tuple(field.name for field in BatchJob._meta.sorted_fields)


def result_size(expr: Any) -> Any:
    """The UTF-8 size of a stored result, computed by the database without reading the text out."""
    size: Any = dcache.db.backend.byte_length(expr)
    return size.coerce(False)  # an int, not the text field's str


def job_row(job: BatchJob) -> dict[str, Any]:
    """A job as a plain dict of its columns."""
    return {name: getattr(job, name) for name in JOB_FIELDS}


def counts_by_status(model: Any, known: tuple[str, ...]) -> dict[str, int]:
    """Rows by status: every known status (0 if none), then any other status a foreign writer stored."""
    rows: Any = model.select(model.status, peewee.fn.COUNT(peewee.SQL("*"))).group_by(model.status).tuples()
    found = {status: int(n) for status, n in rows}
    counts = {status: found.pop(status, 0) for status in known}
    counts.update(sorted(found.items()))
    return counts
