"""``sift show``: a job and its targets, or one target's result; reads only."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sift import dcache
from sift.dcache import BatchJob, BatchTarget

from ..parsing import count
from ..report import Column, emit_json, format_age, format_count, format_size, format_time, key_values, table
from ..rows import job_row, result_size
from ..store import CommandError
from . import Command, StoreUse

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument("job_id", metavar="JOB_ID")
    parser.add_argument(
        "--result", metavar="IDX", type=count(0), help="print the result of target IDX instead"
    )


def run(args: argparse.Namespace) -> int:
    """The job and its targets, or with --result one target's result as stored."""
    job = dcache.batch_job(args.job_id)
    if job is None:
        raise CommandError(f"job_id: no job {args.job_id!r} in {args.db}")
    if args.result is not None:
        return _show_result(args, job)
    now = dcache.unix_now()
    T = BatchTarget
    query: Any = (
        T.select(
            T.idx, T.status, T.url, T.options, result_size(T.result).alias("result_bytes"), T.error, T.hint
        )
        .where(T.job_id == job.id)
        .order_by(T.idx)
        .dicts()
    )
    targets: list[dict[str, Any]] = list(query)
    if args.json:
        emit_json({"job": job_row(job), "targets": targets})
        return 0
    lines = key_values(
        [
            ("Job", job.id),
            ("Caller", f"{job.caller} ({job.caller_class})"),
            ("Idempotency key", job.idem_key or "-"),
            ("Status", job.status + (f": {job.error}" if job.error else "")),
            ("Targets done", f"{job.targets_done} of {job.targets_total} ({len(targets)} stored)"),
            ("Result bytes", f"{format_size(job.nbytes)} ({format_count(job.nbytes)} bytes)"),
            ("Created", f"{format_time(job.created_at)}  ({format_age(job.created_at, now)})"),
            ("Lease", f"{format_time(job.lease)}  ({format_age(job.lease, now)})"),
        ]
    )
    if targets:
        columns = [
            Column("idx", "idx", right=True),
            Column("status", "status"),
            Column("url", "url", width=60),
            Column("result bytes", "result_bytes", right=True),
            Column("error", "error", width=40),
            Column("hint", "hint", width=30),
        ]
        lines += ["", *table(targets, columns)]
    print("\n".join(lines))
    return 0


def _show_result(args: argparse.Namespace, job: BatchJob) -> int:
    T = BatchTarget
    row = T.select(T.status, T.result).where((T.job_id == job.id) & (T.idx == args.result)).tuples().first()
    if row is None:
        raise CommandError(f"--result: job {job.id!r} has no target {args.result}")
    status, result = row
    if args.json:
        emit_json({"job_id": job.id, "idx": args.result, "status": status, "result": result})
        return 0
    if result is None:
        raise CommandError(
            f"--result: target {args.result} of job {job.id!r} has no result (status {status})"
        )
    sys.stdout.write(result if result.endswith("\n") else result + "\n")
    return 0


COMMAND = Command(
    name="show",
    help="A job and its targets.",
    run=run,
    store=StoreUse.READ,
    add_arguments=add_arguments,
)
