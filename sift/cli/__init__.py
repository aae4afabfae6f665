"""The ``sift`` command: inspect, maintain and explore a batch store, and run a simulated workload.

Built on the public functions of :mod:`sift.dcache` and its models; the store is a SQLite file or a
PostgreSQL URL (simulate there works in a schema of its own). The commands that only read (stats,
jobs, show, and the dry runs of sweep and evict) open the store read-only and never create it; simulate
never changes a store holding jobs it did not make. Errors the user caused (an unknown job id, a bad or
negative duration or size, no store at the path a read command names, a file that is not a store or
stays locked, a store simulate refuses) and failures of the store (a full disk, a damaged file: the store
raises them as ``BatchError`` too) print one line on standard error and exit 1; usage errors exit 2,
as argparse does.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from sift import __version__
from sift.dcache import BatchError, JobStatus

from .check import cmd_check
from .inspection import cmd_jobs, cmd_show, cmd_stats
from .maintenance import cmd_evict, cmd_reconcile, cmd_sweep
from .operations import cmd_backup, cmd_restore, cmd_vacuum
from .shell import cmd_shell
from .simulate import Settings, cmd_simulate, postgres_simulation_store
from .store import (
    CommandError,
    default_db_path,
    file_sizes,
    is_postgres,
    missing_schema,
    new_simulation_store,
    opened,
    refuse_store_with_jobs,
)
from .units import BadValue, parse_duration, parse_size

__all__ = ["build_parser", "main"]

#: Options given as text and parsed by the command line itself, so a bad value exits 1, not 2.
VALUE_OPTIONS: dict[str, Callable[[str, str], int]] = {
    "ttl": parse_duration,
    "max_bytes": parse_size,
    "budget": parse_size,
    "stale_after": parse_duration,
}
#: simulate --hosts's --stale-after when none is given.
STALE_AFTER_DEFAULT = "5s"


#: What argparse takes for a value rather than an option: anything starting with a minus sign and a digit,
#: so ``--ttl -1h`` reaches the parser of durations (argparse's own rule admits only plain numbers like -5).
NEGATIVE_VALUE = re.compile(r"^-\.?\d")


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
        help="the store file, or a postgresql:// URL (default: $SIFT_DB, else ./sift.db); created if "
        "missing, except by --dry-run",
    )
    read_db = argparse.ArgumentParser(add_help=False)
    read_db.add_argument(
        "--db",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="the store file, or a postgresql:// URL (default: $SIFT_DB, else ./sift.db); it must exist, "
        "and is only read",
    )
    new_db = argparse.ArgumentParser(add_help=False)
    new_db.add_argument(
        "--db",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="a new or empty store file; one holding jobs is refused, unchanged (default: $SIFT_DB, else "
        "a new file sim.db in a new directory sift-simulate-* under $TMPDIR or /tmp; never ./sift.db)",
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
        name: str,
        handler: Callable[[argparse.Namespace], int],
        text: str,
        *,
        json: bool = True,
        reads_only: bool = False,
    ) -> Any:
        store = read_db if reads_only else new_db if name == "simulate" else db
        parents = [store, as_json] if json else [store]
        sub = commands.add_parser(name, parents=parents, help=text, description=text)
        sub._negative_number_matcher = NEGATIVE_VALUE
        sub.set_defaults(handler=handler, reads_only=reads_only)
        return sub

    command(
        "stats",
        cmd_stats,
        "Jobs and targets by status, stored bytes, oldest and newest lease, file and WAL size, counters.",
        reads_only=True,
    )

    jobs = command("jobs", cmd_jobs, "One line per job, newest first.", reads_only=True)
    jobs.add_argument("--caller", metavar="C", help="only this caller's jobs")
    statuses = [s.value for s in JobStatus]
    jobs.add_argument(
        "--status", metavar="S", choices=statuses, help=f"only jobs in this status: {', '.join(statuses)}"
    )
    jobs.add_argument(
        "--limit", metavar="N", type=_count(0), default=20, help="at most N jobs (default 20; 0: all)"
    )

    show = command("show", cmd_show, "A job and its targets.", reads_only=True)
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

    check = command("check", cmd_check, "Check the store's invariants (check_store); exit 1 if one is off.")
    check.add_argument(
        "--repair",
        action="store_true",
        help="recompute targets_done, nbytes and the byte total, and delete orphan targets",
    )

    backup = command(
        "backup",
        cmd_backup,
        "Copy the store to DEST while others go on writing: a consistent snapshot, renamed into place only "
        "once complete (a new DEST gets mode 0600).",
    )
    backup.add_argument("dest", metavar="DEST", help="the backup file to write (replaced if it exists)")

    restore = command(
        "restore",
        cmd_restore,
        "Copy every job and target of the SQLite store file SOURCE (a backup) into the store, which must "
        "hold none: in one transaction, so a refused row leaves it empty. With --db postgresql://..., "
        "this moves a SQLite store to PostgreSQL.",
    )
    restore.add_argument("source", metavar="SOURCE", help="the SQLite store file to copy from (only read)")

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
        "crashes half-way and restarts, and only the new runner reconciles (mark_in_flight_failed) at its "
        "start, never the callers. Exits 1 if the store's invariants do not hold at the end. "
        "The store: without --db and $SIFT_DB, a new file sim.db in a new directory sift-simulate-* under "
        "$TMPDIR (else /tmp), never ./sift.db; the summary prints its path, and the file is kept for "
        "inspection (sift stats --db PATH). A store named by --db or $SIFT_DB must be new or hold no "
        "jobs: one that holds jobs is refused (exit 1) and left unchanged. With --db postgresql://... (or "
        "$SIFT_DB) it makes a new schema sift_sim_<time>_<pid>, kept after the run; a ?schema= that holds "
        "jobs is refused likewise. With --hosts N: N host processes share the store, each with API, "
        "runner (--workers) and rescuer threads; the last is SIGKILLed part-way, the others rescue its jobs "
        "(rescue_stale_jobs), and the run is checked against each host's journal."
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
    simulate.add_argument(
        "--hosts",
        metavar="N",
        type=_count(1),
        help="run N host processes (API and runner threads each) on one store; one is SIGKILLed part-way "
        "and the others rescue its jobs (default: the single-process simulation)",
    )
    simulate.add_argument(
        "--stale-after",
        metavar="DURATION",
        help=f"with --hosts: rescue_stale_jobs's stale_after, real time (default {STALE_AFTER_DEFAULT})",
    )
    simulate.add_argument(
        "--no-kill", action="store_true", help="with --hosts: kill no host (to measure throughput)"
    )
    simulate.add_argument(
        "--fetch-ms",
        metavar="MS",
        type=_count(0),
        help="with --hosts: how long a fetch waits on the network, on average (default 0: no time, so each "
        "host is as busy as its CPU lets it)",
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
        args.db_source = "$SIFT_DB" if os.environ.get("SIFT_DB") else None
    else:
        args.db_source = "--db"
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


def _simulation_options(args: argparse.Namespace) -> None:
    """--stale-after, --no-kill and --fetch-ms need --hosts (the single-process simulation has no hosts to
    kill, rescue or make wait, and must not seem to), and fetches shorter than --stale-after: a host's own
    rescuer would fail the jobs it is still fetching."""
    if args.hosts is None:
        given = {
            "--stale-after": args.stale_after is not None,
            "--no-kill": args.no_kill,
            "--fetch-ms": args.fetch_ms is not None,
        }
        for option, was_given in given.items():
            if was_given:
                raise CommandError(f"{option}: only with --hosts")
    if args.stale_after is None:
        args.stale_after_text = STALE_AFTER_DEFAULT
        args.stale_after = parse_duration(STALE_AFTER_DEFAULT, "--stale-after")
    args.fetch_ms = args.fetch_ms or 0
    longest_ms = args.fetch_ms * 3 // 2  # a fetch waits up to 1.5 times the mean
    if args.hosts is not None and args.fetch_ms and longest_ms >= args.stale_after * 1000:
        raise CommandError(
            f"--fetch-ms: fetches of {args.fetch_ms} ms (up to {longest_ms} ms) outlast --stale-after "
            f"{args.stale_after_text}: the hosts would rescue jobs they are still fetching; give a shorter "
            "--fetch-ms or a longer --stale-after"
        )


def _simulation_store(args: argparse.Namespace) -> None:
    """simulate never changes a store holding jobs it did not make: without --db or $SIFT_DB it uses a new
    file, on PostgreSQL a new schema, and it refuses a named file or schema that holds jobs before opening
    it."""
    args.sim_schema = None
    if args.db_source is None:
        args.db = new_simulation_store()
    elif is_postgres(args.db):
        args.db, args.sim_schema = postgres_simulation_store(args.db, args.db_source)
    else:
        refuse_store_with_jobs(args.db, args.db_source)
    args.sim_target = args.db  # main() shows args.db without its password; the hosts need it whole


def _prepare_check(args: argparse.Namespace) -> None:
    """``check`` reads the store as it is: it must exist (``--repair`` too: a typo must not make a store),
    and what open_db would add to the schema is named, by the check or as repaired, not added silently.
    On PostgreSQL the read-only open finds no store in an empty schema, and check_store itself names
    (and with --repair creates) what is missing: open_db adds nothing to a store that has its version row."""
    if is_postgres(args.db):
        args.missing_schema = []
        if args.repair:  # the store must exist: a typo in the schema's name must not make a new store
            with opened(args.db, readonly=True):
                pass
        return
    if args.db != ":memory:" and not os.path.isfile(args.db):
        raise CommandError(f"path: no store at {args.db!r}")
    args.missing_schema = missing_schema(args.db) if args.db != ":memory:" else []
    if args.missing_schema and not args.repair:
        raise CommandError(
            f"{args.db} lacks {', '.join(args.missing_schema)} (written by another program or an older "
            "sift?): `sift check --repair` adds what is missing, then checks the rest"
        )


def main(argv: list[str] | None = None) -> int:
    """Run one ``sift`` command; return its exit status (0 ok, 1 error, 2 usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, and usage errors (argparse's own exit 2)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        _prepare(args)
        if args.command == "simulate":
            _simulation_options(args)
            _simulation_store(args)
        # A command that only reads opens the store read-only: it never creates the file (a typo in --db
        # would leave a new empty store behind) and never writes to it.
        readonly = args.reads_only or getattr(args, "dry_run", False)
        if args.command == "check":
            _prepare_check(args)
            readonly = not args.repair
        args.sizes_before = file_sizes(args.db)  # for stats: the files as found, before this command
        with opened(args.db, readonly=readonly) as database:
            if is_postgres(args.db):
                args.db = database.path  # as shown in messages: without a password
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
