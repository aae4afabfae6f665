"""What ``sweep`` and ``evict`` share: the listing of the jobs a dry run would remove, and progress read
from the ``stats()`` counters, which the package bumps after each chunk it removes."""

from __future__ import annotations

from collections.abc import Callable

from sift import dcache
from sift.dcache import BatchJob

from .report import Column, format_age, format_count, format_size, table

__all__ = ["NEVER_EVICTED", "SHOWN", "counter_since", "listing"]

NEVER_EVICTED = "queued and running jobs are never evicted"

#: How many of the jobs a dry run would remove are listed in its human output.
SHOWN = 20


def counter_since(name: str) -> Callable[[], int]:
    """How much the ``stats()`` counter ``name`` has grown since this call."""
    start = dcache.stats()[name]
    return lambda: dcache.stats()[name] - start


def listing(jobs: list[BatchJob], now: int) -> list[str]:
    """The first SHOWN of ``jobs`` as an indented table, and how many more there are."""
    rows = [
        {
            "id": job.id,
            "caller": job.caller,
            "status": job.status,
            "bytes": format_size(job.nbytes),
            "lease": format_age(job.lease, now),
        }
        for job in jobs[:SHOWN]
    ]
    columns = [
        Column("id", "id", width=40),
        Column("caller", "caller", width=24),
        Column("status", "status"),
        Column("bytes", "bytes", right=True),
        Column("lease age", "lease", right=True),
    ]
    lines = table(rows, columns, indent="  ")
    if len(jobs) > SHOWN:
        lines.append(f"  … and {format_count(len(jobs) - SHOWN)} more")
    return lines
