"""``sift sweep``: delete every job whose lease is older than the ttl (``sweep_batch``).

``--dry-run`` lists what would go (``sweep_candidates``) and opens the store read-only. On a terminal, a
long sweep shows progress read from the ``jobs_swept`` counter.
"""

from __future__ import annotations

import argparse
from typing import Any

from sift import dcache
from sift.dcache import BatchJob, BatchTarget

from ..progress import bars_enabled, run_with_progress
from ..removal import counter_since, listing
from ..report import emit_json, format_size, format_time, plural
from ..units import parse_duration
from . import Command, dry_run

__all__ = ["COMMAND"]

#: Job ids per query when counting the targets of the jobs a dry run lists.
PAGE = 500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument(
        "--ttl", required=True, metavar="DURATION", help="e.g. 90s, 10m, 24h, 7d, or plain seconds"
    )
    parser.add_argument("--dry-run", action="store_true", help="report what would go; change nothing")


def _stored_targets(job_ids: list[str]) -> int:
    count = 0
    for start in range(0, len(job_ids), PAGE):
        chunk = job_ids[start : start + PAGE]
        count += BatchTarget.select().where(BatchTarget.job_id.in_(chunk)).count()
    return count


def run(args: argparse.Namespace) -> int:
    """Sweep by --ttl, or with --dry-run list what would go; the totals before and after."""
    ttl: int = args.ttl
    now = dcache.unix_now()
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
            f"dry run: would sweep {plural(len(jobs), 'job')} "
            f"({plural(report['targets'], 'target')}, "
            f"{format_size(freed)} of results) with a {rule}; nothing was changed"
        )
        if jobs:
            print("\n".join(listing(jobs, now)))
        return 0
    swept = run_with_progress(
        lambda: dcache.sweep_batch(ttl, now=now),
        total=len(dcache.sweep_candidates(ttl, now=now)) if bars_enabled() else 0,
        done=counter_since("jobs_swept"),
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
        f"swept {plural(swept, 'job')} with a {rule}; freed {format_size(nbytes_before - nbytes_after)}; "
        f"{plural(report['jobs_left'], 'job')} and {format_size(nbytes_after)} of results remain"
    )
    return 0


COMMAND = Command(
    name="sweep",
    help="Delete every job whose lease is older than the ttl (sweep_batch).",
    run=run,
    add_arguments=add_arguments,
    values={"ttl": parse_duration},
    readonly=dry_run,
)
