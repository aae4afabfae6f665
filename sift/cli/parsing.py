"""What the commands share on the command line: the parser, whole-number options, the ``--db`` option.

argparse takes ``-1h`` for an option, not a value (its own rule admits only plain numbers such as
``-5``): so that ``--ttl -1h`` reaches the parser of durations, which refuses it with exit status 1,
:func:`joined_negative_values` writes such a value as ``--ttl=-1h`` before argparse reads the line (and a
positional one behind ``--``).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import Any

from sift.dcache.validation import MAX_INT

from .commands import StoreUse

__all__ = ["NEGATIVE_VALUE", "Parser", "count", "joined_negative_values", "store_option"]

#: A value that starts with a minus sign and a digit (``-1h``, ``-.5h``, ``-5``): never an option of sift.
NEGATIVE_VALUE = re.compile(r"^-\.?\d")


class Parser(argparse.ArgumentParser):
    """argparse's parser, which also notes how each argument is named in messages (``--caller``,
    ``JOB_ID``) and which long options take no value (flags such as ``--json``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.flags: set[str] = set()
        self.labels: dict[str, str] = {}
        self.with_positionals: set[str] = set()  # on the whole line's parser: the commands that take one
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if not action.option_strings:
            self.labels[action.dest] = str(action.metavar or action.dest.upper())
        elif action.nargs == 0:
            self.flags.update(action.option_strings)
        return action


def joined_negative_values(
    argv: Sequence[str], commands: set[str], flags: set[str], with_positionals: set[str]
) -> list[str]:
    """``argv`` as argparse must read it for a value that looks negative, after the command's name: joined
    to the long option before it (``--ttl -1h`` as ``--ttl=-1h``) unless that option is a flag, else, for
    a command in ``with_positionals``, moved behind ``--``, which makes it positional (``show -1h`` as
    ``show -- -1h``). Anything else argparse reports as it would."""
    joined: list[str] = []
    positional: list[str] = []
    command = ""
    for at, arg in enumerate(argv):
        if command and arg == "--":
            return [*joined, arg, *positional, *argv[at + 1 :]]
        previous = joined[-1] if joined else ""
        if command and NEGATIVE_VALUE.match(arg):
            if previous.startswith("--") and "=" not in previous and previous not in flags:
                joined[-1] = f"{previous}={arg}"
                continue
            if command in with_positionals:
                positional.append(arg)
                continue
        joined.append(arg)
        if not command and arg in commands:
            command = arg
    return [*joined, "--", *positional] if positional else joined


def count(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``minimum`` to the store's largest integer."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= MAX_INT:
            raise argparse.ArgumentTypeError(
                f"must be a whole number from {minimum} to 2**63-1, got {text!r}"
            )
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


_STORE_HELP = {
    StoreUse.WRITE: "the store file, or a postgresql:// URL (default: $SIFT_DB, else ./sift.db); it must "
    "exist (`sift init` creates one)",
    StoreUse.CREATE: "the store file, or a postgresql:// URL (default: $SIFT_DB, else ./sift.db); created if "
    "missing",
    StoreUse.READ: "the store file, or a postgresql:// URL (default: $SIFT_DB, else ./sift.db); it must "
    "exist, and is only read",
    StoreUse.NEW: "a new or empty store file; one holding jobs is refused, unchanged (default: $SIFT_DB, "
    "else a new file sim.db in a new directory sift-simulate-* under $TMPDIR or /tmp; never ./sift.db)",
}


def store_option(use: StoreUse) -> Parser:
    """A parent parser holding ``--db``, with the help that says how the command uses the store."""
    parent = Parser(add_help=False)
    parent.add_argument("--db", metavar="PATH", default=argparse.SUPPRESS, help=_STORE_HELP[use])
    return parent
