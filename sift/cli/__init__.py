"""The ``sift`` command: inspect, maintain and explore a batch store, and run a simulated workload.

Built on the public functions of :mod:`sift.dcache` and its models; the store is a SQLite file or a
PostgreSQL URL (simulate there works in a schema of its own). Only init, restore and simulate create a
store; every other command refuses a missing one and creates nothing. The commands that only read (stats,
jobs, show, and the dry runs of sweep and evict) open the store read-only; simulate never changes a store
holding jobs it did not make. Errors the user caused (an unknown job id, a bad or
negative duration or size, no store at the path a command names, a file that is not a store or
stays locked, a store simulate refuses) and failures of the store (a full disk, a damaged file: the store
raises them as ``BatchError`` too) print one line on standard error and exit 1; usage errors exit 2,
as argparse does.

This module parses the line, opens the store as the command declares, runs the command and maps what
went wrong to an exit status; each command lives in :mod:`sift.cli.commands`.
"""

from __future__ import annotations

import argparse
import os
import sys

from sift import __version__
from sift.dcache import BatchError

from .commands import (
    Command,
    StoreUse,
    backup,
    check,
    evict,
    hosts,
    init,
    jobs,
    pause,
    reconcile,
    rescue,
    restore,
    resume,
    run,
    shell,
    show,
    simulate,
    stats,
    sweep,
    vacuum,
    web,
)
from .parsing import Parser, joined_negative_values, store_option
from .store import CommandError, default_db_path, is_postgres, opened
from .units import BadValue

__all__ = ["COMMANDS", "build_parser", "main"]

#: The commands, in the order ``sift --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    init.COMMAND,
    stats.COMMAND,
    jobs.COMMAND,
    show.COMMAND,
    run.COMMAND,
    sweep.COMMAND,
    evict.COMMAND,
    reconcile.COMMAND,
    rescue.COMMAND,
    hosts.COMMAND,
    pause.COMMAND,
    resume.COMMAND,
    check.COMMAND,
    backup.COMMAND,
    restore.COMMAND,
    vacuum.COMMAND,
    simulate.COMMAND,
    shell.COMMAND,
    web.COMMAND,
)


def build_parser() -> Parser:
    """The parser of the whole line: ``--db`` and ``--version``, then one sub-parser per command."""
    parser = Parser(
        prog="sift",
        parents=[store_option(StoreUse.WRITE)],
        description="Inspect, maintain and explore a sift batch store; `sift simulate` shows it at work.",
    )
    parser.add_argument("--version", action="version", version=f"sift {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    as_json = Parser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON for scripts instead of columns")
    parser.flags |= as_json.flags
    for command in COMMANDS:
        parents = [store_option(command.store), *([as_json] if command.json else [])]
        sub = subparsers.add_parser(
            command.name,
            parents=parents,
            help=command.help,
            description=command.help,
            epilog=command.epilog,
        )
        command.add_arguments(sub)
        sub.set_defaults(declared=command)
        parser.flags |= sub.flags
        parser.labels.update(sub.labels)
        if sub.labels:
            parser.with_positionals.add(command.name)
    return parser


def _fail(message: str, code: int = 1) -> int:
    print(f"sift: {' '.join(message.split())}", file=sys.stderr)
    return code


def _prepare(args: argparse.Namespace, command: Command, labels: dict[str, str]) -> None:
    """Fill in the default store, reject text that is not UTF-8, and parse the command's typed values."""
    if getattr(args, "db", None) is None:
        args.db = default_db_path()
        args.db_source = "$SIFT_DB" if os.environ.get("SIFT_DB") else None
    else:
        args.db_source = "--db"
    for name, value in vars(args).items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                label = labels.get(name, f"--{name.replace('_', '-')}")
                raise CommandError(f"{label}: is not valid UTF-8 text") from None
    for name, parse in command.values.items():
        text = getattr(args, name, None)
        if isinstance(text, str):
            setattr(args, f"{name}_text", text)
            setattr(args, name, parse(text, f"--{name.replace('_', '-')}"))


def main(argv: list[str] | None = None) -> int:
    """Run one ``sift`` command; return its exit status (0 ok, 1 error, 2 usage)."""
    parser = build_parser()
    names = {command.name for command in COMMANDS}
    given = sys.argv[1:] if argv is None else argv
    line = joined_negative_values(given, names, parser.flags, parser.with_positionals)
    try:
        args = parser.parse_args(line)
    except SystemExit as exc:  # --help, --version, and usage errors (argparse's own exit 2)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    command: Command = args.declared
    try:
        _prepare(args, command, parser.labels)
        command.prepare(args)
        # A command that only reads opens the store read-only: it never creates the file (a typo in --db
        # would leave a new empty store behind) and never writes to it.
        readonly = command.store is StoreUse.READ or command.readonly(args)
        # Only init, restore and simulate make a store: elsewhere a typo in --db must not leave one behind.
        create = command.store in (StoreUse.CREATE, StoreUse.NEW)
        with opened(args.db, readonly=readonly, create=create) as database:
            if is_postgres(args.db):
                args.db = database.path  # as shown in messages: without a password
            return command.run(args)
    except (BatchError, BadValue, CommandError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:
        _silence_stdout()
        return 141


def _silence_stdout() -> None:
    """After the reader of standard output went away, send what is left to /dev/null, quietly."""
    try:
        fileno = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fileno)
    os.close(devnull)
