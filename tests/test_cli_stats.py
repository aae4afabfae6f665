"""``sift stats``: jobs and targets by status, stored bytes, leases, file sizes, counters, the busiest
callers and hosts."""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from cli_helpers import EXPECTED, FROZEN, NOW, connect_ro, dump, populate, run
from freezegun import freeze_time
from helpers import make_job, make_target, make_targets

from sift import dcache
from sift.dcache import stats


def test_json_report(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wal = Path(f"{store_file}-wal")
    wal.write_bytes(b"")  # the sizes reported are the files' as found before the command opened them
    file_bytes, wal_bytes = store_file.stat().st_size, wal.stat().st_size
    with freeze_time(FROZEN):
        code, out, err = run(capsys, "stats", "--db", store_file, "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    with closing(connect_ro(store_file)) as conn:
        jobs = dict(conn.execute("SELECT status, COUNT(*) FROM batch_job GROUP BY status").fetchall())
        targets = dict(conn.execute("SELECT status, COUNT(*) FROM batch_target GROUP BY status").fetchall())
        results = [r for (r,) in conn.execute("SELECT result FROM batch_target WHERE result IS NOT NULL")]
    assert report["jobs"] == {
        "queued": 1,
        "running": 1,
        "done": 1,
        "partial": 1,
        "failed": 1,
        "cancelled": 0,
    }
    assert {k: v for k, v in report["jobs"].items() if v} == jobs
    assert report["targets"] == {"pending": 2, "running": 0, "done": 5, "failed": 3}
    assert {k: v for k, v in report["targets"].items() if v} == targets
    assert (
        report["nbytes"]
        == sum(len(r.encode("utf-8")) for r in results)
        == sum(e.nbytes for e in EXPECTED.values())
    )
    assert report["live_jobs"] == 2
    assert report["oldest_lease"] == {"unix": NOW - 90_000, "utc": "2024-12-30 23:00:00 UTC", "age_s": 90_000}
    assert report["newest_lease"] == {"unix": NOW - 30, "utc": "2024-12-31 23:59:30 UTC", "age_s": 30}
    assert (report["file_bytes"], report["wal_bytes"]) == (file_bytes, wal_bytes) == (file_bytes, 0)
    assert report["db"] == str(store_file)
    assert set(report["counters"]) == set(stats())
    assert set(report["counters"].values()) == {0}  # counters are per process, reset by the open


def test_human_report(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with freeze_time(FROZEN):
        code, out, err = run(capsys, "stats", "--db", store_file, "--counters")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    total = sum(e.nbytes for e in EXPECTED.values())
    assert total == 582  # small enough to show in bytes
    assert "Result bytes  582 B (582 bytes), batch_nbytes()" in lines
    assert "Oldest lease  2024-12-30 23:00:00 UTC  (1d 1h ago)" in lines
    assert "Newest lease  2024-12-31 23:59:30 UTC  (30s ago)" in lines
    assert "Live jobs     2" in lines
    assert re.search(r"^File size +[\d.]+ (B|KiB|MiB) \([\d,]+ bytes\)$", out, re.M)
    jobs = lines[lines.index("Jobs by status") + 1 :]
    assert jobs[:8] == [
        "  status     count",
        "  queued         1",
        "  running        1",
        "  done           1",
        "  partial        1",
        "  failed         1",
        "  cancelled      0",
        "  total          5",
    ]
    targets = lines[lines.index("Targets by status") + 1 :]
    assert targets[:6] == [
        "  status   count",
        "  pending      2",
        "  running      0",
        "  done         5",
        "  failed       3",
        "  total       10",
    ]
    counters = lines[lines.index("Counters (stats(): this process, since it opened the store)") + 1 :]
    assert [line.split()[0] for line in counters[1:]] == list(stats())


def test_empty_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "new.db"
    dcache.open_db(path)
    dcache.close_db()
    code, out, _ = run(capsys, "stats", "--db", path, "--json")
    assert code == 0
    report = json.loads(out)
    assert set(report["jobs"].values()) == {0} and set(report["targets"].values()) == {0}
    assert report["oldest_lease"] is None and report["newest_lease"] is None and report["nbytes"] == 0
    code, out, _ = run(capsys, "stats", "--db", path)
    assert code == 0
    assert "Oldest lease  -" in out.splitlines()


def test_store_from_environment_or_working_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SIFT_DB", raising=False)
    populate(tmp_path / "sift.db")
    code, out, _ = run(capsys, "stats", "--json")
    assert code == 0 and json.loads(out)["db"] == "sift.db"
    assert sum(json.loads(out)["jobs"].values()) == 5
    populate(tmp_path / "env.db")
    dcache.open_db(tmp_path / "other.db")
    dcache.close_db()
    monkeypatch.setenv("SIFT_DB", str(tmp_path / "env.db"))
    code, out, _ = run(capsys, "stats", "--json")
    assert code == 0 and json.loads(out)["db"] == str(tmp_path / "env.db")
    assert sum(json.loads(out)["jobs"].values()) == 5
    # --db wins over the environment, and may come before the command as well as after it.
    for argv in (["stats", "--db", "other.db", "--json"], ["--db", "other.db", "stats", "--json"]):
        code, out, _ = run(capsys, *argv)
        assert code == 0 and json.loads(out)["db"] == "other.db"
        assert sum(json.loads(out)["jobs"].values()) == 0


def test_stats_writes_nothing(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = dump(store_file)
    assert run(capsys, "stats", "--db", store_file)[0] == 0
    assert run(capsys, "stats", "--db", store_file, "--json")[0] == 0
    assert dump(store_file) == before


def test_wal_size_while_another_connection_writes(
    store_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with closing(sqlite3.connect(store_file)) as other:
        other.execute("PRAGMA wal_autocheckpoint = 0")
        with other:
            other.execute("UPDATE batch_job SET error = ? WHERE id = 'job-d'", ("x" * 20_000,))
        wal_bytes = Path(f"{store_file}-wal").stat().st_size
        file_bytes = store_file.stat().st_size
        assert wal_bytes > 20_000
        code, out, _ = run(capsys, "stats", "--db", store_file, "--json")
        assert code == 0
        report = json.loads(out)
        assert (report["file_bytes"], report["wal_bytes"]) == (file_bytes, wal_bytes)
        assert Path(f"{store_file}-wal").stat().st_size == wal_bytes  # read-only: stats wrote nothing
        code, out, _ = run(capsys, "stats", "--db", store_file)
        assert f"WAL size      {wal_bytes / 1024:.1f} KiB ({wal_bytes:,} bytes)" in out.splitlines()


def busy_store(target: str) -> list[dcache.BatchTarget]:
    """Five callers with 2, 4, 6, 8 and 10 pending targets on hosts a.example to d.example, one finished
    job, and a claim of 12 targets (at most 2 per job): what it claimed is returned."""
    dcache.open_db(target)
    try:
        for n in range(5):
            total = 2 * (n + 1)
            targets = [make_target(i, url=f"https://{'abcd'[i % 4]}.example/{n}/{i}") for i in range(total)]
            dcache.create_batch_job(
                make_job(f"job-{n}", caller=f"caller-{n}", targets_total=total, created_at=1_000 + n), targets
            )
        dcache.create_batch_job(make_job("old", caller="gone", status="done"), make_targets(3))
        return dcache.claim_batch_targets(12, per_job=2, runner="r1", now=2_000)
    finally:
        dcache.close_db()


def test_callers_and_busiest_hosts(shared_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Per caller, the pending and running targets of its live jobs; per host, its running targets; each
    list cut at --top, the rest summed in one row (JSON and text)."""
    claimed = busy_store(shared_store)
    assert len(claimed) == 10  # 2 of each of the five jobs
    code, out, err = run(capsys, "stats", "--db", shared_store, "--json", "--top", "2")
    assert (code, err) == (0, "")
    load = json.loads(out)["load"]
    # Outstanding per caller: 2, 4, 6, 8, 10; two of each running.
    assert load["callers"] == [
        {"caller": "caller-4", "pending": 8, "running": 2},
        {"caller": "caller-3", "pending": 6, "running": 2},
    ]
    assert load["other_callers"] == {"caller": "(other)", "pending": 0 + 2 + 4, "running": 6}
    assert load["more_callers"] == 3
    running_by_host: dict[str, int] = {}
    for target in claimed:  # each job's first two by host: a and b of two jobs, a twice of the others
        host = dcache.url_host(target.url)
        running_by_host[host] = running_by_host.get(host, 0) + 1
    assert running_by_host == {"a.example": 8, "b.example": 2}
    assert load["hosts"] == [{"host": "a.example", "running": 8}, {"host": "b.example", "running": 2}]
    assert (load["other_hosts"], load["more_hosts"]) == ({"host": "(other)", "running": 0}, 0)
    code, out, _ = run(capsys, "stats", "--db", shared_store, "--top", "2")
    lines = out.splitlines()
    at = lines.index("Callers (targets of their queued and running jobs)")
    assert lines[at + 1 : at + 5] == [
        "  caller           pending  running",
        "  caller-4               8        2",
        "  caller-3               6        2",
        "  3 other callers        6        6",
    ]
    at = lines.index("Busiest hosts (running targets)")
    assert lines[at + 1 : at + 4] == ["  host       running", "  a.example        8", "  b.example        2"]


def test_callers_and_hosts_of_an_idle_store(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No target running: every caller's outstanding targets are pending, and no host is busy."""
    code, out, _ = run(capsys, "stats", "--db", store_file, "--json")
    assert code == 0
    load = json.loads(out)["load"]
    live = {e.caller for job_id, e in EXPECTED.items() if job_id in ("job-b", "job-d")}
    assert {row["caller"] for row in load["callers"]} == live
    assert sum(row["pending"] for row in load["callers"]) == 2  # the store's two pending targets
    assert all(row["running"] == 0 for row in load["callers"]) and load["hosts"] == []
    code, out, _ = run(capsys, "stats", "--db", store_file)
    assert code == 0
    lines = out.splitlines()
    assert lines[lines.index("Busiest hosts (running targets)") + 1] == "  none: no target is running"


def test_top_must_be_positive(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "stats", "--db", store_file, "--top", "0")
    assert code != 0 and out == "" and "--top" in err
