"""``sift evict``: evict the oldest finished jobs until the rest fit in ``--max-bytes``.

``--dry-run`` lists what would go (``evict_candidates``) and opens the store read-only. On a terminal, a
long eviction shows progress read from the ``bytes_evicted`` counter.
"""

from __future__ import annotations

import argparse
from typing import Any

from sift import dcache

from ..progress import run_with_progress
from ..removal import NEVER_EVICTED, counter_since, listing
from ..report import emit_json, format_size, plural
from ..units import parse_size
from . import Command, dry_run

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument("--max-bytes", required=True, metavar="SIZE", help="e.g. 512MiB, 1GB, or plain bytes")
    parser.add_argument("--dry-run", action="store_true", help="report what would go; change nothing")


def run(args: argparse.Namespace) -> int:
    """Evict to --max-bytes, or with --dry-run list what would go; the totals before and after."""
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
            f"dry run: would evict {plural(len(jobs), 'job')}, freeing {format_size(freed)}: "
            f"{format_size(nbytes_before)} -> {format_size(after)} (max {format_size(max_bytes)}); "
            "nothing was changed"
        )
        if after > max_bytes:
            print(f"  still over by {format_size(after - max_bytes)}: {NEVER_EVICTED}")
        if jobs:
            print("\n".join(listing(jobs, dcache.unix_now())))
        return 0
    evicted = run_with_progress(
        lambda: dcache.evict_batch_oldest(max_bytes),
        total=max(0, nbytes_before - max_bytes),
        done=counter_since("bytes_evicted"),
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
        f"evicted {plural(evicted, 'job')}, freeing {format_size(nbytes_before - nbytes_after)}: "
        f"{format_size(nbytes_before)} -> {format_size(nbytes_after)} (max {format_size(max_bytes)})"
    )
    if nbytes_after > max_bytes:
        print(f"  still over by {format_size(nbytes_after - max_bytes)}: {NEVER_EVICTED}")
    return 0


COMMAND = Command(
    name="evict",
    help="Evict the oldest finished jobs until the rest fit in --max-bytes (evict_batch_oldest).",
    run=run,
    add_arguments=add_arguments,
    values={"max_bytes": parse_size},
    readonly=dry_run,
)
