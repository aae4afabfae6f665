"""``sift restore``: copy every job and target of a SQLite store file into an empty store."""

from __future__ import annotations

import argparse

from sift import dcache

from ..progress import step_bar
from ..report import emit_json, plural
from ..store import new_store_remover
from . import Command, StoreUse

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument("source", metavar="SOURCE", help="the SQLite store file to copy from (only read)")


def prepare(args: argparse.Namespace) -> None:
    """Note what of the destination is missing now: a failed restore removes the store it created."""
    args.remove_new_store = new_store_remover(args.db)


def run(args: argparse.Namespace) -> int:
    """Copy SOURCE's rows into the empty store; if that fails, the store it created is removed again."""
    try:
        return _copy(args)
    except BaseException:
        dcache.close_db()  # a store's files or schema can go only once it is closed
        args.remove_new_store()
        raise


def _copy(args: argparse.Namespace) -> int:
    """Copy SOURCE's rows into the empty store, with a bar of the rows copied."""
    with step_bar("restore", unit="row") as progress:
        done = dcache.restore_store(args.source, progress=progress)
    if args.json:
        emit_json({"db": args.db, "source": done.source, "jobs": done.jobs, "targets": done.targets})
        return 0
    print(
        f"restored {plural(done.jobs, 'job')} and {plural(done.targets, 'target')} "
        f"from {done.source} into {args.db}"
    )
    return 0


COMMAND = Command(
    name="restore",
    help="Copy every job and target of the SQLite store file SOURCE (a backup) into the store, which must "
    "hold none: in one transaction, so a refused row leaves it empty. With --db postgresql://..., "
    "this moves a SQLite store to PostgreSQL. A missing store is created, and removed again if the "
    "restore fails.",
    run=run,
    store=StoreUse.CREATE,
    add_arguments=add_arguments,
    prepare=prepare,
)
