"""``sift check``: names each broken invariant and exits 1; ``--repair`` fixes what is derived; ``--json``;
a bar on a terminal only."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from cli_helpers import dump, run, run_on_terminal, sift_script


def foreign(path: Path, *statements: str) -> None:
    """Writes by another program, on its own connection."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for statement in statements:
            conn.execute(statement)


def test_a_consistent_store_is_ok(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = dump(store_file)
    assert run(capsys, "check", "--db", store_file) == (
        0,
        f"ok: 5 jobs and 10 targets in {store_file}, no problem found\n",
        "",
    )
    code, out, err = run(capsys, "check", "--json", "--db", store_file)
    assert (code, err) == (0, "")
    assert json.loads(out) == {"ok": True, "jobs": 5, "targets": 10, "violations": [], "repairs": []}
    assert dump(store_file) == before


def test_problems_are_named_and_repaired(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    foreign(
        store_file,
        "UPDATE batch_job SET targets_done = 1 WHERE id = 'job-a'",
        "DELETE FROM batch_job WHERE id = 'job-c'",
    )
    before = dump(store_file)
    code, out, err = run(capsys, "check", "--db", store_file)
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        f"2 problems in {store_file} (4 jobs and 10 targets):",
        "  targets_done (job 'job-a'): targets_done is 1, but 3 targets are done or failed",
        "  orphan_targets (job 'job-c'): 2 targets without their job",
        "`sift check --repair` recomputes targets_done, nbytes and the total, deletes orphan targets",
    ]
    assert dump(store_file) == before
    code, out, err = run(capsys, "check", "--repair", "--db", store_file)
    assert (code, err) == (1, "")  # something was wrong
    assert out.splitlines()[3:] == [
        "repaired (2):",
        "  targets_done (job 'job-a'): 1 -> 3",
        "  orphan_targets (job 'job-c'): deleted 2 targets",
    ]
    assert run(capsys, "check", "--db", store_file)[:2] == (
        0,
        f"ok: 4 jobs and 8 targets in {store_file}, no problem found\n",
    )


def test_json_report(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    foreign(store_file, "UPDATE batch_job SET status = 'lost' WHERE id = 'job-d'")
    code, out, err = run(capsys, "check", "--json", "--repair", "--db", store_file)
    assert (code, err) == (1, "")
    assert json.loads(out) == {
        "ok": False,
        "jobs": 5,
        "targets": 10,
        "violations": [
            {
                "kind": "job_status",
                "job_id": "job-d",
                "detail": "status 'lost' is not one of queued, running, done, partial, failed, cancelled",
            }
        ],
        "repairs": [],
    }


def test_what_repair_leaves_is_said(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    foreign(store_file, "UPDATE batch_target SET idx = 9 WHERE job_id = 'job-d'")
    code, out, _ = run(capsys, "check", "--repair", "--db", store_file)
    assert code == 1
    assert out.splitlines()[1:] == [
        "  target_idx (job 'job-d'): target idx outside 0..0 (targets_total - 1): 9",
        "left for a person to decide: statuses outside the enums, idx out of range, a damaged file",
    ]


def test_a_bar_on_a_terminal_only(store_file: Path, tmp_path: Path) -> None:
    code, out, terminal = run_on_terminal([str(sift_script()), "check", "--db", str(store_file)], tmp_path)
    assert code == 0 and out.startswith("ok: 5 jobs")
    assert "check:" in terminal and "5/5" in terminal


def test_check_opens_read_only_and_sees_a_drifted_total(
    store_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --repair, check opens the store read-only: open_db does not mend the total first, the
    check reports it, and the file is not written."""
    foreign(store_file, "UPDATE batch_totals SET nbytes = nbytes + 7")
    before = store_file.read_bytes()
    code, out, _ = run(capsys, "check", "--db", store_file)
    assert code == 1
    assert "total" in out and "but SUM(nbytes) is" in out
    assert store_file.read_bytes() == before


def test_check_of_a_missing_store_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check", "--db", tmp_path / "typo.db")
    assert (code, out) == (1, "")
    assert err == f"sift: path: no store at '{tmp_path / 'typo.db'}'; `sift init` creates one\n"
    assert list(tmp_path.iterdir()) == []


def test_a_dropped_trigger_is_named_then_repaired(
    store_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain check (read-only) says what the file lacks and how to add it; --repair adds it, says so,
    and checks the rest; a second check is clean."""
    foreign(
        store_file,
        "DROP TRIGGER batch_totals_update",
        "UPDATE batch_job SET targets_done = 1 WHERE id = 'job-a'",
    )
    before = dump(store_file)
    code, out, err = run(capsys, "check", "--db", store_file)
    assert (code, out) == (1, "")
    assert err == (
        f"sift: {store_file} lacks batch_totals_update (written by another program or an older sift?): "
        "`sift check --repair` adds what is missing, then checks the rest\n"
    )
    assert dump(store_file) == before
    code, out, _ = run(capsys, "check", "--repair", "--db", store_file)
    assert code == 1
    assert "  schema: batch_totals_update is missing" in out
    assert "  schema: created batch_totals_update" in out
    assert "  targets_done (job 'job-a'): 1 -> 3" in out
    assert run(capsys, "check", "--db", store_file)[0] == 0


def test_repair_of_a_missing_store_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "check", "--repair", "--db", tmp_path / "typo.db")
    assert (code, out) == (1, "")
    assert err == f"sift: path: no store at '{tmp_path / 'typo.db'}'; `sift init` creates one\n"
    assert list(tmp_path.iterdir()) == []
