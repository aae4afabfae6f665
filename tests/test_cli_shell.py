"""``sift shell``: a Python console with the store open and the models, functions and ``db`` in scope,
fed commands on standard input."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest
from cli_helpers import EXPECTED, dump, populate, run, sift_script

from sift import dcache


@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    path = tmp_path / "store.db"
    populate(path)
    return path


def shell(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, path: Path, script: str
) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(script))
    return run(capsys, "shell", "--db", path)


def test_models_functions_and_db_in_scope(
    store_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = "\n".join(
        [
            "print(BatchJob.select().count())",
            "print(BatchJob.select().where(BatchJob.status == JobStatus.DONE).get().id)",
            "print(batch_nbytes())",
            "print([t.idx for t in batch_targets('job-a')])",
            "print(db.execute_sql('SELECT COUNT(*) FROM batch_target').fetchone()[0])",
            "print(sorted(set(dcache.__all__) - set(globals())))",
            "print(db is dcache.db, db.is_closed())",
        ]
    )
    code, out, err = shell(capsys, monkeypatch, store_file, script + "\n")
    assert code == 0
    assert out.splitlines() == [
        "5",
        "job-a",
        str(sum(e.nbytes for e in EXPECTED.values())),
        "[0, 1, 2]",
        "10",
        "[]",
        "True False",
    ]
    banner = " ".join(err.split())
    assert banner.startswith(f"sift shell on {store_file}: 5 jobs, 582 bytes of results. In scope: db")
    for name in ("BatchJob", "BatchTarget", "JobStatus", "update_batch_target", "sweep_batch", "dcache"):
        assert name in banner
    assert "\n\n" not in err.strip()  # one paragraph


def test_writes_from_the_shell_reach_the_file(
    store_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = shell(
        capsys, monkeypatch, store_file, "print(mark_in_flight_failed('from the shell', now=7))\n"
    )
    assert (code, out) == (0, "2\n")
    statuses = {row[0]: (row[4], row[5], row[9]) for row in dump(store_file)["batch_job"]}
    assert statuses["job-b"] == statuses["job-d"] == ("failed", "from the shell", 7)


def test_an_error_in_the_shell_does_not_end_it(
    store_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = "batch_job(1)\ntry:\n    touch_batch_job('nope')\nexcept JobNotFound as e:\n    print(e)\n\n"
    script += "print('still here')\n"
    code, out, err = shell(capsys, monkeypatch, store_file, script)
    assert code == 0
    assert out.splitlines() == ["job_id: no job 'nope'", "still here"]
    assert "InvalidBatchInput: job_id: must be a str, got int" in err


@pytest.mark.parametrize(("line", "status"), [("exit()", 0), ("exit(3)", 3), ("raise SystemExit", 0)])
def test_exit_status(
    store_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    line: str,
    status: int,
) -> None:
    code, out, _ = shell(capsys, monkeypatch, store_file, f"print(1)\n{line}\nprint(2)\n")
    assert (code, out) == (status, "1\n")


def test_the_console_script_with_piped_input(store_file: Path) -> None:
    proc = subprocess.run(
        [str(sift_script()), "shell", "--db", str(store_file)],
        input="print(live_batch_jobs_total(), live_batch_jobs('bob'))\nprint(batch_job('job-c').error)\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == ["2 1", "every target failed"]
    assert proc.stderr.startswith("sift shell on ")
    assert "Traceback" not in proc.stderr


def test_the_shell_closes_the_store(
    store_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shell(capsys, monkeypatch, store_file, "print(db.is_closed())\n")[1] == "False\n"
    assert dcache.db.is_closed()
