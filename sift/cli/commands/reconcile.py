"""``sift reconcile``: after a crash, fail every queued or running job (``mark_in_flight_failed``)."""

from __future__ import annotations

import argparse

from sift import dcache

from ..report import emit_json, format_count
from . import Command

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument("--reason", required=True, metavar="TEXT", help="the error stored on each job")


def run(args: argparse.Namespace) -> int:
    """Mark every queued or running job failed with --reason; print how many."""
    marked = dcache.mark_in_flight_failed(args.reason)
    if args.json:
        emit_json({"marked": marked, "reason": args.reason})
        return 0
    print(f"marked {format_count(marked)} queued or running jobs as failed, with error {args.reason!r}")
    return 0


COMMAND = Command(
    name="reconcile",
    help="After a crash: fail every queued or running job (mark_in_flight_failed).",
    run=run,
    add_arguments=add_arguments,
)
