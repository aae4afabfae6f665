"""Errors: one clear line on standard error and exit 1 for what the user caused, argparse's usage errors
with exit 2, and never a traceback."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
from cli_helpers import run, sift_script
from helpers import make_job

from sift import dcache
from sift.cli import store

GARBAGE = b"this is not a database, just some text that happens to be long enough " * 20


def one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("sift: ")
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "nope"], "sift: job_id: no job 'nope' in {db}\n"),
        (["show", "job-a", "--result", "9"], "sift: --result: job 'job-a' has no target 9\n"),
        (
            ["sweep", "--ttl", "10x"],
            "sift: --ttl: '10x' is not a duration (use e.g. 90s, 10m, 24h, 7d, or plain seconds)\n",
        ),
        (["sweep", "--ttl=-1h", "--dry-run"], "sift: --ttl: ttl must not be negative, got '-1h'\n"),
        (["sweep", "--ttl", "-1h", "--dry-run"], "sift: --ttl: ttl must not be negative, got '-1h'\n"),
        (["sweep", "--ttl", "-1h"], "sift: --ttl: ttl must not be negative, got '-1h'\n"),
        (["sweep", "--ttl", "-.5h"], "sift: --ttl: ttl must not be negative, got '-.5h'\n"),
        (["sweep", "--ttl", "-1x"], "sift: --ttl: '-1x' is not a duration"),
        (["evict", "--max-bytes", "-5"], "sift: --max-bytes: max-bytes must not be negative, got '-5'\n"),
        (
            ["evict", "--max-bytes", "-1MiB"],
            "sift: --max-bytes: max-bytes must not be negative, got '-1MiB'\n",
        ),
        (["simulate", "--budget", "-2MiB"], "sift: --budget: budget must not be negative, got '-2MiB'\n"),
        (["simulate", "--ttl", "-10m"], "sift: --ttl: ttl must not be negative, got '-10m'\n"),
        (["evict", "--max-bytes", "lots"], "sift: --max-bytes: 'lots' is not a size"),
        (["evict", "--max-bytes", "1.5"], "sift: --max-bytes: '1.5' is not a whole number of bytes\n"),
        (["simulate", "--budget", "1XB"], "sift: --budget: '1XB' is not a size"),
        (["simulate", "--ttl", "soon"], "sift: --ttl: 'soon' is not a duration"),
        (["jobs", "--caller", "\udcff"], "sift: --caller: is not valid UTF-8 text\n"),
        (["reconcile", "--reason", "bad \udcff"], "sift: --reason: is not valid UTF-8 text\n"),
        (["show", "\udcff"], "sift: JOB_ID: is not valid UTF-8 text\n"),
    ],
)
def test_user_errors_exit_1(
    store_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    before = store_file.read_bytes()
    code, out, err = run(capsys, *argv, "--db", store_file)
    assert (code, out) == (1, "")
    assert one_line(err).startswith(message.format(db=store_file).rstrip("\n"))
    if message.endswith("\n"):
        assert err == message.format(db=store_file)
    assert store_file.read_bytes() == before


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--ttl", "10x"],
        ["evict", "--max-bytes", "x"],
        ["simulate", "--ttl", "x"],
        ["jobs", "--caller", "\udcff"],
    ],
)
def test_a_bad_value_does_not_create_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    path = tmp_path / "new.db"
    assert run(capsys, *argv, "--db", path)[0] == 1
    assert not path.exists()


def test_not_a_sqlite_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(GARBAGE)
    for command in (["stats"], ["jobs"], ["show", "x"], ["sweep", "--ttl", "1h"], ["shell"], ["simulate"]):
        code, out, err = run(capsys, *command, "--db", path)
        assert (code, out) == (1, "")
        assert one_line(err).startswith(f"sift: path: cannot open '{path}' as a batch store: ")
        assert "not a database" in err
    assert path.read_bytes() == GARBAGE


def test_a_sqlite_file_of_another_program(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "other.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE batch_job (something_else TEXT)")
    before = path.read_bytes()
    code, out, err = run(capsys, "stats", "--db", path)  # read-only: the package's message, nothing written
    assert (code, out) == (1, "")
    assert one_line(err).startswith(f"sift: path: '{path}' lacks ")
    assert path.read_bytes() == before
    code, out, err = run(capsys, "reconcile", "--reason", "x", "--db", path)
    assert (code, out) == (1, "")
    assert one_line(err).startswith(f"sift: path: cannot open '{path}' as a batch store: ")


def test_a_store_whose_target_table_another_program_made(
    store_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with closing(sqlite3.connect(store_file)) as conn, conn:
        conn.execute("DROP TABLE batch_target")
        conn.execute("CREATE TABLE batch_target (something_else TEXT)")
    code, out, err = run(capsys, "show", "job-a", "--db", store_file)
    assert (code, out) == (1, "")
    assert one_line(err) == (
        f"sift: path: cannot open '{store_file}' as a batch store: "
        "table batch_target lacks the column(s) job_id, idx, url, options, status, result, error, hint\n"
    )


@pytest.mark.parametrize("where", ["missing-directory", "directory"])
@pytest.mark.parametrize("command", [["reconcile", "--reason", "x"], ["shell"]])
def test_a_path_that_cannot_be_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, command: list[str]
) -> None:
    path = tmp_path / "no" / "such" / "dir.db" if where == "missing-directory" else tmp_path
    code, out, err = run(capsys, *command, "--db", path)
    assert (code, out) == (1, "")
    if where == "directory":
        assert one_line(err) == f"sift: path: '{path}' is a directory, not a store file\n"
    else:
        assert one_line(err) == f"sift: path: the directory '{path.parent}' of '{path}' does not exist\n"


def test_a_read_command_under_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "no" / "such" / "dir.db"
    message = f"sift: path: the directory '{path.parent}' of '{path}' does not exist\n"
    assert run(capsys, "stats", "--db", path) == (1, "", message)
    assert list(tmp_path.iterdir()) == []


def test_a_file_locked_past_the_timeout(
    store_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "OPEN_TIMEOUT_S", 0.2)
    with closing(sqlite3.connect(store_file, isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")  # another process's write transaction that does not end
        assert run(capsys, "stats", "--db", store_file)[0] == 0  # opening a complete store only reads
        for command in (["reconcile", "--reason", "x"], ["sweep", "--ttl", "0"]):
            code, out, err = run(capsys, *command, "--db", store_file)
            assert (code, out) == (1, "")
            assert one_line(err) == "sift: database: locked by another process for over 0.2 s\n"
        holder.execute("ROLLBACK")
    assert run(capsys, "stats", "--db", store_file)[0] == 0


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nosuch"],
        ["stats", "--bogus"],
        ["jobs", "--limit", "x"],
        ["jobs", "--limit", "-1"],
        ["jobs", "--status", "bogus"],
        ["show"],
        ["show", "a", "--result", "-1"],
        ["show", "a", "--result", "x"],
        ["show", "a", "--result", "9223372036854775808"],
        ["jobs", "--limit", "99999999999999999999"],
        ["sweep"],
        ["sweep", "--ttl", "--dry-run"],
        ["evict", "--dry-run"],
        ["reconcile"],
        ["simulate", "--workers", "0"],
        ["simulate", "--jobs", "many"],
        ["simulate", "--seed", "1.5"],
        ["shell", "--json"],
        ["stats", "--db"],
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith("usage: sift")
    assert err.splitlines()[-1].startswith("sift") and ": error: " in err.splitlines()[-1]
    assert "Traceback" not in err
    assert not (tmp_path / "sift.db").exists()


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0 and out.startswith("usage: sift")
    for command in ("stats", "jobs", "show", "sweep", "evict", "reconcile", "simulate", "shell"):
        assert command in out
    code, out, _ = run(capsys, "--version")
    assert (code, out) == (0, f"sift {__import__('sift').__version__}\n")
    code, out, _ = run(capsys, "simulate", "--help")
    assert code == 0
    for option in ("--jobs", "--targets", "--workers", "--budget", "--ttl", "--seed", "--db", "--json"):
        assert option in out


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["show", "nope"], 1),
        (["sweep", "--ttl", "10x"], 1),
        (["stats", "--db", "GARBAGE"], 1),
        (["jobs", "--limit", "x"], 2),
        (["frobnicate"], 2),
    ],
)
def test_through_the_console_script(tmp_path: Path, argv: list[str], status: int) -> None:
    garbage = tmp_path / "garbage"
    garbage.write_bytes(GARBAGE)
    argv = [str(garbage) if arg == "GARBAGE" else arg for arg in argv]
    proc = subprocess.run(
        [str(sift_script()), *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == status
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    if status == 1:
        one_line(proc.stderr)


def test_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    path = tmp_path / "many.db"
    dcache.open_db(path)
    with dcache.db.atomic():  # one transaction: quick to set up
        for n in range(2000):  # far more output than a pipe holds
            dcache.create_batch_job(make_job(f"job-{n:05d}", created_at=n, lease=n))
    dcache.close_db()
    proc = subprocess.Popen(
        [str(sift_script()), "jobs", "--limit", "0", "--db", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().split()[0] == b"id"
    proc.stdout.close()  # like `sift jobs | head -1`
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""
    proc.stderr.close()


#: Starts a command with Ctrl-C's default meaning, as a terminal does: a test run started in the background
#: by a shell without job control (``pytest &``) ignores SIGINT, and a child inherits that.
WITH_DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]


def test_interrupt_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "sim.db"
    proc = subprocess.Popen(
        [*WITH_DEFAULT_SIGINT, str(sift_script()), "simulate", "--jobs", "100000", "--db", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:  # wait until the store is open
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # a failed run leaves no simulation of 100,000 jobs behind
        proc.wait()
    assert proc.returncode == 130
    assert err == "sift: interrupted\n"
    assert out == ""
