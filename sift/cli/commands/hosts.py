"""``sift hosts``: the busiest hosts (running targets) with their policy, next due time and back-off, then
every other host whose row holds something now (a setting, a due time to come, a back-off in force);
reads only. ``--set HOST`` sets that host's policy (``*``: the default)
with ``set_host_policy``: the options given, and a setting left out cleared. ``--release HOST`` ends its
back-off (``release_host``)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
from typing import Any

from sift import dcache

from ..parsing import count
from ..report import Column, emit_json, format_count, table, utc_text
from . import Command

__all__ = ["COMMAND"]

#: --top when none is given.
TOP_DEFAULT = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` and ``--json`` are the dispatcher's)."""
    parser.add_argument(
        "--top",
        metavar="N",
        type=count(1),
        default=TOP_DEFAULT,
        help="the N busiest hosts (default %(default)s)",
    )
    parser.add_argument(
        "--set", metavar="HOST", help="set this host's policy ('*': the default for the rest)"
    )
    parser.add_argument("--release", metavar="HOST", help="end this host's back-off now")
    parser.add_argument(
        "--max-running",
        metavar="N",
        type=count(1),
        help="with --set: at most N of its targets running at once",
    )
    parser.add_argument(
        "--min-interval",
        metavar="SECONDS",
        type=float,
        help="with --set: at least this many seconds (0.5, say) between two claims of its targets",
    )


def reads_only(args: argparse.Namespace) -> bool:
    """Only ``--set`` and ``--release`` write."""
    return args.set is None and args.release is None


def run(args: argparse.Namespace) -> int:
    """Set a policy (``--set``), or list the hosts."""
    if args.set is None and (args.max_running is not None or args.min_interval is not None):
        raise dcache.InvalidBatchInput("--set", "--max-running and --min-interval need --set HOST")
    if args.release is not None:
        return _release(args)
    if args.set is not None:
        policy = dcache.set_host_policy(
            args.set, max_running=args.max_running, min_interval=args.min_interval
        )
        if args.json:
            emit_json(_policy_dict(policy))
        else:
            print(f"{policy.host}: {_policy_text(policy)}")
        return 0
    rows = host_rows(args.top)
    if args.json:
        emit_json({"hosts": rows})
        return 0
    if not rows:
        print("no target is running and no host has a policy")
        return 0
    columns = [
        Column("host", "host"),
        Column("running", "running", right=True),
        Column("policy", "policy"),
        Column("next due", "next_due"),
        Column("backed off until", "backed_off_until"),
    ]
    shown = [
        {
            **row,
            "running": format_count(row["running"]),
            "policy": row["policy"],
            "next_due": _when(row["next_due"]),
            "backed_off_until": _when(row["backed_off_until"]),
        }
        for row in rows
    ]
    print("\n".join(table(shown, columns)))
    return 0


def _release(args: argparse.Namespace) -> int:
    """End the host's back-off; say whether one was in force (exit 0 either way)."""
    if args.set is not None:
        raise dcache.InvalidBatchInput("--release", "--release and --set are one host's each; give one")
    changed = dcache.release_host(args.release)
    if args.json:
        emit_json({"host": args.release, "action": "release", "changed": changed})
    elif changed:
        print(f"{args.release}: back-off released")
    else:
        print(f"{args.release} was not backed off; left unchanged")
    return 0


def host_rows(top: int) -> list[dict[str, Any]]:
    """The ``top`` busiest hosts, then every other host whose row holds something now (``*`` first): a
    setting, a due time to come or a back-off in force. A due time or back-off past is shown as none."""
    load = dcache.store_load(callers=1, hosts=top)
    now = dcache.unix_now_ms() / 1000
    policies = {policy.host: _now_in_force(policy, now) for policy in dcache.host_policies()}
    rows = [_row(host.host, host.running, policies.pop(host.host, None)) for host in load.hosts]
    rows += [_row(host, 0, policy) for host, policy in policies.items() if _holds_something(policy)]
    return rows


def _now_in_force(policy: dcache.HostPolicy, now: float) -> dcache.HostPolicy:
    """``policy`` without a due time or back-off that has passed by ``now``."""
    due, until = policy.next_due, policy.backed_off_until
    return dataclasses.replace(
        policy,
        next_due=due if due is not None and due > now else None,
        backed_off_until=until if until is not None and until > now else None,
    )


def _holds_something(policy: dcache.HostPolicy) -> bool:
    values = (policy.max_running, policy.min_interval, policy.next_due, policy.backed_off_until)
    return any(value is not None for value in values)


def _row(host: str, running: int, policy: dcache.HostPolicy | None) -> dict[str, Any]:
    values = _policy_dict(policy) if policy is not None else {"max_running": None, "min_interval": None}
    values.setdefault("next_due", None)
    values.setdefault("backed_off_until", None)
    text = _policy_text(policy) if policy is not None else "-"
    return {**values, "host": host, "running": running, "policy": text}


def _policy_dict(policy: dcache.HostPolicy) -> dict[str, Any]:
    return {
        "host": policy.host,
        "max_running": policy.max_running,
        "min_interval": policy.min_interval,
        "next_due": policy.next_due,
        "backed_off_until": policy.backed_off_until,
    }


def _policy_text(policy: dcache.HostPolicy) -> str:
    parts = []
    if policy.max_running is not None:
        parts.append(f"max {policy.max_running} running")
    if policy.min_interval is not None:
        parts.append(f"{policy.min_interval:g}s apart")
    return ", ".join(parts) or "the default's"


def _when(unix: float | None) -> str:
    """A due time or back-off end as UTC with milliseconds, or ``-``."""
    if unix is None:
        return "-"
    if utc_text(int(unix)) is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(unix, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


COMMAND = Command(
    name="hosts",
    help="The busiest hosts (running targets) with their policy, next due time and back-off, then the "
    "other hosts with a setting, a due time or a back-off to come; --set HOST [--max-running N] "
    "[--min-interval SECONDS] sets one "
    "(set_host_policy; '*' the default, an option left out cleared); --release HOST ends its back-off "
    "(release_host).",
    run=run,
    add_arguments=add_arguments,
    readonly=reads_only,
)
