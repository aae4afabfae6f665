"""scripts/bench keeps working: its quick mode runs and reports every case, on SQLite and, when the test
server answers (always under CI), on PostgreSQL too; and its comparison with another commit reports a ratio
for each hot path.

No timing is asserted: the figures are only checked to be there. The goals are judged by a full run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import POSTGRES_URL, postgres_missing

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench"

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
#: The store calls the contention group makes beside a computing thread.
CALLS = ("batch_targets", "update_batch_targets")
#: Every case the bench must report, written out here independently of the bench's own lists.
CASES = {
    *(f"flat/{case}" for case in FLAT),
    *(f"raw/{case}/{side}" for case in RAW for side in ("package", "sqlite3")),
    # the runner step's statements sent plainly on the package's file: what the package's Python adds
    "raw/runner_step/package_sql",
    # the same statements on copies of the file lacking the structures a result write moves, and the seed
    *(
        f"raw/runner_step_parts/{side}"
        for side in (
            "sqlite3",
            "package_sql",
            "no_host_index",
            "no_byte_total",
            "neither",
        )
    ),
    # 256 results a call at three sizes: each target's statement, and one UPDATE … FROM (VALUES …) for all
    *(f"raw/set_write_{size}/{side}" for size in ("10b", "1k", "10k") for side in ("each", "one_update")),
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
    # 4 processes writing one file: SQLite's busy handler alone, and the writers' queue
    *(f"tail/{w}/{side}" for w in ("update_batch_target", "mix") for side in ("busy_handler", "queue")),
    "claims/claim_batch_targets",
    # a fair claim of 50 over 1,000 callers, 1,000 pending against many, without and with per_host
    "claims/fair",
    "claims/fair_per_host",
    # the same claim without per_host written at its least in plain sqlite3, on the same two files
    "claims/fair_floor",
    # the flood workload's small callers' first results: fair claiming, and oldest job first
    "fairness/first_result/fair",
    "fairness/first_result/oldest_first",
    # a wait ended by another process's commit
    "wait/after_write",
    # a page of results from a small job and from a large one
    "pages/batch_targets",
    # the dashboard's pages
    *(f"web/{page}" for page in ("jobs", "jobs_further", "job", "overview")),
    # the fair claim with 90% of the pending targets held back, and with none
    "claims/polite_clear",
    "claims/polite_held",
    # a read of a job's targets and a write of its results, alone and beside a thread computing in Python,
    # and another thread's job reads beside a Runner whose fetch computes, or waits for a process pool
    *(f"contention/{call}/{side}" for call in CALLS for side in ("alone", "beside_compute")),
    *(f"contention/runner/{fetch}" for fetch in ("fetch_computes", "fetch_waits")),
}
#: The SQLite peers group's cases, there when huey (the bench extra) is installed.
PEERS_CASES = {
    *(f"peers/{s}/{side}" for s in ("normal", "full") for side in ("huey", "sift", "sift_bulk10")),
    # a batch through the shipped Runner against huey's, the same batch's store calls one after another,
    # and the runner's results' time to be readable elsewhere
    *(f"peers/runner/{s}/{side}" for s in ("normal", "full") for side in ("huey", "runner", "sequence")),
    "peers/runner/visible_after_fetch",
}


#: The instructions group's cases in a quick run, there when valgrind is installed.
INSTRUCTION_CASES = {f"instructions/runner_step/{side}" for side in ("package", "package_sql", "sqlite3")}


def with_valgrind() -> bool:
    """Whether valgrind is installed, so the instructions group counts."""
    return shutil.which("valgrind") is not None


def with_huey() -> bool:
    """Whether the bench extra's huey is installed, so the SQLite peers group runs."""
    return importlib.util.find_spec("huey") is not None


#: The PostgreSQL part's cases.
PG_CASES = {
    *(f"pg/flat/{case}" for case in FLAT),
    "pg/raw/runner_step/package",
    "pg/raw/runner_step/psycopg",
    # a batch of 100 targets: sift per target, sift in writes of 10, plain psycopg on the original schema
    *(f"pg/peers/{side}" for side in ("sift", "sift_bulk10", "psycopg")),
    "pg/target_writes",
    "pg/claims/claim_batch_targets",
    "pg/claims/fair",
    "pg/claims/fair_per_host",
    # sift simulate --hosts 1 and 4 with fetches that take no time, and fetches that wait 50 ms
    "pg/simulate/hosts/fetch_0ms",
    "pg/simulate/hosts/fetch_50ms",
    "pg/fairness/first_result/fair",
    "pg/fairness/first_result/oldest_first",
    "pg/wait/after_write",
    "pg/pages/batch_targets",
    *(f"pg/web/{page}" for page in ("jobs", "jobs_further", "job", "overview")),
    "pg/claims/polite_clear",
    "pg/claims/polite_held",
    *(f"pg/contention/{call}/{side}" for call in CALLS for side in ("alone", "beside_compute")),
}


@pytest.fixture(scope="module")
def quick(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """One quick run of the script as CI runs it (no --db: SQLite, and PostgreSQL at SIFT_TEST_POSTGRES when
    a server answers), shared by the tests: its output and its JSON."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,  # a guard against a hang: with valgrind, the run counts instructions under callgrind
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text())


def has_dbstat() -> bool:
    """Whether this SQLite has the dbstat table, through which the bench names the -wal frames' b-trees."""
    try:
        sqlite3.connect(":memory:").execute("SELECT * FROM dbstat").fetchall()
    except sqlite3.OperationalError:
        return False
    return True


def with_postgres() -> bool:
    """Whether the quick run includes the PostgreSQL part: always under CI, else when the server answers."""
    return postgres_missing() is None


@pytest.mark.slow
def test_quick_run_reports_every_case(quick: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    proc, report = quick
    names = {case["name"] for case in report["cases"]}
    peers = PEERS_CASES if with_huey() else set()
    counted = INSTRUCTION_CASES if with_valgrind() else set()
    assert names == CASES | peers | counted | (PG_CASES if with_postgres() else set())
    assert report["backends"] == (["sqlite", "postgresql"] if with_postgres() else ["sqlite"])
    for prefix in ("flat/", "pg/flat/") if with_postgres() else ("flat/",):
        flat = [c for c in report["cases"] if c["name"].startswith(prefix)]
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
    for side in ("package", "package_sql", "sqlite3"):
        extra = next(c for c in report["cases"] if c["name"] == f"raw/runner_step/{side}")["extra"]
        if has_dbstat():  # the -wal frames one step appends, in all and by b-tree
            frames = [v for k, v in extra.items() if k.startswith("wal_frames/") and k != "wal_frames/all"]
            assert extra["wal_frames/all"] == pytest.approx(sum(frames), abs=0.01 * len(frames))
            assert {"wal_frames/batch_target", "wal_frames/batch_job"} <= set(extra)
    for setting in ("normal", "full") if with_huey() else ():
        runner = next(c for c in report["cases"] if c["name"] == f"peers/runner/{setting}/runner")
        longest_ms = max(runner["samples_us"]) * runner["n"] / 1000  # a round's whole batch
        parts_ms = [runner["extra"][part] for part in ("create_ms", "run_ms", "read_ms")]
        assert all(0 < ms <= longest_ms for ms in parts_ms), runner
        sequence = next(c for c in report["cases"] if c["name"] == f"peers/runner/{setting}/sequence")
        assert runner["extra"]["over_sequence"] == pytest.approx(runner["median_us"] / sequence["median_us"])
    parts = [c for c in report["cases"] if c["name"].startswith("raw/runner_step_parts/")]
    assert all(c["ratio"] > 0 for c in parts)  # each over the seed's median, measured in the same rounds
    for case in report["cases"]:
        if case["name"] in ("claims/fair", "claims/fair_per_host") and has_dbstat():
            # a claim's -wal frames: the targets it takes, each on its table's and its index's pages
            assert case["extra"]["wal_frames/batch_target_host"] > 0, case
            assert "wal_frames/batch_target_pending" not in case["extra"], case
    for case in report["cases"]:
        if case["name"].startswith(("contention/", "pg/contention/")):  # each case's longest call
            assert case["extra"]["max_ms"] == pytest.approx(max(case["samples_us"]) / 1000), case
    for prefix in ("", "pg/") if with_postgres() else ("",):
        claims = {c["n"]: c for c in report["cases"] if c["name"] == f"{prefix}claims/claim_batch_targets"}
        assert set(claims) == {1, 2, 4}  # processes claiming at once
        assert all(c["extra"]["claims_per_s"] > 0 for c in claims.values())


@pytest.mark.slow
def test_quick_run_judges_every_goal(quick: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    proc, report = quick
    goals = report["goals"]
    # 7 flat paths, 3 ratios with a goal and 6 reported (two of them split the runner step's, three compare
    # two ways to write 256 results at three sizes), 2 x (hold, reader p99, -wal size), 1 memory, 1 fixture
    # cost, 1 request hooks, 2 operations (open, check), 2 disk (file over pages in use, hold), claims from 4
    # processes no slower than from 1, 2 tail workloads x (queue p99, queue worst call, throughput against the
    # busy handler), the fair claim's large store against its small one, without and with per_host, and its
    # floor's reported, the flood's small callers 10 x sooner with fair claiming, a wait's end after another
    # process's commit, a page of a large job against one of a small job, the dashboard's jobs page, a claim
    # with 90% held against none; and, reported, the read and the write beside a computing thread against
    # alone, and a job read beside a Runner whose fetch computes against one whose fetch waits for a pool.
    sqlite_goals = 7 + 9 + 6 + 1 + 1 + 1 + 2 + 2 + 1 + 6 + 3 + 1 + 1 + 1 + 1 + 1 + 3
    # with huey: per target and in writes of 10 against it, at NORMAL and at FULL (2 of them reported)
    # and a batch through a Runner against huey at both settings, its store calls one after another against
    # huey at both (reported), and the runner's results' visibility
    peers_goals, peers_info = (9, 4) if with_huey() else (0, 0)
    # with valgrind: the runner step's instructions against its statements', and against the seed's (reported)
    counted_goals, counted_info = (2, 1) if with_valgrind() else (0, 0)
    # PostgreSQL: 7 flat paths (batch_nbytes among them: O(1)), the runner step against plain psycopg,
    # 8 writer processes against 1, the lock waits reported, claims from 4 processes against 1 reported,
    # simulate --hosts 4 against --hosts 1, with fetches that take no time and with fetches of 50 ms, and
    # the most more hosts could reach with no fetch time, reported (from /proc/stat, on Linux); a batch
    # per target and in writes of 10 against plain psycopg, reported; the fair claim's two; the flood's
    # small callers 10 x sooner with fair claiming; a wait's end after another process's commit; a page of
    # a large job against one of a small job; the dashboard's jobs page; a claim with 90% held; the read and
    # the write beside a computing thread against alone, reported.
    ceiling = 1 if Path("/proc/stat").exists() else 0
    pg_goals = 7 + 1 + 1 + 1 + 1 + 2 + ceiling + 2 + 2 + 1 + 1 + 1 + 1 + 1 + 2
    assert len(goals) == sqlite_goals + peers_goals + counted_goals + (pg_goals if with_postgres() else 0)
    assert all(g["verdict"] in {"PASS", "FAIL", "INFO"} for g in goals)
    sqlite_info = 7 + 3
    pg_info = 4 + ceiling + 2
    assert [g["verdict"] for g in goals].count("INFO") == sqlite_info + (
        pg_info if with_postgres() else 0
    ) + peers_info + counted_info
    for goal in goals:
        assert f"{goal['verdict']}  {goal['name']}" in proc.stdout
    assert {"nproc", "cpu", "python", "sqlite"} <= set(report["machine"])


@pytest.mark.slow
def test_quick_run_on_postgres_measures_lock_waits_and_leaves_no_schema(
    quick: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    if not with_postgres():
        pytest.skip(f"no PostgreSQL server answers at {POSTGRES_URL} (set SIFT_TEST_POSTGRES)")
    import psycopg

    _, report = quick
    writers = {c["n"]: c for c in report["cases"] if c["name"] == "pg/target_writes"}
    assert set(writers) == {1, 8}
    assert writers[1]["extra"]["writes_per_s"] > 0 and writers[8]["extra"]["writes_per_s"] > 0
    waits = writers[8]["extra"]
    assert waits["samples"] > 0 and waits["backend_samples"] >= waits["samples"]  # it saw the writers
    assert 0 <= waits["lock_wait_pct"] <= 100
    for fetch_ms in (0, 50):
        name = f"pg/simulate/hosts/fetch_{fetch_ms}ms"
        simulate = {c["n"]: c for c in report["cases"] if c["name"] == name}
        assert set(simulate) == {1, 4}  # sift simulate --hosts 1 and --hosts 4
        assert all(c["extra"]["targets_per_s"] > 0 for c in simulate.values())
        if Path("/proc/stat").exists():
            assert all(0 < c["extra"]["cores_busy_pct"] <= 100 for c in simulate.values())
    assert report["machine"]["postgresql"]
    pattern = report["machine"]["postgresql_schemas"].replace("_", r"\_").replace("*", "%")
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (pattern,)).fetchall()
    assert left == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--db", "mysql://localhost/x"], "give sqlite or a postgresql:// URL"),
        (["--db", f"{POSTGRES_URL}?schema=mine"], "the bench makes schemas of its own"),
        (["--db", "postgresql://postgres@127.0.0.1:1/none"], "no PostgreSQL server answers"),
    ],
)
def test_bad_db_is_refused_before_any_work(argv: list[str], message: str) -> None:
    command = [sys.executable, str(BENCH), "--quick", *argv]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "flat:" not in proc.stderr  # no group ran


#: The hot paths a comparison with another commit times.
COMPARED = ("runner_step", "claim_batch_targets", "sweep_batch_noop", "evict_batch_oldest_noop")


@pytest.mark.slow
def test_compare_with_a_commit_reports_each_hot_path_and_removes_its_worktree(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    command = [sys.executable, str(BENCH), "--quick", "--compare-with", "HEAD", "--json", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH, capture_output=True, text=True, check=True)
    assert report["compare_with"] == "HEAD" and report["commit"] == head.stdout.strip()
    prefixes = ("", "pg/") if with_postgres() else ("",)
    cases = {c["name"]: c for c in report["cases"]}
    assert set(cases) == {
        f"{p}compare/{case}/{side}" for p in prefixes for case in COMPARED for side in ("this", "base")
    }
    for prefix in prefixes:
        for case in COMPARED:
            this, base = cases[f"{prefix}compare/{case}/this"], cases[f"{prefix}compare/{case}/base"]
            assert math.isfinite(this["ratio"]) and this["ratio"] > 0 and base["ratio"] == 1.0
            assert this["ratio"] == pytest.approx(this["median_us"] / base["median_us"])
            assert f"{prefix}compare/{case}/this" in proc.stdout
    assert len(report["goals"]) == len(prefixes) * len(COMPARED)
    for goal in report["goals"]:
        assert f"{goal['verdict']}  {goal['name']}" in proc.stdout
    worktrees = subprocess.run(
        ["git", "worktree", "list"], cwd=BENCH, capture_output=True, text=True, check=True
    )
    assert report["worktree"] not in worktrees.stdout  # the other commit's checkout is gone
    assert not Path(report["worktree"]).exists()


def test_compare_with_an_unknown_revision_is_refused_before_any_work() -> None:
    command = [sys.executable, str(BENCH), "--quick", "--compare-with", "no-such-revision-anywhere"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "--compare-with no-such-revision-anywhere: not a commit" in proc.stderr
