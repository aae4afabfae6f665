"""``sift show JOB_ID``: a job and its targets; ``--result IDX`` prints one target's result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import (
    EXPECTED,
    FROZEN,
    RESULT_A0,
    RESULT_A1,
    RESULT_A2,
    RESULT_E0,
    dump,
    run,
    utf8,
)
from freezegun import freeze_time
from helpers import create_partial, make_job, make_targets

from sift import dcache


def test_job_and_targets(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with freeze_time(FROZEN):
        code, out, err = run(capsys, "show", "job-a", "--db", store_file)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:8] == [
        "Job              job-a",
        "Caller           alice (fleet)",
        "Idempotency key  key-job-a",
        "Status           done",
        "Targets done     3 of 3 (3 stored)",
        "Result bytes     54 B (54 bytes)",
        "Created          2024-12-31 22:00:00 UTC  (2h ago)",
        "Lease            2024-12-31 23:00:00 UTC  (1h ago)",
    ]
    assert lines[8] == ""
    header, *rows = lines[9:]
    assert header.split() == [
        "idx",
        "status",
        "attempts",
        "runner",
        "url",
        "result",
        "bytes",
        "error",
        "hint",
    ]
    sizes = [utf8(RESULT_A0), utf8(RESULT_A1), utf8(RESULT_A2)]
    assert sizes == [16, 22, 16]  # UTF-8 bytes, not characters
    assert [row.split() for row in rows] == [
        [str(idx), "done", "0", f"https://example.com/{idx}", str(size)] for idx, size in enumerate(sizes)
    ]
    end = header.index("result bytes") + len("result bytes")
    assert all(row[:end].endswith(str(size)) for row, size in zip(rows, sizes, strict=True))


def test_errors_hints_and_the_job_error(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "job-c", "--db", store_file)
    assert code == 0
    lines = out.splitlines()
    assert "Status           failed: every target failed" in lines
    assert "Result bytes     0 B (0 bytes)" in lines
    header, row0, row1 = lines[9:]
    assert row0[header.index("error") :].split("  ")[0] == "timeout after 10 s"
    assert row0[header.index("hint") :] == "retry later"
    assert row1[header.index("error") :].rstrip() == "line one\\nline two"  # one line per target
    assert row0[header.index("result bytes") : header.index("error")].strip() == ""


def test_pending_targets_and_no_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.db"
    dcache.open_db(path)
    create_partial(make_job("j", targets_total=4), make_targets(2))
    dcache.create_batch_job(make_job("empty", targets_total=0))
    dcache.close_db()
    code, out, _ = run(capsys, "show", "j", "--db", path)
    assert code == 0
    assert "Idempotency key  -" in out.splitlines()
    assert "Targets done     0 of 4 (2 stored)" in out.splitlines()
    assert [line.split() for line in out.splitlines()[10:]] == [
        ["0", "pending", "0", "https://example.com/0"],
        ["1", "pending", "0", "https://example.com/1"],
    ]
    code, out, _ = run(capsys, "show", "empty", "--db", path)
    assert code == 0
    assert out.splitlines()[-1].startswith("Lease")  # no target table at all


def test_json(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "job-e", "--db", store_file, "--json")
    assert code == 0
    report = json.loads(out)
    stored_job = next(row for row in dump(store_file)["batch_job"] if row[0] == "job-e")
    assert tuple(report["job"].values()) == stored_job
    assert report["job"]["nbytes"] == EXPECTED["job-e"].nbytes
    assert report["targets"] == [
        {
            "idx": 0,
            "status": "done",
            "url": "https://example.com/0",
            "options": '{"render":false}',
            "result_bytes": utf8(RESULT_E0),
            "error": None,
            "hint": None,
            "attempts": 0,
            "runner": None,
        },
        {
            "idx": 1,
            "status": "failed",
            "url": "https://example.com/1",
            "options": '{"render":false}',
            "result_bytes": None,
            "error": "HTTP 503",
            "hint": None,
            "attempts": 0,
            "runner": None,
        },
    ]


@pytest.mark.parametrize(("idx", "result"), [(0, RESULT_A0), (1, RESULT_A1), (2, RESULT_A2)])
def test_result(store_file: Path, capsys: pytest.CaptureFixture[str], idx: int, result: str) -> None:
    code, out, err = run(capsys, "show", "job-a", "--result", str(idx), "--db", store_file)
    assert (code, err) == (0, "")
    assert out == result + "\n"
    code, out, _ = run(capsys, "show", "job-a", "--result", str(idx), "--db", store_file, "--json")
    assert code == 0
    assert json.loads(out) == {"job_id": "job-a", "idx": idx, "status": "done", "result": result}


def test_result_of_a_target_without_one(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "show", "job-c", "--result", "0", "--db", store_file)
    assert (code, out) == (1, "")
    assert err == "sift: --result: target 0 of job 'job-c' has no result (status failed)\n"
    code, out, _ = run(capsys, "show", "job-c", "--result", "0", "--db", store_file, "--json")
    assert code == 0
    assert json.loads(out)["result"] is None


def test_result_of_an_unknown_target(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "show", "job-a", "--result", "3", "--db", store_file)
    assert (code, out) == (1, "")
    assert err == "sift: --result: job 'job-a' has no target 3\n"


def test_unknown_job(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "show", "job-x", "--db", store_file)
    assert (code, out) == (1, "")
    assert err == f"sift: job_id: no job 'job-x' in {store_file}\n"


def test_show_writes_nothing(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = dump(store_file)
    for argv in (["show", "job-a"], ["show", "job-b", "--json"], ["show", "job-a", "--result", "1"]):
        assert run(capsys, *argv, "--db", store_file)[0] == 0
    assert dump(store_file) == before  # the lease stays: an operator's look does not keep a job alive
