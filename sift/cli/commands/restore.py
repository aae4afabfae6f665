"""``sift restore``: copy every job and target of a SQLite store file into an empty store."""

from __future__ import annotations

import argparse

from sift import dcache

from ..progress import make_bar
from ..report import emit_json, format_count
from . import Command

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument("source", metavar="SOURCE", help="the SQLite store file to copy from (only read)")


def run(args: argparse.Namespace) -> int:
    """Copy SOURCE's rows into the empty store, with a bar of the rows copied."""
    with make_bar(None, "restore", unit="row") as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        done = dcache.restore_store(args.source, progress=progress)
        bar.refresh()
    if args.json:
        emit_json({"db": args.db, "source": done.source, "jobs": done.jobs, "targets": done.targets})
        return 0
    print(
        f"restored {format_count(done.jobs)} jobs and {format_count(done.targets)} targets "
        f"from {done.source} into {args.db}"
    )
    return 0


COMMAND = Command(
    name="restore",
    help="Copy every job and target of the SQLite store file SOURCE (a backup) into the store, which must "
    "hold none: in one transaction, so a refused row leaves it empty. With --db postgresql://..., "
    "this moves a SQLite store to PostgreSQL.",
    run=run,
    add_arguments=add_arguments,
)
