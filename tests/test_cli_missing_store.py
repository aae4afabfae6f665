"""A command that only reads (stats, jobs, show, and the dry runs of sweep and evict) never creates a store:
on a path where there is none it says so in one line, exits 1, and leaves nothing behind (no file, no
-wal or -shm). (The commands that write refuse it too: see test_cli_no_accidental_store.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cli_helpers import run, sift_script

READ_COMMANDS = [
    ["stats"],
    ["stats", "--json"],
    ["jobs"],
    ["show", "job-a"],
    ["show", "job-a", "--result", "0"],
    ["sweep", "--ttl", "1h", "--dry-run"],
    ["evict", "--max-bytes", "1MiB", "--dry-run"],
]


@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("named_by", ["--db", "$SIFT_DB", "default"])
def test_no_store_no_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    named_by: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SIFT_DB", raising=False)
    argv = list(command)
    if named_by == "--db":
        argv += ["--db", "typo.db"]
    elif named_by == "$SIFT_DB":
        monkeypatch.setenv("SIFT_DB", "typo.db")
    expected = "sift.db" if named_by == "default" else "typo.db"
    assert run(capsys, *argv) == (1, "", f"sift: path: no store at '{expected}'; `sift init` creates one\n")
    assert os.listdir(tmp_path) == []


def test_through_the_console_script(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(sift_script()), "stats", "--db", "typo.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1,
        "",
        "sift: path: no store at 'typo.db'; `sift init` creates one\n",
    )
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["stats", "jobs", "show"])
def test_help_says_the_store_must_exist(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, _ = run(capsys, command, "--help")
    assert code == 0 and "it must exist, and is only read" in " ".join(out.split())
