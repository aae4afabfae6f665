"""``sift check``: the store's invariant check (``dcache.check_store``), ``--repair`` for what is derived.

Exit status 1 when anything was wrong, repaired or not: run ``sift check`` again to see the store clean.
On a terminal, a bar shows the jobs read so far.
"""

from __future__ import annotations

import argparse

from sift import dcache
from sift.dcache.integrity import REPAIRABLE
from sift.dcache.reports import Repair, Violation

from .progress import bars_enabled, make_bar
from .report import emit_json, format_count, plural

__all__ = ["cmd_check"]


def cmd_check(args: argparse.Namespace) -> int:
    # The bar's total costs a pass over the jobs: counted only when there is a bar to draw.
    total = dcache.BatchJob.select().count() if bars_enabled() else None
    with make_bar(total, "check", "job") as bar:
        report = dcache.check_store(repair=args.repair, progress=bar.update)
        bar.refresh()  # draw the finished bar once, even inside tqdm's minimum interval
    # What open_db added before the check could see it (only with --repair: a plain check opens read-only).
    for name in getattr(args, "missing_schema", []):
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
        print(f"  {violation}")
    if report.repairs:
        print(f"repaired ({format_count(len(report.repairs))}):")
        for repair in report.repairs:
            print(f"  {repair}")
    elif any(v.kind in REPAIRABLE for v in report.violations):
        print("`sift check --repair` recomputes targets_done, nbytes and the total, deletes orphan targets")
    if any(v.kind not in REPAIRABLE for v in report.violations):
        print("left for a person to decide: statuses outside the enums, idx out of range, a damaged file")
    return 1
