"""``sift sweep``, ``sift evict`` and ``sift reconcile``: each reports what it did; ``--dry-run`` reports
what would go, exactly what the real run then removes, and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import (
    EXPECTED,
    FROZEN,
    NOW,
    dump,
    job_ids,
    run,
    run_on_terminal,
    sift_script,
    snapshot_of,
    store_of_25_jobs,
)
from freezegun import freeze_time
from helpers import job_with_bytes

from sift import dcache

TOTAL = sum(e.nbytes for e in EXPECTED.values())
A, B, E = EXPECTED["job-a"].nbytes, EXPECTED["job-b"].nbytes, EXPECTED["job-e"].nbytes


# -- sweep -------------------------------------------------------------------------------------------------

SWEEPS = [
    ("3650d", set()),
    ("24h", {"job-c"}),
    ("86400", {"job-c"}),
    ("2h", {"job-e", "job-c"}),
    ("1h", {"job-a", "job-e", "job-c"}),  # job-a's lease is exactly now - 1h: lease + ttl <= now
    ("3599s", {"job-a", "job-e", "job-c"}),
    ("90s", {"job-a", "job-e", "job-c"}),
    ("60s", {"job-a", "job-b", "job-e", "job-c"}),
    ("0", set(EXPECTED)),
]


@pytest.mark.parametrize(("ttl", "expected"), SWEEPS)
def test_sweep_dry_run_predicts_the_sweep(
    store_file: Path, capsys: pytest.CaptureFixture[str], ttl: str, expected: set[str]
) -> None:
    before = snapshot_of(store_file)
    with freeze_time(FROZEN):
        code, out, err = run(capsys, "sweep", "--ttl", ttl, "--dry-run", "--json", "--db", store_file)
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert snapshot_of(store_file) == before
    assert set(report["job_ids"]) == expected and report["jobs"] == len(expected)
    assert report["nbytes"] == sum(EXPECTED[j].nbytes for j in expected)
    assert report["targets"] == sum(
        len([r for r in dump(store_file)["batch_target"] if r[0] == j]) for j in expected
    )
    assert report["dry_run"] is True and report["now"] == NOW
    with freeze_time(FROZEN):
        code, out, _ = run(capsys, "sweep", "--ttl", ttl, "--json", "--db", store_file)
    assert code == 0
    done = json.loads(out)
    assert done["swept"] == len(expected)
    assert job_ids(store_file) == set(EXPECTED) - expected
    assert (done["nbytes_before"], done["nbytes_after"]) == (TOTAL, TOTAL - report["nbytes"])
    assert done["jobs_left"] == len(EXPECTED) - len(expected)


def test_sweep_human_output(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with freeze_time(FROZEN):
        code, out, _ = run(capsys, "sweep", "--ttl", "1h", "--dry-run", "--db", store_file)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        f"dry run: would sweep 3 jobs (7 targets, {A + E} B of results) with a lease on or before "
        "2024-12-31 23:00:00 UTC, ttl 1h; nothing was changed"
    )
    assert lines[1].split() == ["id", "caller", "status", "bytes", "lease", "age"]
    assert [line.split()[0] for line in lines[2:]] == ["job-c", "job-e", "job-a"]  # oldest lease first
    with freeze_time(FROZEN):
        code, out, _ = run(capsys, "sweep", "--ttl", "1h", "--db", store_file)
    assert out == (
        "swept 3 jobs with a lease on or before 2024-12-31 23:00:00 UTC, ttl 1h; "
        f"freed {A + E} B; 2 jobs and {B} B of results remain\n"
    )


def test_sweep_dry_run_lists_at_most_20(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = store_of_25_jobs(tmp_path, first_at=100)
    code, out, _ = run(capsys, "sweep", "--ttl", "1d", "--dry-run", "--db", path)
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[2:22]] == [f"job-{n:02d}" for n in range(20)]
    assert lines[22:] == ["  … and 5 more"]
    assert len(job_ids(path)) == 25


# -- evict -------------------------------------------------------------------------------------------------

EVICTIONS = [
    (str(TOTAL), []),
    ("1GB", []),
    (str(TOTAL - 1), ["job-e"]),
    (str(A + B), ["job-e"]),
    (str(A + B - 1), ["job-e", "job-a"]),
    (str(B), ["job-e", "job-a"]),
    ("0", ["job-e", "job-a"]),  # job-b (running) keeps its bytes; job-c holds none
]


@pytest.mark.parametrize(("max_bytes", "expected"), EVICTIONS)
def test_evict_dry_run_predicts_the_eviction(
    store_file: Path, capsys: pytest.CaptureFixture[str], max_bytes: str, expected: list[str]
) -> None:
    before = snapshot_of(store_file)
    code, out, err = run(capsys, "evict", "--max-bytes", max_bytes, "--dry-run", "--json", "--db", store_file)
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert snapshot_of(store_file) == before
    assert report["job_ids"] == expected  # in eviction order: oldest lease first
    freed = sum(EXPECTED[j].nbytes for j in expected)
    assert (report["nbytes_before"], report["nbytes"], report["nbytes_after"]) == (
        TOTAL,
        freed,
        TOTAL - freed,
    )
    code, out, _ = run(capsys, "evict", "--max-bytes", max_bytes, "--json", "--db", store_file)
    assert code == 0
    done = json.loads(out)
    assert done["evicted"] == len(expected)
    assert job_ids(store_file) == set(EXPECTED) - set(expected)
    assert (done["nbytes_before"], done["nbytes_after"]) == (TOTAL, TOTAL - freed)


def test_evict_order_follows_lease_then_created_at_then_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "order.db"
    dcache.open_db(path)
    rows = [("b", 10, 5), ("a", 10, 5), ("c", 10, 4), ("d", 9, 9), ("e", 11, 1)]  # id, lease, created_at
    for job_id, lease, created in rows:
        job_with_bytes(job_id, 10, status="done", created_at=created, lease=lease)
    dcache.close_db()
    code, out, _ = run(capsys, "evict", "--max-bytes", "0", "--dry-run", "--json", "--db", path)
    assert code == 0
    assert json.loads(out)["job_ids"] == ["d", "c", "a", "b", "e"]
    code, out, _ = run(capsys, "evict", "--max-bytes", "25", "--dry-run", "--json", "--db", path)
    assert json.loads(out)["job_ids"] == ["d", "c", "a"]


def test_evict_human_output(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "evict", "--max-bytes", "0", "--dry-run", "--db", store_file)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        f"dry run: would evict 2 jobs, freeing {A + E} B: {TOTAL} B -> {B} B (max 0 B); nothing was changed"
    )
    assert lines[1] == f"  still over by {B} B: queued and running jobs are never evicted"
    assert [line.split()[0] for line in lines[3:]] == ["job-e", "job-a"]
    code, out, _ = run(capsys, "evict", "--max-bytes", "0", "--db", store_file)
    assert out.splitlines() == [
        f"evicted 2 jobs, freeing {A + E} B: {TOTAL} B -> {B} B (max 0 B)",
        f"  still over by {B} B: queued and running jobs are never evicted",
    ]
    code, out, _ = run(capsys, "evict", "--max-bytes", "1MiB", "--db", store_file)
    assert out == f"evicted 0 jobs, freeing 0 B: {B} B -> {B} B (max 1.0 MiB)\n"


def test_evict_dry_run_pages_through_many_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "many.db"
    dcache.open_db(path)
    with dcache.db.atomic():  # one transaction: quick to set up
        for n in range(1200):  # more than two pages of the dry run's walk
            job_with_bytes(f"job-{n:04d}", 1, status="done", created_at=n, lease=n // 7)
    dcache.close_db()
    code, out, _ = run(capsys, "evict", "--max-bytes", "100", "--dry-run", "--json", "--db", path)
    assert code == 0
    predicted = json.loads(out)["job_ids"]
    assert predicted == [f"job-{n:04d}" for n in range(1100)]
    assert run(capsys, "evict", "--max-bytes", "100", "--db", path)[0] == 0
    assert job_ids(path) == {f"job-{n:04d}" for n in range(1100, 1200)}


# -- reconcile ---------------------------------------------------------------------------------------------


def test_reconcile(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with freeze_time(FROZEN):
        code, out, err = run(capsys, "reconcile", "--reason", "service restarted", "--db", store_file)
    assert (code, err) == (0, "")
    assert out == "marked 2 queued or running jobs as failed, with error 'service restarted'\n"
    jobs = {row[0]: row for row in dump(store_file)["batch_job"]}
    for job_id in ("job-b", "job-d"):
        assert (jobs[job_id][4], jobs[job_id][5], jobs[job_id][9]) == ("failed", "service restarted", NOW)
    assert jobs["job-a"][4:6] == ("done", "")
    with freeze_time(FROZEN):
        code, out, _ = run(capsys, "reconcile", "--reason", "again", "--json", "--db", store_file)
    assert (code, json.loads(out)) == (0, {"marked": 0, "reason": "again"})


# -- progress bars -----------------------------------------------------------------------------------------


def test_no_progress_bar_off_a_terminal(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["sweep", "--ttl", "0"], ["evict", "--max-bytes", "0"]):
        code, _, err = run(capsys, *argv, "--db", store_file)
        assert (code, err) == (0, "")


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    path = tmp_path / "many.db"
    dcache.open_db(path)
    with dcache.db.atomic():  # one transaction: quick to set up
        for n in range(300):
            job_with_bytes(f"job-{n:03d}", 100, status="done", lease=n)
    dcache.close_db()
    code, out, terminal = run_on_terminal(
        [str(sift_script()), "evict", "--max-bytes", "10000", "--db", str(path)], tmp_path
    )
    assert code == 0 and out.startswith("evicted 200 jobs")
    assert "evict:" in terminal and "%|" in terminal
    code, out, terminal = run_on_terminal(
        [str(sift_script()), "sweep", "--ttl", "0", "--db", str(path)], tmp_path
    )
    assert code == 0 and out.startswith("swept 100 jobs")
    assert "sweep:" in terminal and "100/100" in terminal
