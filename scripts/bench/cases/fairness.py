"""The flood workload, fair claiming against oldest-job-first: ``sift simulate --workload flood`` and the
same with ``--oldest-first``, on either kind of store."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..harness import Report, log
from ..sizes import Sizes
from ..stores import POSTGRES, SQLITE, PgServer, StoreUnderTest

#: The sides: the claim's default (fair round robin across callers), then oldest job first.
SIDES = {"fair": [], "oldest_first": ["--oldest-first"]}


def run_fairness(new_target: Any, sizes: Sizes, report: Report, store: StoreUnderTest) -> None:
    """Each side ``flood_rounds`` times, alternating, each run on a new store (``new_target(label)``). The
    samples are the small callers' waits for their first result (from their first submission), from each
    run's JSON; the goal is the fair side's median at least 10 x sooner than oldest-first's."""
    waits: dict[str, list[float]] = {side: [] for side in SIDES}
    for rnd in range(sizes.flood_rounds):
        for side in SIDES if rnd % 2 == 0 else dict(reversed(SIDES.items())):
            waits[side] += flood(new_target(f"flood_{side}_{rnd}"), sizes, SIDES[side], rnd)
    cases = {
        side: report.case(
            f"{store.prefix}fairness/first_result/{side}",
            sizes.flood_jobs,
            [w * 1e6 for w in samples],
            small_callers=float(len(samples)),
        )
        for side, samples in waits.items()
    }
    ratio = report.pair(cases["fair"], cases["oldest_first"])
    name = (
        f"{store.goal_prefix}flood: small callers' median wait for their first result, fair / oldest job "
        f"first ({1 / ratio:.0f} x sooner)"
    )
    report.goal(name, ratio, 0.1, "x")


def flood(target: str, sizes: Sizes, extra: list[str], rnd: int) -> list[float]:
    """One ``sift simulate --workload flood`` run: each small caller's wait for its first result (s)."""
    command = [sys.executable, "-m", "sift", "simulate", "--workload", "flood", "--json", "--db", target]
    command += ["--jobs", str(sizes.flood_jobs), "--targets", str(sizes.flood_targets), "--budget", "4GiB"]
    # A flood outlasts the default ttl in simulated time (2 s a target): no sweep may take its queued jobs.
    command += ["--ttl", "365d"]
    command += ["--seed", str(rnd + 1), *extra]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    summary = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}
    if out.returncode != 0 or not summary.get("ok"):
        raise AssertionError(
            f"simulate --workload flood {extra} failed ({out.returncode}): {out.stderr[-2000:]}"
        )
    rows = summary["fairness"]["callers"][1:]  # the flood's own row first
    waits = [row["first_result_s"] for row in rows]
    side = " ".join(extra) or "fair"
    log(f"fairness {side}: small callers' first results after {statistics.median(waits):.3f} s (median)")
    return [float(w) for w in waits]


def bench_fairness(tmp: Path, sizes: Sizes, report: Report) -> None:
    """On SQLite files."""
    run_fairness(lambda label: str(tmp / f"{label}.db"), sizes, report, SQLITE)


def pg_fairness(server: PgServer, sizes: Sizes, report: Report) -> None:
    """On PostgreSQL schemas (each made by simulate itself, in the named ``?schema=``; dropped after)."""
    made: list[str] = []

    def new_target(label: str) -> str:
        schema = server.new_schema(label)
        made.append(schema)
        return server.target(schema)

    try:
        run_fairness(new_target, sizes, report, POSTGRES)
    finally:
        for schema in made:
            server.drop(schema)
