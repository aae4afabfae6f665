"""The single-process simulation's summary: what the run did, and its verdicts, as JSON or for people."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from sift import dcache
from sift.dcache import BatchTarget, TargetStatus

from ..progress import make_bar
from ..report import emit_json, format_count, format_size, format_span, key_values, plural
from .fairness import caller_rows, fairness_lines, fairness_report
from .single import CLAIM_LIMIT, MAX_ATTEMPTS, PER_JOB, RESTART_REASON, Simulation
from .stores import kept_schema_note, shown_store
from .verdicts import Check, jobs_by_status, store_checks, summary_footer
from .workload import claim_options_of, settings_of

__all__ = ["simulate_single"]


def simulate_single(args: argparse.Namespace) -> int:
    """Run the single-process simulation on the open store, print its summary; 1 if a check failed."""
    settings = settings_of(args)
    started = time.perf_counter()
    with make_bar(settings.jobs, "simulate", "job") as bar:
        sim = Simulation(settings, args.sim_target, bar, claim_options_of(args))
        sim.run()
    seconds = time.perf_counter() - started
    summary = _summary(sim, seconds)
    summary["schema_made"] = args.sim_schema
    if args.json:
        emit_json(summary)
    else:
        print("\n".join(_human(summary)))
    return 0 if summary["ok"] else 1


def _summary(sim: Simulation, seconds: float) -> dict[str, Any]:
    tally = sim.tally
    counters = sim.counters()
    checks = store_checks(dcache.check_store(), sim.settings.budget)
    checks += [
        Check(
            "every idempotent answer was that caller's job with that key",
            tally.idem_wrong == 0,
            f"{tally.idem_wrong} wrong of {tally.idem_hits}",
        ),
        Check(
            "stats() counters agree with what the calls returned",
            (counters["jobs_swept"], counters["jobs_evicted"], counters["batch_idem_hit"])
            == (tally.jobs_swept, tally.jobs_evicted, tally.idem_hits),
            f"swept {counters['jobs_swept']}/{tally.jobs_swept}, evicted {counters['jobs_evicted']}/"
            f"{tally.jobs_evicted}, idempotent hits {counters['batch_idem_hit']}/{tally.idem_hits}",
        ),
    ]
    claim = sim.claim.kwargs()
    fairness = fairness_report(
        caller_rows(sim.fairness.callers.values()),
        sim.fairness.peaks,
        claim,
        "from the runner threads' in-flight targets, changed under one lock with each claim and write",
    )
    checks += _claim_checks(sim, counters, fairness)
    callers = sorted({(spec.caller, spec.caller_class) for spec in sim.specs})
    return {
        "db": shown_store(sim.path),
        "settings": asdict(sim.settings),
        "callers": {name: cls for name, cls in callers},
        "seconds": round(seconds, 3),
        "simulated_seconds": sim.clock.now() - sim.clock.start,
        "targets_per_s": round(tally.targets_written / seconds, 1) if seconds > 0 else None,
        "tally": asdict(tally),
        "restart_after_submissions": sim.crash_after,
        "claim_limit": CLAIM_LIMIT,
        "per_job": PER_JOB,
        "max_attempts": MAX_ATTEMPTS,
        "stale_after": sim.stale_after,
        "fairness": fairness,
        "bytes_stored": dcache.batch_nbytes(),
        "budget": sim.settings.budget,
        "bytes_evicted": counters["bytes_evicted"],
        "jobs": jobs_by_status(),
        "counters": counters,
        "invariants": [asdict(check) for check in checks],
        "ok": all(check.ok for check in checks),
    }


def _claim_checks(sim: Simulation, counters: dict[str, int], fairness: dict[str, Any]) -> list[Check]:
    """What the claims must show: the counters agree with the runners' own count, the restart failed no
    target (it requeues), no target is left running, and with a per-host limit no host ever went above it."""
    t = sim.tally
    T = BatchTarget
    running = T.select().where(T.status == TargetStatus.RUNNING).count()
    by_restart = T.select().where((T.status == TargetStatus.FAILED) & (T.error == RESTART_REASON)).count()
    checks = [
        Check(
            "stats() claims and writes agree with what the runners' calls returned",
            (counters["targets_claimed"], counters["target_writes"], counters["late_writes_refused"])
            == (t.targets_claimed, t.targets_written, t.claims_lost),
            f"claimed {counters['targets_claimed']:,}/{t.targets_claimed:,}, written "
            f"{counters['target_writes']:,}/{t.targets_written:,}, late writes refused "
            f"{counters['late_writes_refused']}/{t.claims_lost}",
        ),
        Check(
            "the restart requeued what the runner held and failed no target; none left running",
            t.restart_failed == 0 and by_restart == 0 and running == 0,
            f"{t.restart_requeued} requeued, {t.restart_failed} failed by the restart, {running} running",
        ),
    ]
    per_host = sim.claim.per_host
    if per_host is not None:
        peak = fairness["busiest_host_peak"]
        checks.append(
            Check(f"no host ever had more than {per_host} targets running", peak <= per_host, f"peak {peak}")
        )
    return checks


def _human(summary: dict[str, Any]) -> Iterator[str]:
    t = summary["tally"]
    s = summary["settings"]
    fleet = sum(1 for cls in summary["callers"].values() if cls == "fleet")
    restricted = len(summary["callers"]) - fleet
    budget, stored = summary["budget"], summary["bytes_stored"]
    yield (
        f"Simulated {format_count(t['submissions'])} submissions from {len(summary['callers'])} callers "
        f"({fleet} fleet, {restricted} restricted) with {s['workers']} workers in {summary['seconds']:.1f} s "
        f"(seed {s['seed']}, {format_span(summary['simulated_seconds'])} of simulated time)"
    )
    yield ""
    yield from key_values(
        [
            ("store", summary["db"] + kept_schema_note(summary.get("schema_made"))),
            ("jobs created", format_count(t["jobs_created"])),
            (
                "targets written",
                f"{format_count(t['targets_written'])} ({format_count(t['targets_failed'])} failed), "
                f"{summary['targets_per_s']:,} targets/s",
            ),
            (
                "idempotent repeats",
                f"{format_count(t['idem_hits'])} answered from the store, "
                f"{format_count(t['idem_started_anew'])} started anew (original gone or failed)",
            ),
            (
                "claims",
                f"{plural(t['claims'], 'claim')} of up to {summary['claim_limit']} targets "
                f"({summary['per_job']} per job), {format_count(t['targets_claimed'])} targets claimed; "
                f"{plural(t['stale_requeued'], 'stale claim')} requeued by the keeper, "
                f"{plural(t['claims_lost'], 'late write')} refused (ClaimLost)",
            ),
            (
                "runner restart",
                f"after {format_count(summary['restart_after_submissions'])} submissions: "
                "the new runner alone requeued at its start (requeue_in_flight) "
                f"{plural(t['restart_requeued'], 'target')} its previous run held; "
                f"{t['restart_failed']} failed, queued jobs left alone",
            ),
            (
                "sweeps",
                f"{plural(t['sweeps'], 'sweep')} (ttl {format_span(s['ttl'])}): "
                f"{plural(t['jobs_swept'], 'job')} swept",
            ),
            (
                "eviction",
                f"{plural(t['jobs_evicted'], 'job')} evicted, {format_size(summary['bytes_evicted'])} freed",
            ),
            (
                "bytes stored",
                f"{format_size(stored)} of {format_size(budget)} budget "
                f"({100 * stored / budget if budget else 0:.0f}%)",
            ),
            ("polls", f"{format_count(t['polls'])} reads of earlier jobs by their callers"),
        ],
        indent="  ",
    )
    if summary["settings"]["workload"] == "flood" or summary["fairness"]["claim"]:
        yield from fairness_lines(summary["fairness"])
    yield from summary_footer(summary)
