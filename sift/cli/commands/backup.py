"""``sift backup``: a consistent snapshot of the store, written while others go on writing."""

from __future__ import annotations

import argparse

from sift import dcache
from sift.dcache.space import file_backed

from ..progress import step_bar
from ..report import emit_json, format_count, format_size
from . import Command

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument(
        "dest", metavar="DEST", help="the backup file to write (a regular file, replaced if it exists)"
    )


def _backup_postgres(args: argparse.Namespace) -> int:
    """PostgreSQL: a SQLite store file from one snapshot; the bar counts rows."""
    with step_bar("backup", unit="row") as progress:
        done = dcache.backup_store(args.dest, progress=progress)
    report = {"db": args.db, "dest": done.dest, "pages": done.pages, "bytes": done.nbytes}
    if args.json:
        emit_json(report)
        return 0
    print(
        f"backed up {args.db} to {done.dest}: a SQLite store of {format_size(done.nbytes)} "
        f"({format_count(done.pages)} pages), the store as it was when the copy started"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    """A page copy of a SQLite file; from PostgreSQL, a SQLite store file written from one snapshot."""
    if not file_backed():
        return _backup_postgres(args)
    space = dcache.store_space()
    size = space.page_size
    # The total is the snapshot's size: writes since store_space() may have changed it.
    bar = step_bar(
        "backup", total=space.page_count * size, scale=size, unit="B", unit_scale=True, unit_divisor=1024
    )
    with bar as progress:
        done = dcache.backup_store(args.dest, progress=progress)
    report = {"db": args.db, "dest": done.dest, "pages": done.pages, "bytes": done.nbytes}
    if args.json:
        emit_json(report)
        return 0
    print(
        f"backed up {args.db} to {done.dest}: {format_size(done.nbytes)} ({format_count(done.pages)} pages), "
        "the store as it was when the copy started"
    )
    return 0


COMMAND = Command(
    name="backup",
    help="Copy the store to DEST while others go on writing: a consistent snapshot, renamed into place only "
    "once complete (a new DEST gets mode 0600).",
    run=run,
    add_arguments=add_arguments,
)
