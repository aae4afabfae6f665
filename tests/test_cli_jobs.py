"""``sift jobs``: one line per job, newest first, filtered by caller and status, limited."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import EXPECTED, FROZEN, NEWEST_FIRST, dump, run, store_of_25_jobs
from freezegun import freeze_time
from helpers import make_job

from sift import dcache
from sift.cli.rows import JOB_FIELDS


def listed(out: str) -> list[str]:
    """The job ids of a human listing, in order."""
    return [line.split()[0] for line in out.splitlines()[1:] if not line.startswith("(")]


def test_lines_newest_first(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with freeze_time(FROZEN):
        code, out, err = run(capsys, "jobs", "--db", store_file)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == [
        "id",
        "caller",
        "class",
        "status",
        "done/total",
        "bytes",
        "created",
        "lease",
        "age",
    ]
    assert listed(out) == NEWEST_FIRST
    assert len(lines) == 1 + len(EXPECTED)
    row = next(line for line in lines if line.startswith("job-a "))
    assert EXPECTED["job-a"].nbytes == 54
    assert row.split() == [
        "job-a",
        "alice",
        "fleet",
        "done",
        "3/3",
        "54",
        "B",
        *["2024-12-31", "22:00:00", "UTC", "1h", "ago"],
    ]
    row = next(line for line in lines if line.startswith("job-b "))
    assert row.split() == [
        *("job-b", "bob", "restricted", "running", "1/2", "17", "B"),
        *["2024-12-31", "23:50:00", "UTC", "1m", "ago"],
    ]


def test_columns_are_aligned(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with freeze_time(FROZEN):
        _, out, _ = run(capsys, "jobs", "--db", store_file)
    header, *rows = out.splitlines()
    status_at = header.index("status")
    created_at = header.index("created")
    for row, job_id in zip(rows, NEWEST_FIRST, strict=True):
        assert row[status_at:].startswith(EXPECTED[job_id].status)
        assert row[created_at:].startswith("202")
        # right-aligned columns end where their header ends
        done = f"{EXPECTED[job_id].done}/{EXPECTED[job_id].total}"
        end = header.index("done/total") + len("done/total")
        assert row[end - len(done) : end] == done


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--caller", "alice"], ["job-a", "job-c"]),
        (["--caller", "bob"], ["job-b", "job-e"]),
        (["--status", "running"], ["job-b"]),
        (["--status", "cancelled"], []),
        (["--caller", "bob", "--status", "partial"], ["job-e"]),
        (["--caller", "nobody"], []),
        (["--limit", "2"], ["job-d", "job-b"]),
        (["--limit", "0"], NEWEST_FIRST),
        (["--limit", "5"], NEWEST_FIRST),
        (["--caller", "alice", "--limit", "1"], ["job-a"]),
    ],
)
def test_filters_and_limit(
    store_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: list[str]
) -> None:
    code, out, _ = run(capsys, "jobs", "--db", store_file, *argv)
    assert code == 0
    assert (listed(out) if expected else []) == expected
    if not expected:
        assert out == "no jobs\n"
    code, out, _ = run(capsys, "jobs", "--db", store_file, "--json", *argv)
    assert code == 0
    assert [job["id"] for job in json.loads(out)] == expected


def test_footer_when_limited(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "jobs", "--db", store_file, "--limit", "2")
    assert out.splitlines()[-1] == "(2 of 5 jobs, newest first; --limit 0 shows all)"
    _, out, _ = run(capsys, "jobs", "--db", store_file, "--limit", "0")
    assert "of 5 jobs" not in out


def test_default_limit_is_20(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = store_of_25_jobs(tmp_path, first_at=1000)
    _, out, _ = run(capsys, "jobs", "--db", path)
    assert listed(out) == [f"job-{n:02d}" for n in range(24, 4, -1)]
    assert out.splitlines()[-1] == "(20 of 25 jobs, newest first; --limit 0 shows all)"


def test_ties_in_created_at_go_to_the_later_insert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ties.db"
    dcache.open_db(path)
    for job_id in ("m", "z", "a"):
        dcache.create_batch_job(make_job(job_id, created_at=5000, lease=5000))
    dcache.close_db()
    _, out, _ = run(capsys, "jobs", "--db", path, "--json")
    assert [job["id"] for job in json.loads(out)] == ["a", "z", "m"]


def test_json_rows_are_the_stored_jobs(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "jobs", "--db", store_file, "--json")
    assert code == 0
    rows = json.loads(out)
    assert all(list(row) == list(JOB_FIELDS) for row in rows)
    stored = {row[0]: row for row in dump(store_file)["batch_job"]}
    for row in rows:
        assert tuple(row.values()) == stored[row["id"]]
        e = EXPECTED[row["id"]]
        assert (row["status"], row["nbytes"], row["lease"], row["created_at"]) == (
            e.status,
            e.nbytes,
            e.lease,
            e.created_at,
        )


def test_jobs_writes_nothing(store_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = dump(store_file)
    assert run(capsys, "jobs", "--db", store_file, "--limit", "0")[0] == 0
    assert dump(store_file) == before
