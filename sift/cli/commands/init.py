"""``sift init``: create a new, empty store; an existing one is left exactly as it is."""

from __future__ import annotations

import argparse

from ..report import emit_json
from ..store import CommandError, opened
from . import Command, StoreUse

__all__ = ["COMMAND"]


def prepare(args: argparse.Namespace) -> None:
    """Whether a store is there already, found by opening it read-only (which never creates one); one that
    cannot be opened (not a store, damaged, locked) is that error, exit 1."""
    try:
        with opened(args.db, readonly=True):
            args.existed = True
    except CommandError:  # opened's "no store at ...": the only CommandError it raises
        args.existed = False


def reads_only(args: argparse.Namespace) -> bool:
    """An existing store is only opened read-only: init never changes it."""
    return bool(args.existed)


def run(args: argparse.Namespace) -> int:
    """Say whether the store was created or was there already (exit 0 either way)."""
    if args.json:
        emit_json({"db": args.db, "created": not args.existed})
    elif args.existed:
        print(f"a store already exists at {args.db}; left unchanged")
    else:
        print(f"created a new store at {args.db}")
    return 0


COMMAND = Command(
    name="init",
    help="Create a new, empty store (a SQLite file, or a PostgreSQL schema with its tables); the other "
    "commands, but restore and simulate, refuse a missing one. An existing store is left unchanged "
    "(exit 0).",
    run=run,
    store=StoreUse.CREATE,
    prepare=prepare,
    readonly=reads_only,
)
