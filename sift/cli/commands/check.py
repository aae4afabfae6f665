"""``sift check``: the store's invariant check (``dcache.check_store``), ``--repair`` for what is derived.

Exit status 1 when anything was wrong, repaired or not: run ``sift check`` again to see the store clean.
On a terminal, a bar shows the jobs read so far.
"""

from __future__ import annotations

import argparse
import os

from sift import dcache
from sift.dcache.integrity import REPAIRABLE
from sift.dcache.reports import Repair, Violation

from ..progress import bars_enabled, make_bar
from ..report import emit_json, format_count, plural, terminal_safe
from ..store import CommandError, is_postgres, missing_schema, no_store, opened
from . import Command

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument(
        "--repair",
        action="store_true",
        help="recompute targets_done, nbytes and the byte total, and delete orphan targets",
    )


def prepare(args: argparse.Namespace) -> None:
    """``check`` reads the store as it is: it must exist (``--repair`` too: a typo must not make a store),
    and what open_db would add to the schema is named, by the check or as repaired, not added silently.
    On PostgreSQL the read-only open finds no store in an empty schema, and check_store itself names
    (and with --repair creates) what is missing: open_db adds nothing to a store that has its version row."""
    if is_postgres(args.db):
        args.missing_schema = []
        if args.repair:  # the store must exist: a typo in the schema's name must not make a new store
            with opened(args.db, readonly=True):
                pass
        return
    if args.db != ":memory:" and not os.path.isfile(args.db):
        raise no_store(args.db)
    args.missing_schema = missing_schema(args.db) if args.db != ":memory:" else []
    if args.missing_schema and not args.repair:
        raise CommandError(
            f"{args.db} lacks {', '.join(args.missing_schema)} (written by another program or an older "
            "sift?): `sift check --repair` adds what is missing, then checks the rest"
        )


def reads_only(args: argparse.Namespace) -> bool:
    """Without ``--repair`` the check only reads."""
    return not args.repair


def run(args: argparse.Namespace) -> int:
    """Run check_store, print what it found (and repaired); 1 if anything was wrong."""
    # The bar's total costs a pass over the jobs: counted only when there is a bar to draw.
    total = dcache.BatchJob.select().count() if bars_enabled() else None
    with make_bar(total, "check", "job") as bar:
        report = dcache.check_store(repair=args.repair, progress=bar.update)
        bar.refresh()  # draw the finished bar once, even inside tqdm's minimum interval
    # What open_db added before the check could see it (only with --repair: a plain check opens read-only).
    for name in args.missing_schema:
        report.violations.insert(0, Violation("schema", None, f"{name} is missing"))
        report.repairs.insert(0, Repair("schema", None, f"created {name}"))
    if args.json:
        emit_json(report.as_dict())
        return 0 if report.ok else 1
    read = f"{plural(report.jobs, 'job')} and {plural(report.targets, 'target')}"
    if report.ok:
        print(f"ok: {read} in {args.db}, no problem found")
        return 0
    print(f"{plural(len(report.violations), 'problem')} in {args.db} ({read}):")
    for violation in report.violations:
        print(f"  {terminal_safe(str(violation))}")
    if report.repairs:
        print(f"repaired ({format_count(len(report.repairs))}):")
        for repair in report.repairs:
            print(f"  {terminal_safe(str(repair))}")
    elif any(v.kind in REPAIRABLE for v in report.violations):
        print("`sift check --repair` recomputes targets_done, nbytes and the total, deletes orphan targets")
    if any(v.kind not in REPAIRABLE for v in report.violations):
        print("left for a person to decide: statuses outside the enums, idx out of range, a damaged file")
    return 1


COMMAND = Command(
    name="check",
    help="Check the store's invariants (check_store); exit 1 if one is off.",
    run=run,
    add_arguments=add_arguments,
    prepare=prepare,
    readonly=reads_only,
)
