"""``sift reconcile``: after a crash, fail every queued or running job (``mark_in_flight_failed``).

It asks first when stdin is a terminal (``--yes`` answers for a script run from one); ``--dry-run`` lists the
jobs it would fail and opens the store read-only.
"""

from __future__ import annotations

import argparse
import sys

from sift import dcache
from sift.dcache import BatchJob, JobStatus

from ..removal import listing
from ..report import emit_json, format_count
from . import Command, dry_run

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument("--reason", required=True, metavar="TEXT", help="the error stored on each job")
    parser.add_argument("--dry-run", action="store_true", help="list the jobs it would fail; change nothing")
    parser.add_argument("--yes", action="store_true", help="do not ask on a terminal (for scripts)")


def _live_jobs() -> list[BatchJob]:
    live = [JobStatus.QUEUED.value, JobStatus.RUNNING.value]
    return list(BatchJob.select().where(BatchJob.status.in_(live)).order_by(BatchJob.created_at, BatchJob.id))


def _confirmed(count: int) -> bool:
    """On a terminal, the user's yes; elsewhere (a pipe, a service) yes: nobody is there to answer."""
    if not (hasattr(sys.stdin, "isatty") and sys.stdin.isatty()):
        return True
    print(f"fail {format_count(count)} queued or running jobs? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def run(args: argparse.Namespace) -> int:
    """Mark every queued or running job failed with --reason, once confirmed; print how many."""
    if args.dry_run:
        jobs = _live_jobs()
        if args.json:
            emit_json(
                {
                    "dry_run": True,
                    "jobs": len(jobs),
                    "job_ids": [job.id for job in jobs],
                    "reason": args.reason,
                }
            )
            return 0
        print(
            f"dry run: would mark {format_count(len(jobs))} queued or running jobs as failed; "
            "nothing was changed"
        )
        if jobs:
            print("\n".join(listing(jobs, dcache.unix_now())))
        return 0
    if not args.yes and not _confirmed(dcache.live_batch_jobs_total()):
        print("nothing was changed", file=sys.stderr)
        return 1
    marked = dcache.mark_in_flight_failed(args.reason)
    if args.json:
        emit_json({"marked": marked, "reason": args.reason})
        return 0
    print(f"marked {format_count(marked)} queued or running jobs as failed, with error {args.reason!r}")
    return 0


COMMAND = Command(
    name="reconcile",
    help="After a crash: fail every queued or running job (mark_in_flight_failed); asks on a terminal.",
    run=run,
    add_arguments=add_arguments,
    readonly=dry_run,
)
