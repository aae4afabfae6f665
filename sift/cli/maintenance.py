"""The maintenance commands: ``sweep``, ``evict`` and ``reconcile``.

``--dry-run`` lists what the package would remove (``sweep_candidates``, ``evict_candidates``) and writes
nothing. On a terminal, a long sweep or eviction shows progress read from the ``stats()`` counters,
which the package bumps after each chunk.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from sift import dcache
from sift.dcache import BatchJob, BatchTarget
from sift.dcache.clock import unix_now

from .progress import bars_enabled, run_with_progress
from .report import Column, emit_json, format_age, format_count, format_size, format_time, table

__all__ = ["cmd_evict", "cmd_reconcile", "cmd_sweep"]

NEVER_EVICTED = "queued and running jobs are never evicted"

#: How many of the jobs a dry run would remove are listed in its human output.
SHOWN = 20

#: Job ids per query when counting the targets of the jobs a dry run lists.
PAGE = 500


def _counter_since(name: str) -> Callable[[], int]:
    """How much the ``stats()`` counter ``name`` has grown since this call."""
    start = dcache.stats()[name]
    return lambda: dcache.stats()[name] - start


def _listing(jobs: list[BatchJob], now: int) -> list[str]:
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


def _stored_targets(job_ids: list[str]) -> int:
    count = 0
    for start in range(0, len(job_ids), PAGE):
        chunk = job_ids[start : start + PAGE]
        count += BatchTarget.select().where(BatchTarget.job_id.in_(chunk)).count()
    return count


# -- sweep -----------------------------------------------------------------------------------------------


def cmd_sweep(args: argparse.Namespace) -> int:
    ttl: int = args.ttl
    now = unix_now()
    cutoff = now - ttl
    nbytes_before = dcache.batch_nbytes()
    report: dict[str, Any] = {"dry_run": args.dry_run, "ttl_s": ttl, "now": now, "cutoff": cutoff}
    rule = (
        f"lease on or before {format_time(cutoff)}, ttl {args.ttl_text}"
        if cutoff >= 0
        else f"ttl {args.ttl_text}"
    )
    if args.dry_run:
        jobs = dcache.sweep_candidates(ttl, now=now)
        ids = [job.id for job in jobs]
        freed = sum(job.nbytes for job in jobs)
        report.update(jobs=len(jobs), targets=_stored_targets(ids), nbytes=freed, job_ids=ids)
        if args.json:
            emit_json(report)
            return 0
        print(
            f"dry run: would sweep {format_count(len(jobs))} jobs "
            f"({format_count(report['targets'])} targets, "
            f"{format_size(freed)} of results) with a {rule}; nothing was changed"
        )
        if jobs:
            print("\n".join(_listing(jobs, now)))
        return 0
    swept = run_with_progress(
        lambda: dcache.sweep_batch(ttl, now=now),
        total=len(dcache.sweep_candidates(ttl, now=now)) if bars_enabled() else 0,
        done=_counter_since("jobs_swept"),
        desc="sweep",
        unit="job",
    )
    nbytes_after = dcache.batch_nbytes()
    report.update(
        swept=swept,
        nbytes_before=nbytes_before,
        nbytes_after=nbytes_after,
        jobs_left=BatchJob.select().count(),
    )
    if args.json:
        emit_json(report)
        return 0
    print(
        f"swept {format_count(swept)} jobs with a {rule}; freed {format_size(nbytes_before - nbytes_after)}; "
        f"{format_count(report['jobs_left'])} jobs and {format_size(nbytes_after)} of results remain"
    )
    return 0


# -- evict -----------------------------------------------------------------------------------------------


def cmd_evict(args: argparse.Namespace) -> int:
    max_bytes: int = args.max_bytes
    nbytes_before = dcache.batch_nbytes()
    report: dict[str, Any] = {"dry_run": args.dry_run, "max_bytes": max_bytes, "nbytes_before": nbytes_before}
    if args.dry_run:
        jobs = dcache.evict_candidates(max_bytes)
        freed = sum(job.nbytes for job in jobs)
        after = nbytes_before - freed
        report.update(jobs=len(jobs), nbytes=freed, nbytes_after=after, job_ids=[job.id for job in jobs])
        if args.json:
            emit_json(report)
            return 0
        print(
            f"dry run: would evict {format_count(len(jobs))} jobs, freeing {format_size(freed)}: "
            f"{format_size(nbytes_before)} -> {format_size(after)} (max {format_size(max_bytes)}); "
            "nothing was changed"
        )
        if after > max_bytes:
            print(f"  still over by {format_size(after - max_bytes)}: {NEVER_EVICTED}")
        if jobs:
            print("\n".join(_listing(jobs, unix_now())))
        return 0
    evicted = run_with_progress(
        lambda: dcache.evict_batch_oldest(max_bytes),
        total=max(0, nbytes_before - max_bytes),
        done=_counter_since("bytes_evicted"),
        desc="evict",
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
    )
    nbytes_after = dcache.batch_nbytes()
    report.update(evicted=evicted, nbytes_after=nbytes_after)
    if args.json:
        emit_json(report)
        return 0
    print(
        f"evicted {format_count(evicted)} jobs, freeing {format_size(nbytes_before - nbytes_after)}: "
        f"{format_size(nbytes_before)} -> {format_size(nbytes_after)} (max {format_size(max_bytes)})"
    )
    if nbytes_after > max_bytes:
        print(f"  still over by {format_size(nbytes_after - max_bytes)}: {NEVER_EVICTED}")
    return 0


# -- reconcile -------------------------------------------------------------------------------------------


def cmd_reconcile(args: argparse.Namespace) -> int:
    marked = dcache.mark_in_flight_failed(args.reason)
    if args.json:
        emit_json({"marked": marked, "reason": args.reason})
        return 0
    print(f"marked {format_count(marked)} queued or running jobs as failed, with error {args.reason!r}")
    return 0
