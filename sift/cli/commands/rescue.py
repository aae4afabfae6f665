"""``sift rescue``: put the targets of runners that stopped renewing their claims back to pending
(``requeue_stale_claims``), failing those at their last attempt. ``--dry-run`` lists what would move
(``stale_claims``) and opens the store read-only."""

from __future__ import annotations

import argparse
from typing import Any

from sift import dcache
from sift.dcache import BatchTarget

from ..parsing import count
from ..removal import SHOWN
from ..report import Column, emit_json, format_age, format_count, plural, table
from ..units import parse_duration
from . import Command, dry_run

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument(
        "--stale-after",
        required=True,
        metavar="DURATION",
        help="a claim not renewed for this long is its runner's no more: e.g. 90s, 5m, or plain seconds",
    )
    parser.add_argument(
        "--max-attempts",
        type=count(1),
        default=3,
        metavar="N",
        help="a target's Nth stale claim fails it (default 3)",
    )
    parser.add_argument(
        "--reason", default="runner stopped", metavar="TEXT", help="the error of a failed target"
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would move; change nothing")


def _row(target: BatchTarget, max_attempts: int, now: int) -> dict[str, Any]:
    return {
        "job_id": target.job_id,
        "idx": target.idx,
        "runner": target.runner,
        "heartbeat": target.heartbeat,
        "attempts": target.attempts,
        "becomes": "failed" if target.attempts >= max_attempts else "pending",
        "age": format_age(target.heartbeat or 0, now) if target.heartbeat else "never renewed",
    }


def run(args: argparse.Namespace) -> int:
    """Requeue stale claims, or with --dry-run list them; print how many moved, and where to."""
    now = dcache.unix_now()
    stale = [_row(t, args.max_attempts, now) for t in dcache.stale_claims(args.stale_after, now=now)]
    failing = sum(1 for row in stale if row["becomes"] == "failed")
    report: dict[str, Any] = {"dry_run": args.dry_run, "stale_after_s": args.stale_after, "now": now}
    report.update(max_attempts=args.max_attempts, reason=args.reason)
    if not args.dry_run:
        moved = dcache.requeue_stale_claims(
            args.stale_after, max_attempts=args.max_attempts, reason=args.reason, now=now
        )
        report["moved"] = moved
    report.update(requeued=len(stale) - failing, failed=failing)
    if args.json:
        emit_json({**report, "targets": [{k: v for k, v in row.items() if k != "age"} for row in stale]})
        return 0
    requeue, fail = ("dry run: would requeue", "would fail") if args.dry_run else ("requeued", "failed")
    print(
        f"{requeue} {plural(len(stale) - failing, 'target')} to pending and {fail} "
        f"{format_count(failing)} at attempt {args.max_attempts} "
        f"(claims not renewed for {args.stale_after_text}){'; nothing was changed' if args.dry_run else ''}"
    )
    if stale:
        columns = [
            Column("job", "job_id", width=40),
            Column("idx", "idx", right=True),
            Column("runner", "runner", width=32),
            Column("attempts", "attempts", right=True),
            Column("last renewed", "age", right=True),
            Column("becomes", "becomes"),
        ]
        print("\n".join(table(stale[:SHOWN], columns, indent="  ")))
        if len(stale) > SHOWN:
            print(f"  … and {format_count(len(stale) - SHOWN)} more")
    return 0


COMMAND = Command(
    name="rescue",
    help="Put the targets of runners that stopped renewing their claims back to pending "
    "(requeue_stale_claims).",
    run=run,
    add_arguments=add_arguments,
    values={"stale_after": parse_duration},
    readonly=dry_run,
)
