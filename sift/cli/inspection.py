"""The read-only commands: ``stats``, ``jobs`` and ``show``. None of them writes to the store."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import peewee

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, JobStatus, TargetStatus
from sift.dcache.clock import unix_now
from sift.dcache.space import file_backed

from .operations import space_lines, space_report
from .report import (
    Column,
    emit_json,
    format_age,
    format_count,
    format_size,
    format_time,
    key_values,
    table,
)
from .store import CommandError

__all__ = ["cmd_jobs", "cmd_show", "cmd_stats", "counts_by_status", "job_row", "result_size"]

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


def _lease_info(unix: int | None, now: int) -> dict[str, Any] | None:
    if unix is None:
        return None
    return {"unix": unix, "utc": format_time(unix), "age_s": now - unix}


# -- stats -----------------------------------------------------------------------------------------------


def cmd_stats(args: argparse.Namespace) -> int:
    now = unix_now()
    jobs = counts_by_status(BatchJob, tuple(s.value for s in JobStatus))
    targets = counts_by_status(BatchTarget, tuple(s.value for s in TargetStatus))
    leases: Any = BatchJob.select(peewee.fn.MIN(BatchJob.lease), peewee.fn.MAX(BatchJob.lease)).tuples()
    oldest, newest = leases.get()
    # The sizes as found before this command opened the file (its read-only open may add SQLite's empty
    # -wal file). A PostgreSQL store has no file of its own: its tables' sizes are shown instead.
    file_bytes, wal_bytes = args.sizes_before
    on_file = file_backed()
    report: dict[str, Any] = {
        "db": args.db,
        **({"file_bytes": file_bytes, "wal_bytes": wal_bytes} if on_file else {}),
        "nbytes": dcache.batch_nbytes(),
        "live_jobs": dcache.live_batch_jobs_total(),
        **space_report(),
        "jobs": jobs,
        "targets": targets,
        "oldest_lease": _lease_info(oldest, now),
        "newest_lease": _lease_info(newest, now),
        "counters": dcache.stats(),
    }
    if args.json:
        emit_json(report)
        return 0

    def lease_text(info: dict[str, Any] | None) -> str:
        return "-" if info is None else f"{info['utc']}  ({format_age(info['unix'], now)})"

    def size_text(n: int | None) -> str:
        return "-" if n is None else f"{format_size(n)} ({format_count(n)} bytes)"

    files = [
        ("File size", size_text(file_bytes)),
        ("WAL size", "no -wal file" if wal_bytes is None and file_bytes else size_text(wal_bytes)),
    ]
    lines = key_values(
        [
            ("Store", args.db),
            *(files if on_file else []),
            ("Result bytes", f"{size_text(report['nbytes'])}, batch_nbytes()"),
            ("Live jobs", format_count(report["live_jobs"])),
            *space_lines(report),
            ("Oldest lease", lease_text(report["oldest_lease"])),
            ("Newest lease", lease_text(report["newest_lease"])),
        ]
    )
    for title, counts in (("Jobs by status", jobs), ("Targets by status", targets)):
        rows = [{"status": s, "count": format_count(n)} for s, n in counts.items()]
        rows.append({"status": "total", "count": format_count(sum(counts.values()))})
        lines += [
            "",
            title,
            *table(rows, [Column("status", "status"), Column("count", "count", right=True)], indent="  "),
        ]
    counter_rows = [{"name": k, "value": format_count(v)} for k, v in report["counters"].items()]
    lines += [
        "",
        "Counters (stats(): this process, since it opened the store)",
        *table(counter_rows, [Column("counter", "name"), Column("value", "value", right=True)], indent="  "),
    ]
    print("\n".join(lines))
    return 0


# -- jobs ------------------------------------------------------------------------------------------------


def cmd_jobs(args: argparse.Namespace) -> int:
    now = unix_now()
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


# -- show ------------------------------------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    job = dcache.batch_job(args.job_id)
    if job is None:
        raise CommandError(f"job_id: no job {args.job_id!r} in {args.db}")
    if args.result is not None:
        return _show_result(args, job)
    now = unix_now()
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
