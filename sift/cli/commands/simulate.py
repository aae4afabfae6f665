"""``sift simulate``: a realistic workload against the store, then a summary and the store's check.

The work is in :mod:`sift.cli.simulation`, loaded only when this command runs.
"""

from __future__ import annotations

import argparse

from ..parsing import count
from ..simulation.stores import new_simulation_store, postgres_simulation_store, refuse_store_with_jobs
from ..simulation.workload import WORKLOADS, Settings
from ..store import CommandError, is_postgres
from ..units import parse_duration, parse_size
from . import Command, StoreUse

__all__ = ["COMMAND"]

#: --stale-after when none is given.
STALE_AFTER_DEFAULT = "5s"

EPILOG = (
    "Callers of both classes submit jobs (some repeat an idempotency key); runner threads claim from the "
    "store (claim_batch_targets), write synthetic results and evict to the budget after each claim, a "
    "keeper renews and requeues stale claims; sweeps run on a simulated clock; the runner crashes half-way "
    "and restarts, and only the new runner requeues what it held (requeue_in_flight) at its start, never "
    "the callers: no job fails because of it. Exits 1 if the store's invariants do not hold at the end. "
    "The store: without --db and $SIFT_DB, a new file sim.db in a new directory sift-simulate-* under "
    "$TMPDIR (else /tmp), never ./sift.db; the summary prints its path, and the file is kept for "
    "inspection (sift stats --db PATH). A store named by --db or $SIFT_DB must be new or hold no "
    "jobs: one that holds jobs is refused (exit 1) and left unchanged. With --db postgresql://... (or "
    "$SIFT_DB) it makes a new schema sift_sim_<time>_<pid>, kept after the run; a ?schema= that holds "
    "jobs is refused likewise. With --hosts N: N host processes share the store, each with API, "
    "runner (--workers) and claim keeper threads (renew_claims and requeue_stale_claims on a timer); the "
    "last is SIGKILLed part-way, the others requeue its claims and finish its targets, and the run is "
    "checked against each host's journal. --workload flood: one caller submits many big jobs "
    "(--targets each) first, then small callers submit small ones, on a few hot hosts and many others; "
    "the summary gives each caller's wait for its first and last result and each host's peak of targets "
    "running at once. --per-host, --weights and --oldest-first go to claim_batch_targets."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    d = Settings()
    parser.add_argument(
        "--jobs", metavar="N", type=count(1), default=d.jobs, help=f"submissions (default {d.jobs})"
    )
    parser.add_argument(
        "--targets",
        metavar="N",
        type=count(1),
        default=d.targets,
        help=f"most targets a job has (default {d.targets})",
    )
    parser.add_argument(
        "--workers",
        metavar="N",
        type=count(1),
        default=d.workers,
        help=f"runner threads (default {d.workers})",
    )
    parser.add_argument(
        "--budget",
        metavar="SIZE",
        default=f"{d.budget // 1024**2}MiB",
        help="evict_batch_oldest's max_bytes (default %(default)s)",
    )
    parser.add_argument(
        "--ttl",
        metavar="DURATION",
        default=f"{d.ttl // 60}m",
        help="lease ttl of sweeps and idempotency (default %(default)s)",
    )
    parser.add_argument(
        "--seed", metavar="N", type=int, default=d.seed, help=f"random seed (default {d.seed})"
    )
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default=d.workload,
        help="mixed: callers of both classes, idempotent repeats; flood: one caller's big jobs first, then "
        "small callers, a few hot hosts (default %(default)s)",
    )
    parser.add_argument(
        "--per-host",
        metavar="N",
        type=count(1),
        help="claim_batch_targets's per_host: at most N targets of one host running at once (default: none)",
    )
    parser.add_argument(
        "--weights",
        metavar="CLASS=N[,CLASS=N]",
        help="claim_batch_targets's weights: turns per round of each caller class (default: 1 each)",
    )
    parser.add_argument(
        "--oldest-first",
        action="store_true",
        help="claim oldest job first (fair=False) instead of round robin across callers",
    )
    parser.add_argument(
        "--hosts",
        metavar="N",
        type=count(1),
        help="run N host processes (API and runner threads each) on one store; one is SIGKILLed part-way "
        "and the others requeue its claims (default: the single-process simulation)",
    )
    parser.add_argument(
        "--stale-after",
        metavar="DURATION",
        help=f"with --hosts: requeue_stale_claims's stale_after, real time (default {STALE_AFTER_DEFAULT})",
    )
    parser.add_argument(
        "--no-kill", action="store_true", help="with --hosts: kill no host (to measure throughput)"
    )
    parser.add_argument(
        "--fetch-ms",
        metavar="MS",
        type=count(0),
        help="with --hosts: how long a fetch waits on the network, on average (default 0: no time, so each "
        "host is as busy as its CPU lets it)",
    )


def prepare(args: argparse.Namespace) -> None:
    """The options that go together, and the store simulate may use, decided before it is opened."""
    _options(args)
    _store(args)


def _options(args: argparse.Namespace) -> None:
    """--stale-after, --no-kill and --fetch-ms need --hosts (the single-process simulation has no hosts to
    kill, requeue or make wait, and must not seem to). A fetch may outlast --stale-after: each host's keeper
    renews its claims on a timer of its own."""
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
    args.weights = parse_weights(args.weights)


def parse_weights(text: str | None) -> dict[str, int] | None:
    """``CLASS=N[,CLASS=N]`` as a dict; CommandError naming --weights for anything else."""
    if text is None:
        return None
    weights: dict[str, int] = {}
    for part in text.split(","):
        name, sep, number = part.partition("=")
        name = name.strip()
        if not (sep and name and number.strip().isdigit() and int(number) > 0) or name in weights:
            raise CommandError(
                f"--weights: expected CLASS=N[,CLASS=N] with each N a whole number above 0, got {text!r}"
            )
        weights[name] = int(number)
    return weights


def _store(args: argparse.Namespace) -> None:
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


def run(args: argparse.Namespace) -> int:
    """The single-process simulation, or with --hosts the host processes; 1 if a check failed."""
    if args.hosts is not None:
        from ..simulation.hosts_summary import simulate_hosts  # multiprocessing only for --hosts

        return simulate_hosts(args)
    from ..simulation.summary import simulate_single

    return simulate_single(args)


COMMAND = Command(
    name="simulate",
    help="Run a realistic workload against the store, then check it.",
    run=run,
    store=StoreUse.NEW,
    add_arguments=add_arguments,
    values={"budget": parse_size, "ttl": parse_duration, "stale_after": parse_duration},
    prepare=prepare,
    epilog=EPILOG,
)
