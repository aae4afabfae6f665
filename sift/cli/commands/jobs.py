"""``sift jobs``: one line per job, newest first; reads only."""

from __future__ import annotations

import argparse

from sift import dcache
from sift.dcache import BatchJob, JobStatus

from ..parsing import count
from ..report import Column, emit_json, format_age, format_size, format_time, table
from ..rows import job_row
from . import Command, StoreUse

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument("--caller", metavar="C", help="only this caller's jobs")
    statuses = [s.value for s in JobStatus]
    parser.add_argument(
        "--status", metavar="S", choices=statuses, help=f"only jobs in this status: {', '.join(statuses)}"
    )
    parser.add_argument(
        "--limit", metavar="N", type=count(0), default=20, help="at most N jobs (default 20; 0: all)"
    )


def run(args: argparse.Namespace) -> int:
    """The jobs that match, newest first, at most --limit of them."""
    now = dcache.unix_now()
    query = BatchJob.select()
    if args.caller is not None:
        query = query.where(BatchJob.caller == args.caller)
    if args.status is not None:
        query = query.where(BatchJob.status == args.status)
    total = query.count()
    # Insertion order: among jobs created in the same second, the later insert counts as newer.
    query = query.order_by(BatchJob.created_at.desc(), dcache.db.backend.insertion_order.desc())
    if args.limit:
        query = query.limit(args.limit)
    jobs = [job_row(job) for job in query]
    if args.json:
        emit_json(jobs)
        return 0
    if not jobs:
        print("no jobs" + ("" if total == 0 else f" (of {total})"))
        return 0
    rows = [
        {
            "id": job["id"],
            "caller": job["caller"],
            "class": job["caller_class"],
            "status": job["status"],
            "done": f"{job['targets_done']}/{job['targets_total']}",
            "bytes": format_size(job["nbytes"]),
            "created": format_time(job["created_at"]),
            "lease": format_age(job["lease"], now),
        }
        for job in jobs
    ]
    columns = [
        Column("id", "id", width=40),
        Column("caller", "caller", width=24),
        Column("class", "class"),
        Column("status", "status"),
        Column("done/total", "done", right=True),
        Column("bytes", "bytes", right=True),
        Column("created", "created"),
        Column("lease age", "lease", right=True),
    ]
    lines = table(rows, columns)
    if len(jobs) < total:
        lines.append(f"({len(jobs)} of {total} jobs, newest first; --limit 0 shows all)")
    print("\n".join(lines))
    return 0


COMMAND = Command(
    name="jobs",
    help="One line per job, newest first.",
    run=run,
    store=StoreUse.READ,
    add_arguments=add_arguments,
)
