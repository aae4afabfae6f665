"""The ``sift`` command: inspect, maintain and explore a batch store, and run a simulated workload.

Built on the public functions of :mod:`sift.dcache` and its models. Errors the user caused (an unknown
job id, a bad duration or size, a file that is not a store or stays locked) and failures of the store
(a full disk, a damaged file: the store raises them as ``BatchError`` too) print one line on standard
error and exit 1; usage errors exit 2, as argparse does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from sift import __version__
from sift.dcache import BatchError, JobStatus

from .inspection import cmd_jobs, cmd_show, cmd_stats
from .maintenance import cmd_evict, cmd_reconcile, cmd_sweep
from .operations import cmd_backup, cmd_vacuum
from .shell import cmd_shell
from .simulate import Settings, cmd_simulate
from .store import CommandError, default_db_path, file_sizes, opened
from .units import BadValue, parse_duration, parse_size

__all__ = ["build_parser", "main"]

#: Options given as text and parsed by the command line itself, so a bad value exits 1, not 2.
VALUE_OPTIONS: dict[str, Callable[[str, str], int]] = {
    "ttl": parse_duration,
    "max_bytes": parse_size,
    "budget": parse_size,
}


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= 2**63 - 1:  # SQLite's INTEGER
            raise argparse.ArgumentTypeError(
                f"must be a whole number from {minimum} to 2**63-1, got {text!r}"
            )
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def build_parser() -> argparse.ArgumentParser:
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument(
        "--db",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="the store file (default: $SIFT_DB, else ./sift.db); created if missing",
    )
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON for scripts instead of columns")

    parser = argparse.ArgumentParser(
        prog="sift",
        parents=[db],
        description="Inspect, maintain and explore a sift batch store; `sift simulate` shows it at work.",
    )
    parser.add_argument("--version", action="version", version=f"sift {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(
        name: str, handler: Callable[[argparse.Namespace], int], text: str, *, json: bool = True
    ) -> Any:
        parents = [db, as_json] if json else [db]
        sub = commands.add_parser(name, parents=parents, help=text, description=text)
        sub.set_defaults(handler=handler)
        return sub

    command(
        "stats",
        cmd_stats,
        "Jobs and targets by status, stored bytes, oldest and newest lease, file and WAL size, counters.",
    )

    jobs = command("jobs", cmd_jobs, "One line per job, newest first.")
    jobs.add_argument("--caller", metavar="C", help="only this caller's jobs")
    statuses = [s.value for s in JobStatus]
    jobs.add_argument(
        "--status", metavar="S", choices=statuses, help=f"only jobs in this status: {', '.join(statuses)}"
    )
    jobs.add_argument(
        "--limit", metavar="N", type=_count(0), default=20, help="at most N jobs (default 20; 0: all)"
    )

    show = command("show", cmd_show, "A job and its targets.")
    show.add_argument("job_id", metavar="JOB_ID")
    show.add_argument(
        "--result", metavar="IDX", type=_count(0), help="print the result of target IDX instead"
    )

    sweep = command("sweep", cmd_sweep, "Delete every job whose lease is older than the ttl (sweep_batch).")
    sweep.add_argument(
        "--ttl", required=True, metavar="DURATION", help="e.g. 90s, 10m, 24h, 7d, or plain seconds"
    )
    sweep.add_argument("--dry-run", action="store_true", help="report what would go; change nothing")

    evict = command(
        "evict",
        cmd_evict,
        "Evict the oldest finished jobs until the rest fit in --max-bytes (evict_batch_oldest).",
    )
    evict.add_argument("--max-bytes", required=True, metavar="SIZE", help="e.g. 512MiB, 1GB, or plain bytes")
    evict.add_argument("--dry-run", action="store_true", help="report what would go; change nothing")

    reconcile = command(
        "reconcile", cmd_reconcile, "After a crash: fail every queued or running job (mark_in_flight_failed)."
    )
    reconcile.add_argument("--reason", required=True, metavar="TEXT", help="the error stored on each job")

    backup = command(
        "backup",
        cmd_backup,
        "Copy the store to DEST while others go on writing: a consistent snapshot, renamed into place only "
        "once complete (a new DEST gets mode 0600).",
    )
    backup.add_argument("dest", metavar="DEST", help="the backup file to write (replaced if it exists)")

    command(
        "vacuum",
        cmd_vacuum,
        "Give every free page back to the file system; a store made before incremental auto-vacuum is "
        "converted once, which rewrites the whole file.",
    )

    d = Settings()
    simulate = command("simulate", cmd_simulate, "Run a realistic workload against the store, then check it.")
    simulate.epilog = (
        "Callers of both classes submit jobs (some repeat an idempotency key); worker threads write "
        "synthetic results and evict to the budget after each; sweeps run on a simulated clock; the runner "
        "crashes half-way and restarts. Exits 1 if the store's invariants do not hold at the end."
    )
    simulate.add_argument(
        "--jobs", metavar="N", type=_count(1), default=d.jobs, help=f"submissions (default {d.jobs})"
    )
    simulate.add_argument(
        "--targets",
        metavar="N",
        type=_count(1),
        default=d.targets,
        help=f"most targets a job has (default {d.targets})",
    )
    simulate.add_argument(
        "--workers",
        metavar="N",
        type=_count(1),
        default=d.workers,
        help=f"runner threads (default {d.workers})",
    )
    simulate.add_argument(
        "--budget",
        metavar="SIZE",
        default=f"{d.budget // 1024**2}MiB",
        help="evict_batch_oldest's max_bytes (default %(default)s)",
    )
    simulate.add_argument(
        "--ttl",
        metavar="DURATION",
        default=f"{d.ttl // 60}m",
        help="lease ttl of sweeps and idempotency (default %(default)s)",
    )
    simulate.add_argument(
        "--seed", metavar="N", type=int, default=d.seed, help=f"random seed (default {d.seed})"
    )

    command("shell", cmd_shell, "An interactive Python console with the store open.", json=False)
    return parser


def _fail(message: str, code: int = 1) -> int:
    print(f"sift: {' '.join(message.split())}", file=sys.stderr)
    return code


def _prepare(args: argparse.Namespace) -> None:
    """Fill in the default store, reject text that is not UTF-8, and parse sizes and durations."""
    if getattr(args, "db", None) is None:
        args.db = default_db_path()
    for name, value in vars(args).items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                label = "JOB_ID" if name == "job_id" else f"--{name.replace('_', '-')}"
                raise CommandError(f"{label}: is not valid UTF-8 text") from None
    for name, parse in VALUE_OPTIONS.items():
        text = getattr(args, name, None)
        if isinstance(text, str):
            setattr(args, f"{name}_text", text)
            setattr(args, name, parse(text, f"--{name.replace('_', '-')}"))


def main(argv: list[str] | None = None) -> int:
    """Run one ``sift`` command; return its exit status (0 ok, 1 error, 2 usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, and usage errors (argparse's own exit 2)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        _prepare(args)
        args.sizes_before = file_sizes(args.db)  # for stats: the files as found, before this command
        with opened(args.db):
            return int(args.handler(args))
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
