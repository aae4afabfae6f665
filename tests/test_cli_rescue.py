"""``sift rescue`` (requeue_stale_claims) and ``sift reconcile``'s confirmation and dry run, on stores that
hold data: a dry run lists exactly what the real run then moves, and changes nothing."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from pathlib import Path

import pytest
from cli_helpers import dump, populate, run, sift_script
from helpers import make_job, make_targets

from sift import dcache


@pytest.fixture
def claimed_store(tmp_path: Path) -> Path:
    """The CLI tests' store, plus a job whose runner died holding 3 targets, one at its third attempt."""
    path = tmp_path / "store.db"
    populate(path)
    dcache.open_db(path)
    dcache.create_batch_job(make_job("claimed", targets_total=4, created_at=50), make_targets(4))
    dcache.claim_batch_targets(3, fair=False, runner="dead-host:7", now=1_000)  # the oldest job: "claimed"
    dcache.db.execute_sql("UPDATE batch_target SET attempts = 3 WHERE job_id = 'claimed' AND idx = 2")
    dcache.close_db()
    return path


def claimed_targets(path: Path) -> list[tuple[object, ...]]:
    rows = [row for row in dump(path)["batch_target"] if row[0] == "claimed"]
    return sorted(
        (row[1], row[4], row[6], row[8], row[10]) for row in rows
    )  # idx status error runner attempts


def test_rescue_dry_run_lists_what_moves_and_changes_nothing(
    claimed_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = dump(claimed_store)
    code, out, err = run(capsys, "rescue", "--stale-after", "5m", "--dry-run", "--db", claimed_store)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == (
        "dry run: would requeue 2 targets to pending and would fail 1 at attempt 3 "
        "(claims not renewed for 5m); nothing was changed"
    )
    assert lines[1].split()[:4] == ["job", "idx", "runner", "attempts"]
    assert [line.split()[:4] for line in lines[2:]] == [
        ["claimed", "0", "dead-host:7", "1"],
        ["claimed", "1", "dead-host:7", "1"],
        ["claimed", "2", "dead-host:7", "3"],
    ]
    assert [line.split()[-1] for line in lines[2:]] == ["pending", "pending", "failed"]
    assert dump(claimed_store) == before


def test_rescue_moves_the_stale_claims(claimed_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "rescue", "--stale-after", "300", "--json", "--db", claimed_store)
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert (report["moved"], report["requeued"], report["failed"], report["dry_run"]) == (3, 2, 1, False)
    assert [(t["job_id"], t["idx"], t["becomes"]) for t in report["targets"]] == [
        ("claimed", 0, "pending"),
        ("claimed", 1, "pending"),
        ("claimed", 2, "failed"),
    ]
    assert claimed_targets(claimed_store) == [
        (0, "pending", None, None, 1),
        (1, "pending", None, None, 1),
        (2, "failed", "runner stopped", None, 3),  # a failure ends the claim
        (3, "pending", None, None, 0),
    ]
    job = next(row for row in dump(claimed_store)["batch_job"] if row[0] == "claimed")
    assert job[4] == "running" and job[7] == 1  # targets_done counts the failed target once
    code, out, _ = run(capsys, "rescue", "--stale-after", "300", "--db", claimed_store)
    assert out.startswith("requeued 0 targets to pending and failed 0 at attempt 3")


@pytest.mark.parametrize("bad", [["--max-attempts", "0"], ["--stale-after", "-1"], ["--stale-after", "soon"]])
def test_rescue_refuses_bad_values_and_changes_nothing(
    claimed_store: Path, capsys: pytest.CaptureFixture[str], bad: list[str]
) -> None:
    before = dump(claimed_store)
    argv = ["rescue", "--stale-after", "60", *bad] if bad[0] == "--max-attempts" else ["rescue", *bad]
    code, _, err = run(capsys, *argv, "--db", claimed_store)
    assert code in (1, 2) and err
    assert dump(claimed_store) == before


def test_reconcile_dry_run_lists_the_live_jobs_and_changes_nothing(
    claimed_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = dump(claimed_store)
    code, out, err = run(
        capsys, "reconcile", "--reason", "restart", "--dry-run", "--json", "--db", claimed_store
    )
    assert (code, err) == (0, "")
    report = json.loads(out)
    live = sorted(row[0] for row in before["batch_job"] if row[4] in ("queued", "running"))
    assert sorted(report["job_ids"]) == live and report["jobs"] == len(live) == 3
    assert dump(claimed_store) == before
    code, out, _ = run(capsys, "reconcile", "--reason", "restart", "--yes", "--json", "--db", claimed_store)
    assert json.loads(out) == {"marked": 3, "reason": "restart"}


def reconcile_on_a_terminal(path: Path, answer: str) -> tuple[int, str]:
    """``sift reconcile`` with its standard input on a pseudo-terminal, answering ``answer``."""
    master, slave = pty.openpty()
    argv = [str(sift_script()), "reconcile", "--reason", "restart", "--db", str(path)]
    try:
        proc = subprocess.Popen(argv, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        os.close(slave)
    os.write(master, answer.encode() + b"\n")
    out, err = proc.communicate(timeout=120)
    os.close(master)
    return proc.returncode, out.decode() + err.decode()


def test_reconcile_asks_on_a_terminal(claimed_store: Path) -> None:
    before = dump(claimed_store)
    code, text = reconcile_on_a_terminal(claimed_store, "n")
    assert code == 1 and "fail 3 queued or running jobs? [y/N]" in text and "nothing was changed" in text
    assert dump(claimed_store) == before
    code, text = reconcile_on_a_terminal(claimed_store, "y")
    assert code == 0 and "marked 3 queued or running jobs as failed" in text
