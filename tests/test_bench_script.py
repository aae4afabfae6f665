"""scripts/bench.py keeps working: its quick mode runs and reports every case (issue 4).

No timing is asserted: the figures are only checked to be there. The goals are judged by a full run.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"

FLAT = (
    "runner_step",
    "batch_job_by_idem",
    "live_batch_jobs",
    "live_batch_jobs_total",
    "batch_nbytes",
    "sweep_batch_noop",
    "batch_job",
)
RAW = ("runner_step", "submit_100", "put_batch_targets", "batch_targets_read")
#: Every case the issue asks for, written out here independently of the script's own list.
CASES = {
    *(f"flat/{case}" for case in FLAT),
    *(f"raw/{case}/{side}" for case in RAW for side in ("package", "sqlite3")),
    "locks/sweep",
    "locks/evict",
    "memory/put_from_generator",
    "testing/empty_tests",
    "testing/sift_store_tests",
    "hooks/without_hooks",
    "hooks/peewee_flask_hooks",
    "ops/open_db",
    "ops/check_store",
    "ops/group_by_pass",
    "disk/backup",
    "disk/evict_90",
    # 4 processes writing one file: SQLite's busy handler alone, and the writers' queue (issue 10)
    *(f"tail/{w}/{side}" for w in ("update_batch_target", "mix") for side in ("busy_handler", "queue")),
}


@pytest.fixture(scope="module")
def quick(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """One quick run of the script, shared by the tests: its output and its JSON."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text())


def test_quick_run_reports_every_case(quick: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    proc, report = quick
    names = {case["name"] for case in report["cases"]}
    assert names == CASES
    flat = [c for c in report["cases"] if c["name"].startswith("flat/")]
    assert len(flat) == 2 * len(FLAT)  # each hot path at the small and the large history
    assert len({c["n"] for c in flat}) == 2
    for case in report["cases"]:
        assert math.isfinite(case["median_us"]) and case["median_us"] > 0, case
        assert case["name"] in proc.stdout  # the printed table has the same rows
    for name in ("locks/sweep", "locks/evict"):
        extra = next(c for c in report["cases"] if c["name"] == name)["extra"]
        assert {"max_hold_ms", "reader_p99_ms", "wal_mb"} <= set(extra)
    disk = next(c for c in report["cases"] if c["name"] == "disk/evict_90")["extra"]
    assert {"file_over_live", "max_hold_ms", "file_mb_before", "file_mb_after", "live_mb"} <= set(disk)
    memory = next(c for c in report["cases"] if c["name"] == "memory/put_from_generator")["extra"]
    assert "peak_rss_growth_mb" in memory
    fixture = next(c for c in report["cases"] if c["name"] == "testing/sift_store_tests")["extra"]
    assert {"per_test_us", "setup_teardown_us", "setup_teardown_empty_us"} <= set(fixture)
    for case in report["cases"]:
        if case["name"].startswith("tail/"):
            assert {"p50_ms", "p99_ms", "max_ms", "calls_per_s", "calls"} <= set(case["extra"]), case


def test_quick_run_judges_every_goal(quick: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    proc, report = quick
    goals = report["goals"]
    # 7 flat paths, 3 ratios with a goal and 1 reported, 2 x (hold, reader p99, -wal size), 1 memory,
    # 1 fixture cost, 1 request hooks, 2 operations (open, check), 2 disk (file over pages in use,
    # hold), 2 tail workloads x (queue p99, queue worst call, throughput against the busy handler).
    assert len(goals) == 7 + 4 + 6 + 1 + 1 + 1 + 2 + 2 + 6
    assert all(g["verdict"] in {"PASS", "FAIL", "INFO"} for g in goals)
    assert [g["verdict"] for g in goals].count("INFO") == 1
    for goal in goals:
        assert f"{goal['verdict']}  {goal['name']}" in proc.stdout
    assert {"nproc", "cpu", "python", "sqlite"} <= set(report["machine"])
