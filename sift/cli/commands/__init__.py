"""The commands of ``sift``, one module each; this package holds only what a command declares.

Each module defines ``COMMAND``, a :class:`Command`: its name and help, its arguments, how it uses the
store, and the function that runs it. The dispatcher (:mod:`sift.cli`) reads these facts; it knows no
command by name. A command module imports no other command module.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Command", "StoreUse", "dry_run", "never", "no_arguments", "nothing_to_prepare"]


class StoreUse(Enum):
    """How a command uses the store named by ``--db``, which also chooses that option's help."""

    READ = "read"  #: it must exist and is only read
    WRITE = "write"  #: it must exist (a missing one is refused, not created); a dry run reads only
    CREATE = "create"  #: created if missing
    NEW = "new"  #: a new or empty store: one holding jobs is refused


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """A command without arguments of its own."""


def nothing_to_prepare(args: argparse.Namespace) -> None:
    """A command that needs no check before the store opens."""


def never(args: argparse.Namespace) -> bool:
    """A command that opens the store for writing."""
    return False


def dry_run(args: argparse.Namespace) -> bool:
    """A command whose ``--dry-run`` only reads."""
    return bool(args.dry_run)


@dataclass(frozen=True)
class Command:
    """One ``sift`` command, as the dispatcher sees it.

    ``values``: options typed as text and parsed by the command itself (sizes, durations), so a bad value
    exits 1 with one line, not 2 with argparse's usage. ``prepare`` runs before the store opens (checks
    that must not open it, or that refuse it). ``readonly`` says whether this call opens the store
    read-only: then it is never created nor written to.
    """

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    store: StoreUse = StoreUse.WRITE
    add_arguments: Callable[[argparse.ArgumentParser], None] = no_arguments
    json: bool = True
    values: Mapping[str, Callable[[str, str], int]] = field(default_factory=dict)
    prepare: Callable[[argparse.Namespace], None] = nothing_to_prepare
    readonly: Callable[[argparse.Namespace], bool] = never
    epilog: str | None = None
