"""The bench's command line: which groups run on which stores, at which sizes, and where the report goes."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from sift import dcache

from . import __doc__ as bench_doc
from . import compare
from .cases.claims import bench_claims, pg_claims
from .cases.contention import bench_contention, pg_contention
from .cases.disk import bench_disk
from .cases.fairness import bench_fairness, pg_fairness
from .cases.flat import bench_flat, pg_flat
from .cases.hooks import bench_hooks
from .cases.instructions import bench_instructions
from .cases.locks import bench_locks
from .cases.memory import bench_memory, rss_child
from .cases.ops import bench_ops
from .cases.pages import bench_pages, pg_pages
from .cases.peers import bench_peers, pg_peers
from .cases.plugin import bench_testing
from .cases.polite import bench_polite, pg_polite
from .cases.raw import bench_raw, pg_raw
from .cases.simulate import pg_simulate
from .cases.tail import bench_tail
from .cases.wait import bench_wait, pg_wait
from .cases.web import bench_web, pg_web
from .cases.writers import pg_writers
from .harness import Report, log, machine, print_report, write_json
from .sizes import FULL, QUICK, Sizes
from .stores import DEFAULT_POSTGRES, PgServer, postgres_missing

#: The groups of each kind of store, in the order they run.
SQLITE_GROUPS: dict[str, Callable[[Path, Sizes, Report], None]] = {
    "flat": bench_flat,
    "raw": bench_raw,
    "locks": bench_locks,
    "memory": bench_memory,
    "testing": bench_testing,
    "hooks": bench_hooks,
    "ops": bench_ops,
    "disk": bench_disk,
    "claims": bench_claims,
    "tail": bench_tail,
    "peers": bench_peers,
    "fairness": bench_fairness,
    "wait": bench_wait,
    "pages": bench_pages,
    "instructions": bench_instructions,
    "web": bench_web,
    "polite": bench_polite,
    "contention": bench_contention,
}
PG_GROUPS: dict[str, Callable[[PgServer, Sizes, Report], None]] = {
    "flat": pg_flat,
    "raw": pg_raw,
    "writers": pg_writers,
    "claims": pg_claims,
    "simulate": pg_simulate,
    "peers": pg_peers,
    "fairness": pg_fairness,
    "wait": pg_wait,
    "pages": pg_pages,
    "web": pg_web,
    "polite": pg_polite,
    "contention": pg_contention,
}
#: How the report names the command that made it.
COMMAND = "python scripts/bench"


def choose_stores(
    parser: argparse.ArgumentParser, dbs: list[str] | None, wants_pg: bool
) -> tuple[bool, str | None]:
    """Whether to run the SQLite part, and the PostgreSQL URL to run the other part on (or None; always
    None unless ``wants_pg``: a PostgreSQL group is among those to run).

    With --db, exactly what it names. Without, SQLite, and PostgreSQL at $SIFT_TEST_POSTGRES (the test
    server by default) when a server answers there; one line says so when none does, except under CI
    (CI=true), where that is an error, as in the test suite."""
    if dbs:
        urls = [d for d in dbs if d.startswith(("postgresql://", "postgres://"))]
        if unknown := [d for d in dbs if d != "sqlite" and d not in urls]:
            parser.error(f"--db {unknown[0]}: give sqlite or a postgresql:// URL")
        if len(set(urls)) > 1:
            parser.error("--db: one PostgreSQL URL at a time")
        query = urllib.parse.parse_qsl(urllib.parse.urlsplit(urls[0]).query) if urls else []
        if any(key == "schema" for key, _ in query):
            parser.error(f"--db {urls[0]}: drop ?schema=, the bench makes schemas of its own")
        if urls and (why := postgres_missing(urls[0])):
            parser.error(f"--db {urls[0]}: {why}")
        return "sqlite" in dbs, urls[0] if urls and wants_pg else None
    if not wants_pg:
        return True, None
    why = postgres_missing(DEFAULT_POSTGRES)
    if why is None:
        return True, DEFAULT_POSTGRES
    if os.environ.get("CI") == "true":
        parser.error(f"CI=true and {why} (set SIFT_TEST_POSTGRES, or --db sqlite for SQLite alone)")
    log(f"PostgreSQL part skipped: {why} (set SIFT_TEST_POSTGRES or --db)")
    return True, None


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The options; a usage error (exit 2) for a combination that cannot run."""
    parser = argparse.ArgumentParser(
        prog=COMMAND, description=bench_doc.split("\n\n")[0] if bench_doc else None
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (CI smoke run)")
    parser.add_argument("--json", metavar="FILE", type=Path, help="also write the figures to FILE")
    parser.add_argument("--check", action="store_true", help="exit 1 if a goal fails")
    parser.add_argument(
        "--db",
        action="append",
        metavar="TARGET",
        help="sqlite, or a postgresql:// URL (fresh schemas there, dropped at the end); repeatable. "
        "Default: sqlite, and $SIFT_TEST_POSTGRES (or postgresql://postgres@127.0.0.1:5432/test) "
        "when a server answers there",
    )
    parser.add_argument(
        "--only",
        choices=list(dict.fromkeys([*SQLITE_GROUPS, *PG_GROUPS])),
        action="append",
        help="run only these groups (repeatable)",
    )
    parser.add_argument(
        "--compare-with",
        metavar="REV",
        help="instead of the groups: time the hot paths of this tree's sift and of git revision REV's "
        "(checked out in a temporary worktree), side by side in one run, and print this tree / REV",
    )
    parser.add_argument("--rss-child", nargs=2, metavar=("PATH", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compare_with is not None and args.only:
        parser.error("--compare-with runs the hot paths only; leave --only out")
    return parser, args


def main(argv: list[str] | None = None) -> int:
    """Run the bench; 0, or 1 with --check when a goal fails (never on the figures otherwise)."""
    parser, args = parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child[0], int(args.rss_child[1]))
        return 0
    sizes = QUICK if args.quick else FULL
    command = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
    report = Report()
    info = machine()
    head: dict[str, object] = {}
    started = time.perf_counter()
    if args.compare_with is not None:
        commit = compare.resolve(parser, args.compare_with)
        run_sqlite, pg_url = choose_stores(parser, args.db, True)
        backends = compare.run(args.compare_with, commit, sizes, run_sqlite, pg_url, report, info)
        head = {"compare_with": args.compare_with, "commit": commit, "worktree": info.pop("worktree")}
    else:
        groups = args.only or [*SQLITE_GROUPS, *PG_GROUPS]
        run_sqlite, pg_url = choose_stores(parser, args.db, any(group in PG_GROUPS for group in groups))
        run_sqlite = run_sqlite and any(group in SQLITE_GROUPS for group in groups)
        backends = run_groups(groups, sizes, run_sqlite, pg_url, report, info)
    elapsed = time.perf_counter() - started
    if args.compare_with is not None:
        print(f"this tree ({compare.REPO}) against {args.compare_with} ({commit}): ratios are this / base")
    print_report(report, info)
    print(f"\n{command}: {elapsed:.0f} s")
    if args.json:
        write_json(
            args.json,
            report,
            command=command,
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(time.time() - elapsed)),
            load_average=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            quick=args.quick,
            elapsed_s=elapsed,
            machine=info,
            backends=backends,
            sizes=asdict(sizes),
            **head,
        )
    failed = [g for g in report.goals if g.verdict == "FAIL"]
    return 1 if args.check and failed else 0


def run_groups(
    groups: list[str],
    sizes: Sizes,
    run_sqlite: bool,
    pg_url: str | None,
    report: Report,
    info: dict[str, object],
) -> list[str]:
    """Run the chosen groups: SQLite's in a temporary directory, then PostgreSQL's in schemas of their own;
    the kinds of store measured."""
    if run_sqlite:
        with tempfile.TemporaryDirectory(prefix="sift-bench-") as tmp_name:
            tmp = Path(tmp_name)
            for group, run in SQLITE_GROUPS.items():
                if group in groups:
                    t0 = time.perf_counter()
                    run(tmp, sizes, report)
                    log(f"{group}: {time.perf_counter() - t0:.1f} s")
                    for suffix in ("", "-wal", "-shm", "-lock"):  # free the disk between groups
                        for p in tmp.glob(f"*.db{suffix}"):
                            p.unlink()
    if pg_url is not None:
        server = PgServer(pg_url)
        info["postgresql"] = server.version
        info["postgresql_schemas"] = f"{server.tag}_*"  # all dropped at the end
        try:
            for group, pg_run in PG_GROUPS.items():
                if group in groups:
                    t0 = time.perf_counter()
                    pg_run(server, sizes, report)
                    log(f"pg {group}: {time.perf_counter() - t0:.1f} s")
        finally:
            dcache.close_db()
            server.close()
    return ["sqlite"] * run_sqlite + ["postgresql"] * (pg_url is not None)
