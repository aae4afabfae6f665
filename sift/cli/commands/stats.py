"""``sift stats``: jobs and targets by status, stored bytes, leases, file sizes; reads only.

What the store holds comes first; this process's ``stats()`` counters (zero in a fresh ``sift`` process,
whatever the store holds) are shown only with ``--counters`` or when one is not zero. ``--json`` always
holds them, under ``counters``."""

from __future__ import annotations

import argparse
from typing import Any

import peewee

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, JobStatus, TargetStatus
from sift.dcache.space import file_backed

from ..report import (
    Column,
    emit_json,
    format_age,
    format_count,
    format_size,
    format_time,
    key_values,
    table,
    utc_text,
)
from ..rows import counts_by_status
from ..space import space_lines, space_report
from ..store import file_sizes
from . import Command, StoreUse

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument(
        "--counters",
        action="store_true",
        help="also list this process's stats() counters when they are all zero (as in a fresh sift "
        "process); --json always holds them",
    )


def _sizes_before(args: argparse.Namespace) -> None:
    """The sizes of the store's files as found, before the read-only open may add SQLite's empty -wal."""
    args.sizes_before = file_sizes(args.db)


def _lease_info(unix: int | None, now: int) -> dict[str, Any] | None:
    """A lease as its number, its UTC text (None when no date can show it) and its age in seconds."""
    if unix is None:
        return None
    return {"unix": unix, "utc": utc_text(unix), "age_s": now - unix}


def run(args: argparse.Namespace) -> int:
    """The store's counts, sizes, leases and this process's counters."""
    now = dcache.unix_now()
    jobs = counts_by_status(BatchJob, tuple(s.value for s in JobStatus))
    targets = counts_by_status(BatchTarget, tuple(s.value for s in TargetStatus))
    leases: Any = BatchJob.select(peewee.fn.MIN(BatchJob.lease), peewee.fn.MAX(BatchJob.lease)).tuples()
    oldest, newest = leases.get()
    # A PostgreSQL store has no file of its own: its tables' sizes are shown instead.
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
        return "-" if info is None else f"{format_time(info['unix'])}  ({format_age(info['unix'], now)})"

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
    counters: dict[str, int] = report["counters"]
    if not args.counters and not any(counters.values()):
        print("\n".join(lines))
        return 0
    counter_rows = [{"name": k, "value": format_count(v)} for k, v in counters.items()]
    lines += [
        "",
        "Counters (stats(): this process, since it opened the store)",
        *table(counter_rows, [Column("counter", "name"), Column("value", "value", right=True)], indent="  "),
    ]
    print("\n".join(lines))
    return 0


COMMAND = Command(
    name="stats",
    help="Jobs and targets by status, stored bytes, oldest and newest lease, file and WAL size; this "
    "process's counters with --counters (or when not all zero).",
    run=run,
    add_arguments=add_arguments,
    store=StoreUse.READ,
    prepare=_sizes_before,
)
