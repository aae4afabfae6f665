"""``sift simulate --hosts``: run the hosts, check the run, and print its summary."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sift import dcache

from ..report import Column, emit_json, format_count, format_size, key_values, plural, table
from ..store import CommandError
from .coordinator import HostsRun, run_hosts
from .cores import PROC_STAT
from .fairness import fairness_lines, fairness_report, journal_callers
from .host import API_THREADS, MAX_ATTEMPTS, RENEW_EVERY_S
from .hosts_verdicts import check_run
from .stores import kept_schema_note, shown_store
from .verdicts import Check, jobs_by_status, summary_footer
from .workload import Settings, claim_options_of, settings_of

__all__ = ["longest_wait", "simulate_hosts"]


def simulate_hosts(args: argparse.Namespace) -> int:
    """Run ``--hosts`` host processes on the open store, check the run, print its summary; 1 if a check
    failed."""
    if args.sim_target == ":memory:":
        raise CommandError("--hosts: several processes cannot share an in-memory store; name a file")
    settings = settings_of(args)
    journal_dir = Path(tempfile.mkdtemp(prefix="sift-simulate-journals-"))
    target = args.sim_target  # args.db may be shown without its password
    fetch_s = args.fetch_ms / 1000
    claim = claim_options_of(args)
    run = run_hosts(
        settings, target, args.hosts, args.stale_after, not args.no_kill, journal_dir, fetch_s, claim
    )
    checks = check_run(run, settings.budget)
    fairness = fairness_report(
        journal_callers(run.specs, run.prefix, run.journals),
        run.host_peaks,
        claim.kwargs(),
        f"sampled from the store's running targets {run.samples:,} times",
    )
    if claim.per_host is not None:
        peak = fairness["busiest_host_peak"]
        checks.append(
            Check(
                f"no host ever had more than {claim.per_host} targets running (sampled)",
                peak <= claim.per_host,
                f"peak {peak} in {run.samples:,} samples",
            )
        )
    summary = _summary(run, checks, args, settings, journal_dir)
    summary["fairness"] = fairness
    if args.json:
        emit_json(summary)
    else:
        print("\n".join(_human(summary)))
    return 0 if summary["ok"] else 1


def _percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _rates(records: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    latencies = [r["lat"] for r in records if r["k"] == "claim"]
    written = sum(1 for r in records if r["k"] == "done")
    claimed = sum(len(r["got"]) for r in records if r["k"] == "claim")

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 2)

    return {
        "seconds": round(seconds, 3),
        "targets_written": written,
        "targets_per_s": round(written / seconds, 1) if seconds > 0 else None,
        "claims": len(latencies),
        "targets_claimed": claimed,
        "claims_per_s": round(len(latencies) / seconds, 1) if seconds > 0 else None,
        "empty_claims": sum(r.get("empty_claims", 0) for r in records if r["k"] == "end"),
        "requeued": sum(r["n"] for r in records if r["k"] == "requeue"),
        "failed_stale": sum(r["failed"] for r in records if r["k"] == "requeue"),
        "claims_lost": sum(1 for r in records if r["k"] == "claim_lost"),
        "evicted": sum(r["n"] for r in records if r["k"] == "evict"),
        "submissions": sum(1 for r in records if r["k"] == "sub"),
        "claim_p50_ms": ms(_percentile(latencies, 0.50)),
        "claim_p99_ms": ms(_percentile(latencies, 0.99)),
    }


def longest_wait(journals: dict[int, list[dict[str, Any]]]) -> float | None:
    """The longest a created job waited from its submission to its first claim (seconds): what
    a queued job's wait, which no claim's heartbeat covers."""
    created: dict[str, float] = {}
    first_claim: dict[str, float] = {}
    for records in journals.values():
        for r in records:
            if r["k"] == "sub" and r["new"]:
                created[r["id"]] = r["t"]
            elif r["k"] == "claim":
                for job, _ in r["got"]:
                    first_claim[job] = min(first_claim.get(job, r["t"]), r["t"])
    waits = [first_claim[job] - t for job, t in created.items() if job in first_claim]
    return round(max(waits), 3) if waits else None


def _summary(
    run: HostsRun, checks: list[Check], args: argparse.Namespace, settings: Settings, journal_dir: Path
) -> dict[str, Any]:
    per_host = []
    for host, records in run.journals.items():
        state = (
            "killed"
            if run.kill and run.kill.host == host
            else "finished"
            if run.exit_codes[host] == 0
            else "failed"
        )
        per_host.append(
            {"host": host, "state": state, "exit": run.exit_codes[host], **_rates(records, run.alive_s[host])}
        )
    everything = [r for records in run.journals.values() for r in records]
    subs = [r for r in everything if r["k"] == "sub"]
    return {
        "db": shown_store(args.db),
        "schema_made": args.sim_schema,
        "journals": str(journal_dir),
        "settings": asdict(settings),
        "hosts": run.hosts,
        "stale_after": args.stale_after,
        "renew_every_s": RENEW_EVERY_S,
        "max_attempts": MAX_ATTEMPTS,
        "fetch_ms": args.fetch_ms,
        "kill": None if run.kill is None else asdict(run.kill),
        "seconds": round(run.seconds, 3),
        "cores_busy_pct": run.cores_busy_pct,
        "per_host": per_host,
        "total": _rates(everything, run.seconds),
        "submissions": {
            "planned": len(run.specs),
            "sent": len(subs),
            "jobs_created": sum(1 for r in subs if r["new"]),
            "idem_hits": sum(1 for r in subs if not r["new"]),
        },
        "longest_wait_s": longest_wait(run.journals),
        "bytes_stored": dcache.batch_nbytes(),
        "budget": settings.budget,
        "jobs": jobs_by_status(),
        "invariants": [asdict(check) for check in checks],
        "ok": all(check.ok for check in checks),
    }


def _cores_busy_text(pct: float | None) -> str:
    if pct is None:
        return f"unknown ({PROC_STAT} unreadable, or the run too short to measure)"
    cores = os.cpu_count() or "its"
    return f"{pct:g}% of this machine's {cores} cores during the run (all processes, a local server too)"


def _human(summary: dict[str, Any]) -> Iterator[str]:
    s, kill, subs = summary["settings"], summary["kill"], summary["submissions"]
    yield (
        f"Simulated {format_count(subs['sent'])} of {format_count(subs['planned'])} submissions on "
        f"{plural(summary['hosts'], 'host')} ({API_THREADS} API threads, {s['workers']} runner threads and a "
        f"claim keeper each; fetches of {summary['fetch_ms']} ms on average) in {summary['seconds']:.1f} s "
        f"(seed {s['seed']})"
    )
    yield ""
    if kill is None:
        killed = "none (--no-kill, or a single host)"
    else:
        killed = (
            f"host {kill['host']} SIGKILLed at {kill['at_s']:.1f} s, after "
            f"{format_count(kill['after_targets'])} targets written, holding "
            f"{plural(kill['held_targets'], 'claimed target')} not written yet"
        )
    total = summary["total"]
    yield from key_values(
        [
            ("store", summary["db"] + kept_schema_note(summary["schema_made"])),
            ("journals", summary["journals"]),
            ("killed", killed),
            (
                "requeued",
                f"{plural(total['requeued'], 'target')} back to pending, {total['failed_stale']} failed at "
                f"their last of {summary['max_attempts']} attempts, by requeue_stale_claims (stale after "
                f"{summary['stale_after']} s, claims renewed every {summary['renew_every_s']} s); "
                f"{plural(total['claims_lost'], 'late write')} refused (ClaimLost)",
            ),
            (
                "submissions",
                f"{format_count(subs['jobs_created'])} jobs created, "
                f"{format_count(subs['idem_hits'])} answered from the store",
            ),
            ("longest wait", f"{summary['longest_wait_s']} s from a submission to its job's first claim"),
            ("eviction", f"{plural(total['evicted'], 'job')} evicted"),
            (
                "bytes stored",
                f"{format_size(summary['bytes_stored'])} of {format_size(summary['budget'])} budget",
            ),
            ("cores busy", _cores_busy_text(summary["cores_busy_pct"])),
        ],
        indent="  ",
    )
    yield ""
    rows = []
    for row in [*summary["per_host"], {"host": "total", "state": "", **total}]:
        rows.append(
            {
                "host": str(row["host"]),
                "state": row["state"],
                "seconds": f"{row['seconds']:.1f}",
                "targets": format_count(row["targets_written"]),
                "targets/s": f"{row['targets_per_s'] or 0:,.1f}",
                "claims": format_count(row["claims"]),
                "claims/s": f"{row['claims_per_s'] or 0:,.1f}",
                "requeued": format_count(row["requeued"]),
                "p50": "-" if row["claim_p50_ms"] is None else f"{row['claim_p50_ms']:.1f} ms",
                "p99": "-" if row["claim_p99_ms"] is None else f"{row['claim_p99_ms']:.1f} ms",
            }
        )
    columns = [
        Column("host", "host"),
        Column("state", "state"),
        Column("seconds", "seconds", right=True),
        Column("targets", "targets", right=True),
        Column("targets/s", "targets/s", right=True),
        Column("claims", "claims", right=True),
        Column("claims/s", "claims/s", right=True),
        Column("requeued", "requeued", right=True),
        Column("claim p50", "p50", right=True),
        Column("claim p99", "p99", right=True),
    ]
    yield from table(rows, columns, indent="  ")
    if summary["settings"]["workload"] == "flood" or summary["fairness"]["claim"]:
        yield from fairness_lines(summary["fairness"])
    yield from summary_footer(summary)
