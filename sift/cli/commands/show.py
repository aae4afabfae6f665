"""``sift show``: a job and its targets, or one target's result; reads only."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

import peewee

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, db

from ..parsing import count
from ..report import (
    Column,
    emit_json,
    format_age,
    format_count,
    format_size,
    format_time,
    key_values,
    table_lines,
)
from ..rows import job_row, result_size
from ..store import CommandError
from . import Command, StoreUse

__all__ = ["COMMAND"]

#: How many targets text output reads per statement: memory stays bounded whatever the job's size.
PAGE = 1000

#: The table of targets in text output; only the first width + 1 characters of a cut column are read.
COLUMNS = [
    Column("idx", "idx", right=True),
    Column("status", "status"),
    Column("attempts", "attempts", right=True),
    Column("runner", "runner", width=32),
    Column("url", "url", width=60),
    Column("result bytes", "result_bytes", right=True),
    Column("error", "error", width=40),
    Column("hint", "hint", width=30),
]


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
    if args.json:
        T = BatchTarget
        query: Any = (
            T.select(
                T.idx,
                T.status,
                T.url,
                T.options,
                result_size(T.result).alias("result_bytes"),
                T.error,
                T.hint,
                *_claim_fields(),
            )
            .where(T.job_id == job.id)
            .order_by(T.idx)
            .dicts()
        )
        emit_json({"job": job_row(job), "targets": list(query)})
        return 0
    now = dcache.unix_now()
    stored = BatchTarget.select().where(BatchTarget.job_id == job.id).count()
    lines = key_values(
        [
            ("Job", job.id),
            ("Caller", f"{job.caller} ({job.caller_class})"),
            ("Idempotency key", job.idem_key or "-"),
            ("Status", job.status + (f": {job.error}" if job.error else "")),
            ("Targets done", f"{job.targets_done} of {job.targets_total} ({stored} stored)"),
            ("Result bytes", f"{format_size(job.nbytes)} ({format_count(job.nbytes)} bytes)"),
            ("Created", f"{format_time(job.created_at)}  ({format_age(job.created_at, now)})"),
            ("Lease", f"{format_time(job.lease)}  ({format_age(job.lease, now)})"),
        ]
    )
    print("\n".join(lines))
    if stored:
        print()
        for line in table_lines(lambda: _targets(job.id), COLUMNS):
            print(line)
    return 0


def _claim_fields() -> list[Any]:
    """A target's attempts and its last claim's runner; an older store opened read-only has neither
    column: its targets show 0 attempts and no runner."""
    T = BatchTarget
    if db.backend.claims_stored:
        return [T.attempts, T.runner]
    return [peewee.Value(0).alias("attempts"), peewee.SQL("NULL").alias("runner")]


def _targets(job_id: str) -> Iterator[dict[str, Any]]:
    """The job's targets in idx order with the columns the table prints, PAGE at a time by idx."""
    T = BatchTarget
    fields = {"idx": T.idx, "status": T.status, "url": T.url, "error": T.error, "hint": T.hint}
    fields.update(dict(zip(("attempts", "runner"), _claim_fields(), strict=True)))
    widths = {col.key: col.width for col in COLUMNS}
    selected: list[Any] = []
    for key, field in fields.items():
        width = widths[key]
        selected.append(field if width is None else peewee.fn.SUBSTR(field, 1, width + 1).alias(key))
    selected.append(result_size(T.result).alias("result_bytes"))
    after: int | None = None  # no lower bound at first: a foreign writer's idx may be negative
    while True:
        where = T.job_id == job_id if after is None else (T.job_id == job_id) & (T.idx > after)
        query: Any = T.select(*selected).where(where).order_by(T.idx)
        page: list[dict[str, Any]] = list(query.limit(PAGE).dicts())
        yield from page
        if len(page) < PAGE:
            return
        after = page[-1]["idx"]


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
