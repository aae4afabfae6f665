"""``sift stats``: jobs and targets by status, stored bytes, leases, file sizes, paused jobs and callers and
hosts backed off, the busiest callers and hosts; reads only.

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

from ..parsing import count
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

#: --top when none is given.
TOP_DEFAULT = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument(
        "--counters",
        action="store_true",
        help="also list this process's stats() counters when they are all zero (as in a fresh sift "
        "process); --json always holds them",
    )
    parser.add_argument(
        "--top",
        metavar="N",
        type=count(1),
        default=TOP_DEFAULT,
        help="list the N callers with the most pending and running targets and the N hosts with the most "
        "running targets; the rest are summed in one row (default %(default)s)",
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
        "load": dcache.store_load(callers=args.top, hosts=args.top).as_dict(),
        "paused": _paused(now),
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
            ("Paused", _paused_text(report["paused"])),
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
    lines += _load_lines(report["load"])
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


def _paused(now: int) -> dict[str, list[str]]:
    """The paused live jobs and the paused callers, and the hosts backed off at ``now``."""
    return {
        "jobs": dcache.paused_jobs(),
        "callers": dcache.paused_callers(),
        "backed_off_hosts": dcache.backed_off_hosts(now=now),
    }


def _paused_text(paused: dict[str, list[str]]) -> str:
    jobs, callers, hosts = (len(paused[key]) for key in ("jobs", "callers", "backed_off_hosts"))
    return f"{jobs:,} jobs, {callers:,} callers; {hosts:,} hosts backed off (sift hosts)"


def _load_lines(load: dict[str, Any]) -> list[str]:
    """The callers with the most outstanding targets, and the hosts with the most running, each list ending
    in the sum of the rest when there is a rest."""
    callers = [{**row, "name": row["caller"]} for row in load["callers"]]
    if load["more_callers"]:
        other = load["other_callers"]
        callers.append({**other, "name": f"{load['more_callers']:,} other callers"})
    hosts = [{**row, "name": row["host"]} for row in load["hosts"]]
    if load["more_hosts"]:
        hosts.append({**load["other_hosts"], "name": f"{load['more_hosts']:,} other hosts"})
    lines = ["", "Callers (targets of their queued and running jobs)"]
    if callers:
        rows = [
            {"name": r["name"], "pending": format_count(r["pending"]), "running": format_count(r["running"])}
            for r in callers
        ]
        columns = [
            Column("caller", "name"),
            Column("pending", "pending", right=True),
            Column("running", "running", right=True),
        ]
        lines += table(rows, columns, indent="  ")
    else:
        lines.append("  none: no job is queued or running")
    lines += ["", "Busiest hosts (running targets)"]
    if hosts:
        host_rows = [{"name": r["name"], "running": format_count(r["running"])} for r in hosts]
        lines += table(
            host_rows, [Column("host", "name"), Column("running", "running", right=True)], indent="  "
        )
    else:
        lines.append("  none: no target is running")
    return lines


COMMAND = Command(
    name="stats",
    help="Jobs and targets by status, stored bytes, oldest and newest lease, file and WAL size, the busiest "
    "callers (pending and running targets) and hosts (running targets); this process's counters with "
    "--counters (or when not all zero).",
    run=run,
    add_arguments=add_arguments,
    store=StoreUse.READ,
    prepare=_sizes_before,
)
