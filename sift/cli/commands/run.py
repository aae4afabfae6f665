"""``sift run``: a runner (``sift.runner.Runner``) on the store, calling ``--fetch module:function`` for each
target, until SIGTERM or Ctrl-C (then in-flight fetches get ``--grace`` to finish and be written, the rest
is released, and it exits 0). On a terminal a live line shows its progress; otherwise a log line every
``LOG_EVERY`` seconds.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
import threading
import time
from typing import Any

from sift.dcache import InvalidBatchInput
from sift.dcache.validation import MAX_INT
from sift.runner import Backoff, Runner
from sift.runner.runner import PREFETCH

from ..progress import bars_enabled, make_bar
from ..store import CommandError
from ..units import BadValue, parse_duration, parse_size
from . import Command

__all__ = ["COMMAND"]

#: Seconds between two progress log lines when standard error is not a terminal.
LOG_EVERY = 10.0
#: Seconds between two refreshes of the live line on a terminal.
DRAW_EVERY = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` is the dispatcher's)."""
    parser.add_argument(
        "--fetch",
        required=True,
        metavar="MODULE:FUNCTION",
        help="the fetch to call for each target, imported from MODULE (the current directory is searched)",
    )
    parser.add_argument("--name", help="the runner's name in its claims (default: host name and process id)")
    parser.add_argument("--concurrency", type=int, default=8, metavar="N", help="fetches at once (8)")
    parser.add_argument(
        "--prefetch",
        default=str(PREFETCH),
        metavar="N",
        help=f"the most a claim takes beyond the free workers ({PREFETCH}; 0: none)",
    )
    parser.add_argument("--per-job", type=int, metavar="N", help="at most N targets of one job per claim")
    parser.add_argument("--per-host", type=int, metavar="N", help="at most N targets of one host running")
    parser.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="CLASS=TURNS",
        help="turns a round for a caller class (repeat the option for each class)",
    )
    parser.add_argument("--unfair", action="store_true", help="oldest job first across callers")
    parser.add_argument("--stale-after", default="60", metavar="DURATION", help="claims stale after (60s)")
    parser.add_argument("--renew-every", default="10", metavar="DURATION", help="the keeper's period (10s)")
    parser.add_argument("--max-attempts", type=int, default=3, metavar="N", help="attempts per target (3)")
    parser.add_argument("--backoff-first", type=float, default=1.0, metavar="SECONDS", help="first wait (1)")
    parser.add_argument("--backoff-most", type=float, default=300.0, metavar="SECONDS", help="longest (300)")
    parser.add_argument("--budget", metavar="SIZE", help="evict finished jobs down to SIZE of results")
    parser.add_argument("--sweep-ttl", metavar="DURATION", help="delete jobs whose lease is this old")
    parser.add_argument("--grace", default="30", metavar="DURATION", help="in-flight fetches' grace (30s)")
    parser.add_argument(
        "--allow-private",
        action="store_true",
        help="pass allow_private=True to the fetch (loopback and private addresses, for tests and intranets)",
    )


def _fetch(spec: str) -> Any:
    module_name, _, function = spec.partition(":")
    if not module_name or not function:
        raise CommandError(f"--fetch: expected MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the user's own module, where they run
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"--fetch: cannot import {module_name!r}: {exc}") from None
    fetch = getattr(module, function, None)
    if not callable(fetch):
        raise CommandError(f"--fetch: {module_name!r} has no function {function!r}")
    return fetch


def _count(text: str, option: str) -> int:
    """A whole number from 0 (``--prefetch``): anything else is refused naming ``option``."""
    value = _whole(text.strip())
    if value is None:
        raise BadValue(f"{option}: must be a whole number from 0 to 2**63-1, got {text!r}")
    return value


def _weights(given: list[str]) -> dict[str, int] | None:
    weights: dict[str, int] = {}
    for item in given:
        name, _, turns = item.partition("=")
        value = _whole(turns)
        if not name or value is None:
            raise CommandError(f"--weight: expected CLASS=TURNS, got {item!r}")
        weights[name] = value
    return weights or None


def _whole(text: str) -> int | None:
    """The whole number ``text`` spells in ASCII digits, at most 2**63-1; None for anything else (``int``
    alone takes "²", and refuses a text of over 4,300 digits, leading zeros included)."""
    if re.fullmatch(r"[0-9]+", text) is None:
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(MAX_INT)) or int(digits) > MAX_INT:
        return None
    return int(digits)


def _report(runner: Runner, stopped: threading.Event) -> None:
    """The live line on a terminal, or a log line now and then, until the runner has stopped."""
    start = time.monotonic()
    if bars_enabled():
        with make_bar(None, "sift run", unit="target") as bar:
            while not stopped.wait(DRAW_EVERY):
                p = runner.progress()
                bar.update(p.done + p.failed - bar.n)
                counts = {"running": p.running, "retried": p.retried, "failed": p.failed}
                bar.set_postfix({**counts, "given back": p.given_back}, refresh=True)
        return
    while not stopped.wait(LOG_EVERY):
        p = runner.progress()
        rate = (p.done + p.failed) / max(time.monotonic() - start, 1e-9)
        print(
            f"sift run {runner.name}: {p.done} done, {p.failed} failed, {p.retried} retried, "
            f"{p.given_back} given back, {p.running} running, {rate:.1f} targets/s",
            file=sys.stderr,
            flush=True,
        )


#: The command's option for each of ``Runner``'s and ``Backoff``'s arguments, named in their refusals.
_OPTIONS = {
    "name": "--name",
    "concurrency": "--concurrency",
    "prefetch": "--prefetch",
    "per_job": "--per-job",
    "per_host": "--per-host",
    "weights": "--weight",
    "stale_after": "--stale-after",
    "renew_every": "--renew-every",
    "max_attempts": "--max-attempts",
    "first": "--backoff-first",
    "most": "--backoff-most",
    "budget": "--budget",
    "sweep_ttl": "--sweep-ttl",
    "allow_private": "--allow-private",
}


def _runner(args: argparse.Namespace) -> Runner:
    """The runner the options describe; a refusal names the option, not ``Runner``'s argument."""
    fetch = _fetch(args.fetch)
    try:
        return Runner(
            fetch,
            name=args.name,
            concurrency=args.concurrency,
            prefetch=args.prefetch,
            per_job=args.per_job,
            per_host=args.per_host,
            weights=_weights(args.weight),
            fair=not args.unfair,
            stale_after=args.stale_after,
            renew_every=args.renew_every,
            max_attempts=args.max_attempts,
            backoff=Backoff(first=args.backoff_first, most=args.backoff_most),
            budget=args.budget,
            sweep_ttl=args.sweep_ttl,
            allow_private=args.allow_private,
        )
    except InvalidBatchInput as exc:
        field = exc.field or ""
        raise InvalidBatchInput(_OPTIONS.get(field, field), exc.problem) from None


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM or Ctrl-C; exit 0 after the graceful stop."""
    runner = _runner(args)
    print(f"sift run {runner.name}: running on {args.db} (stop with SIGTERM or Ctrl-C)", file=sys.stderr)
    previous = signal.signal(signal.SIGINT, lambda signum, frame: runner.stop())
    stopped = threading.Event()
    reporter = threading.Thread(target=_report, args=(runner, stopped), daemon=True)
    reporter.start()
    try:
        runner.run(grace=args.grace)
    finally:
        signal.signal(signal.SIGINT, previous)
        stopped.set()
        reporter.join(5)
    p = runner.progress()
    print(
        f"sift run {runner.name}: stopped; {p.done} done, {p.failed} failed, {p.retried} retried, "
        f"{p.given_back} given back",
        file=sys.stderr,
    )
    return 0


COMMAND = Command(
    name="run",
    help="Run a runner: claim targets, call --fetch for each, write what it says, until SIGTERM.",
    run=run,
    add_arguments=add_arguments,
    json=False,
    values={
        "prefetch": _count,
        "stale_after": parse_duration,
        "renew_every": parse_duration,
        "grace": parse_duration,
        "budget": parse_size,
        "sweep_ttl": parse_duration,
    },
)
