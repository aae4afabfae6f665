"""Shared test helpers: job and target factories, and a full snapshot of the store's tables."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sift.dcache import BatchJob, BatchTarget, db


def make_job(job_id: str = "job-1", **fields: Any) -> BatchJob:
    """An unsaved job with sensible defaults; ``fields`` override any column."""
    values: dict[str, Any] = {
        "id": job_id,
        "caller": "alice",
        "caller_class": "fleet",
        "idem_key": "",
        "status": "queued",
        "targets_total": 3,
        "created_at": 1_000,
        "lease": 1_000,
    }
    values.update(fields)
    return BatchJob(**values)


def make_targets(count: int, start: int = 0, **fields: Any) -> list[BatchTarget]:
    """Unsaved pending targets ``start..start+count-1``."""
    return [
        BatchTarget(idx=i, url=f"https://example.com/{i}", options='{"render":false}', **fields)
        for i in range(start, start + count)
    ]


def snapshot() -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table in the open store, in a stable order: compare before and after."""
    tables = db.get_tables()
    return {t: sorted(db.execute_sql(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}


def make_target(idx: int = 0, **fields: Any) -> BatchTarget:
    """One unsaved pending target at ``idx``; ``fields`` override url, options or any other column."""
    values: dict[str, Any] = {"idx": idx, "url": f"https://example.com/{idx}", "options": '{"render":false}'}
    values.update(fields)
    return BatchTarget(**values)


@contextmanager
def session() -> Iterator[None]:
    """Peewee's session calls as a request's hooks make them: start, then commit, or roll back on error."""
    db.session_start()
    try:
        yield
    except BaseException:
        db.session_rollback()
        raise
    db.session_commit()
