"""``sift simulate``: a small workload; the invariants it reports are checked again here, independently,
by reading the file with plain sqlite3 and computing sizes in Python."""

from __future__ import annotations

import json
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import connect_ro, run, run_on_terminal, sift_script
from conftest import drop_schema

from sift import dcache
from sift.cli import build_parser
from sift.cli.simulation.single import CLAIM_LIMIT
from sift.cli.simulation.workload import Settings, plan
from sift.cli.units import parse_duration, parse_size

SMALL = [
    "--jobs",
    "40",
    "--targets",
    "6",
    "--workers",
    "3",
    "--budget",
    "64KiB",
    "--ttl",
    "10m",
    "--seed",
    "3",
]
SMALL_SETTINGS = Settings(jobs=40, targets=6, workers=3, budget=64 * 1024, ttl=600, seed=3)


def independent_view(path: Path) -> dict[str, Any]:
    """Counts and sums over the file, with sizes computed in Python from the stored text."""
    with closing(connect_ro(path)) as conn:
        jobs = conn.execute(
            "SELECT id, status, targets_done, targets_total, nbytes FROM batch_job"
        ).fetchall()
        targets = conn.execute("SELECT job_id, status, result FROM batch_target").fetchall()
    finished: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for job_id, status, result in targets:
        finished[job_id] = finished.get(job_id, 0) + (status in ("done", "failed"))
        sizes[job_id] = sizes.get(job_id, 0) + (0 if result is None else len(result.encode("utf-8")))
    by_status: dict[str, int] = {}
    for _, status, _, _, _ in jobs:
        by_status[status] = by_status.get(status, 0) + 1
    ids = {row[0] for row in jobs}
    return {
        "jobs": len(jobs),
        "by_status": by_status,
        "bad_done": [row[0] for row in jobs if row[2] != finished.get(row[0], 0)],
        "bad_bytes": [row[0] for row in jobs if row[4] != sizes.get(row[0], 0)],
        "over_total": [row[0] for row in jobs if row[2] > row[3]],
        "nbytes": sum(row[4] for row in jobs),
        "orphans": sum(1 for job_id, _, _ in targets if job_id not in ids),
        "non_ascii_results": sum(1 for _, _, r in targets if r is not None and not r.isascii()),
    }


def test_small_workload_and_its_invariants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sim.db"
    code, out, err = run(capsys, "simulate", "--db", path, "--json", *SMALL)
    assert err == ""  # no progress bar off a terminal
    summary = json.loads(out)
    assert code == 0 and summary["ok"] is True
    assert [check["ok"] for check in summary["invariants"]] == [True] * len(summary["invariants"])
    view = independent_view(path)
    assert view["bad_done"] == [] and view["bad_bytes"] == [] and view["over_total"] == []
    assert view["orphans"] == 0
    assert view["non_ascii_results"] > 0  # so UTF-8 bytes and len() differ somewhere
    assert {k: v for k, v in summary["jobs"].items() if v} == view["by_status"]
    assert view["by_status"].keys() <= {"done", "partial", "failed"}  # nothing left queued or running
    assert summary["bytes_stored"] == view["nbytes"] <= 64 * 1024 == summary["budget"]
    t = summary["tally"]
    assert t["submissions"] == 40 == t["jobs_created"] + t["idem_hits"]
    assert t["idem_hits"] == summary["counters"]["batch_idem_hit"]
    assert t["idem_hits"] + t["idem_started_anew"] == sum(spec.repeat for spec in plan(SMALL_SETTINGS))
    assert t["jobs_evicted"] == summary["counters"]["jobs_evicted"] > 0
    assert t["jobs_swept"] == summary["counters"]["jobs_swept"]
    # The runners claim from the store and write each result once: claims and writes agree with the counters.
    assert t["targets_written"] == summary["counters"]["target_writes"]
    assert t["targets_claimed"] == summary["counters"]["targets_claimed"] >= t["targets_written"]
    assert summary["restart_after_submissions"] == 20
    # The runner crashed at a claim, holding it: the restart requeued those targets and failed nothing, so
    # no job is failed by it.
    assert t["restart_requeued"] >= 1
    assert summary["counters"]["jobs_marked_failed"] == 0 and t["restart_failed"] == 0
    assert t["restart_requeued"] + t["stale_requeued"] <= summary["counters"]["targets_requeued"]
    with closing(connect_ro(path)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM batch_target WHERE status = 'running'").fetchone()[0] == 0
        errors = conn.execute("SELECT COUNT(*) FROM batch_job WHERE error LIKE '%restart%'").fetchone()[0]
        assert errors == 0
    # Every job the store still holds was created by this run; evicted and swept jobs are gone.
    assert view["jobs"] == t["jobs_created"] - t["jobs_evicted"] - t["jobs_swept"]


def test_repeats_are_answered_from_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With room for everything (nothing evicted or swept), a repeated key is answered with the job already
    submitted, unless that job failed (every target failed; never the restart): then it starts anew."""
    path = tmp_path / "sim.db"
    argv = [
        "--jobs",
        "60",
        "--targets",
        "4",
        "--workers",
        "2",
        "--budget",
        "1GB",
        "--ttl",
        "7d",
        "--seed",
        "5",
    ]
    code, out, _ = run(capsys, "simulate", "--db", path, "--json", *argv)
    summary = json.loads(out)
    assert code == 0 and summary["ok"] is True
    t = summary["tally"]
    assert t["jobs_evicted"] == t["jobs_swept"] == 0
    specs = plan(Settings(jobs=60, targets=4, seed=5))
    with closing(connect_ro(path)) as conn:
        jobs = conn.execute("SELECT idem_key, status, error, created_at, id FROM batch_job").fetchall()
    assert len(jobs) == t["jobs_created"]
    chains: dict[str, list[tuple[str, str, str, int, str]]] = {}
    for job in jobs:
        if job[0]:
            chains.setdefault(job[0].split("-", 2)[2], []).append(job)
    started_anew = 0
    for key, chain in chains.items():
        chain.sort(key=lambda job: job[4])  # ids carry the submission number
        repeats = sum(1 for spec in specs if spec.idem_key == key and spec.repeat)
        assert len(chain) - 1 <= repeats
        assert all(job[1] == "failed" for job in chain[:-1])  # only a failed job is submitted again
        started_anew += len(chain) - 1
    assert t["idem_started_anew"] == started_anew
    assert t["idem_hits"] == sum(spec.repeat for spec in specs) - started_anew
    assert not any(job[2] == "runner restarted (simulated crash)" for job in jobs)


def test_human_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "--db", tmp_path / "sim.db", *SMALL)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(
        "Simulated 40 submissions from 6 callers (3 fleet, 3 restricted) with 3 workers in "
    )
    labels = [line.split("  ")[1] for line in lines[2:12]]
    assert labels == [
        "store",
        "jobs created",
        "targets written",
        "idempotent repeats",
        "claims",
        "runner restart",
        "sweeps",
        "eviction",
        "bytes stored",
        "polls",
    ]
    assert lines[2].split() == ["store", str(tmp_path / "sim.db")]
    assert "targets/s" in lines[4]
    assert "of 64.0 KiB budget" in lines[10]
    checks = lines[lines.index("Invariants") + 1 : -2]
    assert len(checks) == 10 and all(line.startswith("  ok    ") for line in checks)
    assert lines[-1] == "All invariants hold."
    jobs = lines[lines.index("Jobs by status") + 2 : lines.index("Invariants") - 1]
    assert [line.split()[0] for line in jobs] == [
        "queued",
        "running",
        "done",
        "partial",
        "failed",
        "cancelled",
    ]


def test_a_broken_store_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """If a write miscounted bytes, the check says so and the exit status is not 0."""
    real = dcache.update_batch_targets

    def miscounting(job_id: str, results: list[dict[str, Any]], **kwargs: Any) -> int:
        written = real(job_id, results, **kwargs)
        if any(entry.get("result") is not None for entry in results):
            dcache.db.execute_sql("UPDATE batch_job SET nbytes = nbytes + 1 WHERE id = ?", (job_id,))
        return written

    monkeypatch.setattr(dcache, "update_batch_targets", miscounting)
    code, out, _ = run(capsys, "simulate", "--db", tmp_path / "sim.db", *SMALL)
    assert code == 1
    lines = out.splitlines()
    assert lines[-1] == "INVARIANTS FAILED: the store is inconsistent."
    failed = [line for line in lines if line.startswith("  FAIL")]
    assert failed and failed[0].startswith("  FAIL  nbytes equals the UTF-8 bytes of each job's results (")
    assert all("targets_done" not in line for line in failed)


def test_a_second_run_on_the_same_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The file now holds jobs this run did not make: the second run refuses it and leaves it as it was."""
    path = tmp_path / "sim.db"
    assert run(capsys, "simulate", "--db", path, "--json", *SMALL)[0] == 0
    before = path.read_bytes()
    code, out, err = run(capsys, "simulate", "--db", path, "--json", *SMALL)
    assert (code, out) == (1, "")
    assert err.startswith(f"sift: --db: {path} already holds jobs; ") and err.count("\n") == 1
    assert path.read_bytes() == before
    view = independent_view(path)
    assert view["bad_done"] == [] and view["bad_bytes"] == []


def test_postgres_without_the_driver_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the postgres extra, a postgresql:// store is refused as every other command refuses it."""
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what an install without sift[postgres] has
    code, out, err = run(capsys, "simulate", "--db", "postgresql://nobody@127.0.0.1:1/none", *SMALL)
    assert (code, out) == (1, "")
    assert err.startswith("sift: --db: a PostgreSQL store needs psycopg 3: pip install 'sift[postgres]' (")
    assert err.count("\n") == 1


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_tiny_workloads(tmp_path: Path, capsys: pytest.CaptureFixture[str], jobs: str) -> None:
    code, out, _ = run(
        capsys, "simulate", "--db", tmp_path / "sim.db", "--json", "--jobs", jobs, "--workers", "1"
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["ok"] is True and summary["tally"]["submissions"] == int(jobs)
    assert summary["tally"]["restart_requeued"] >= 1 and summary["tally"]["restart_failed"] == 0


def test_in_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "--db", ":memory:", "--json", *SMALL)
    assert code == 0 and json.loads(out)["ok"] is True


def test_plan_follows_the_seed() -> None:
    settings = Settings(jobs=60, targets=5, seed=7)
    assert plan(settings) == plan(settings)
    assert plan(settings) != plan(Settings(jobs=60, targets=5, seed=8))
    specs = plan(settings)
    assert {spec.caller_class for spec in specs} == {"fleet", "restricted"}
    assert any(spec.repeat for spec in specs)
    assert all(1 <= spec.targets <= 5 for spec in specs)
    for spec in specs:
        if spec.repeat:  # a repeat names an earlier key of the same caller, with the same targets
            first = next(s for s in specs if s.idem_key == spec.idem_key and not s.repeat)
            assert (first.caller, first.targets) == (spec.caller, spec.targets) and first.number < spec.number


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    argv = [str(sift_script()), "simulate", "--db", str(tmp_path / "sim.db"), *SMALL]
    code, out, terminal = run_on_terminal(argv, tmp_path)
    assert code == 0 and out.splitlines()[-1] == "All invariants hold."
    assert "simulate:" in terminal and "/40 [" in terminal


def test_command_line_defaults_are_the_settings_defaults() -> None:
    args = build_parser().parse_args(["simulate"])
    assert (args.jobs, args.targets, args.workers, args.seed) == (
        Settings().jobs,
        Settings().targets,
        Settings().workers,
        Settings().seed,
    )
    assert parse_size(args.budget) == Settings().budget
    assert parse_duration(args.ttl) == Settings().ttl


# -- The flood workload ----------------------------------------------------------------------------------

#: Four flood jobs of 150 targets, then one small job from each small caller: the small callers submit
#: while most of the flood is still pending.
FLOOD = ["--workload", "flood", "--jobs", "8", "--targets", "150", "--workers", "3", "--budget", "1GB"]
FLOOD_TARGETS = 4 * 150
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def flood_run(capsys: pytest.CaptureFixture[str], target: str, *extra: str) -> dict[str, Any]:
    code, out, err = run(capsys, "simulate", "--db", target, "--json", *FLOOD, *extra)
    summary: dict[str, Any] = json.loads(out)
    failed = [check for check in summary["invariants"] if not check["ok"]]
    assert (code, failed, err) == (0, [], "")
    return summary


def small_callers(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = summary["fairness"]["callers"]
    assert [row["caller"] for row in rows] == ["flood", "small-0", "small-1", "small-2", "small-3"]
    assert rows[0]["targets"] == FLOOD_TARGETS and rows[0]["jobs"] == 4
    return rows[1:]


@pytest.mark.slow
@pytest.mark.parametrize("store_target", BACKENDS, indirect=True)
def test_flood_fair_and_oldest_first(store_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Fair claiming hands each small caller a target within a few claims of its first submission, while
    most of the flood is still pending; oldest-first claiming hands out the flood first (all of it but what
    is left of its last job, which a claim passes after taking per_job of it).
    Counted in claims (the runners claim one at a time, under the lock that records them), not in time."""
    fair = flood_run(capsys, store_target)
    assert fair["fairness"]["claim"] == {}
    for row in small_callers(fair):
        assert row["first_result_s"] is not None and row["last_result_s"] >= row["first_result_s"]
        # A claim running at the submission, then the round robin: a small caller waits two claims at most.
        assert row["flood_before_first"] <= 2 * CLAIM_LIMIT
        assert row["flood_at_submit"] + row["flood_before_first"] < FLOOD_TARGETS
    assert fair["fairness"]["small_first_result_median_s"] is not None
    dcache.close_db()
    if store_target.startswith("postgresql"):
        drop_schema(store_target.rpartition("schema=")[2])
    else:
        for path in Path(store_target).parent.glob("sim.db*"):
            path.unlink()
    oldest = flood_run(capsys, store_target, "--oldest-first")
    assert oldest["fairness"]["claim"] == {"fair": False}
    for row in small_callers(oldest):
        # A claim (4 targets, 2 per job) reaches a newer job only once at most one older job has pending
        # targets left: every flood job but one was handed out whole before the small caller's first.
        assert row["flood_at_submit"] + row["flood_before_first"] >= FLOOD_TARGETS - FLOOD_TARGETS // 4
    fair_waits = sorted(row["flood_before_first"] for row in small_callers(fair))
    oldest_waits = sorted(row["flood_before_first"] for row in small_callers(oldest))
    assert fair_waits[-1] < oldest_waits[0]


@pytest.mark.slow
@pytest.mark.parametrize("store_target", BACKENDS, indirect=True)
def test_flood_with_a_per_host_limit(store_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--per-host 2: the end check asserts no host ever had more than 2 targets running, counted from the
    runners' in-flight targets; the hot hosts reached the limit."""
    summary = flood_run(capsys, store_target, "--per-host", "2")
    fairness = summary["fairness"]
    assert fairness["claim"] == {"per_host": 2}
    check = [c for c in summary["invariants"] if c["name"] == "no host ever had more than 2 targets running"]
    assert check and check[0]["ok"]
    peaks = fairness["host_peaks"]
    assert max(peaks.values()) == fairness["busiest_host_peak"] <= 2
    assert {peaks[f"hot-{n}.example"] for n in range(3)} == {2}
    assert summary["tally"]["targets_written"] >= FLOOD_TARGETS


def test_flood_human_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workload", "flood", "--jobs", "6", "--targets", "10", "--weights", "restricted=2,fleet=1"]
    code, out, _ = run(capsys, "simulate", "--db", tmp_path / "sim.db", *argv)
    assert code == 0
    lines = out.splitlines()
    at = lines.index("Callers (claim_batch_targets with weights={'restricted': 2, 'fleet': 1})")
    assert lines[at + 1].split() == [
        *("caller", "class", "jobs", "targets", "first", "result", "last", "result"),
        *("flood", "targets", "before", "its", "first"),
    ]
    assert [line.split()[0] for line in lines[at + 2 : at + 6]] == ["flood", "small-0", "small-1", "small-2"]
    assert lines[at + 7].startswith(
        "Busiest hosts (peak of targets running at once, from the runner threads'"
    )
    assert lines[-1] == "All invariants hold."


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--weights", "fleet"], "sift: --weights: expected CLASS=N[,CLASS=N]"),
        (["--weights", "fleet=0"], "sift: --weights: expected CLASS=N[,CLASS=N]"),
        (["--weights", "fleet=2,fleet=3"], "sift: --weights: expected CLASS=N[,CLASS=N]"),
        (["--weights", "=2"], "sift: --weights: expected CLASS=N[,CLASS=N]"),
    ],
)
def test_bad_weights_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "simulate", "--db", tmp_path / "sim.db", *argv)
    assert (code, out) == (1, "")
    assert err.startswith(message)
    assert list(tmp_path.iterdir()) == []
