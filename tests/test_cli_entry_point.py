"""The installed ``sift`` console script and ``python -m sift`` work, so a broken entry point fails CI;
importing ``sift.dcache`` still imports nothing of the command line (tqdm included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import populate, sift_script

import sift
from sift import dcache

COMMANDS = {
    "console script": [str(sift_script())],
    "python -m sift": [sys.executable, "-m", "sift"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS.values(), ids=list(COMMANDS))
def test_entry_point_runs_commands(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "store.db"
    populate(path)
    proc = subprocess.run(
        [*command, "stats", "--db", str(path), "--json"], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert sum(json.loads(proc.stdout)["jobs"].values()) == 5
    proc = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, f"sift {sift.__version__}\n")
    raw = subprocess.run(
        [*command, "show", "job-a", "--result", "0", "--db", str(path)], capture_output=True, timeout=60
    )
    assert raw.returncode == 0 and raw.stdout == '{"body":"café"}\n'.encode()


@pytest.mark.parametrize("command", COMMANDS.values(), ids=list(COMMANDS))
def test_entry_point_uses_sift_db_and_the_working_directory(tmp_path: Path, command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SIFT_DB"}
    proc = subprocess.run(
        [*command, "jobs"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1,
        "",
        "sift: path: no store at 'sift.db'; `sift init` creates one\n",
    )
    assert list(tmp_path.iterdir()) == []  # a read command creates nothing
    dcache.open_db(tmp_path / "sift.db")
    dcache.close_db()
    proc = subprocess.run(
        [*command, "jobs"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout) == (0, "no jobs\n")
    populate(tmp_path / "elsewhere.db")
    env["SIFT_DB"] = str(tmp_path / "elsewhere.db")
    proc = subprocess.run(
        [*command, "jobs", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and len(json.loads(proc.stdout)) == 5


def test_console_script_exit_status_and_usage() -> None:
    proc = subprocess.run([str(sift_script())], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: sift")


def test_importing_the_store_imports_no_command_line() -> None:
    code = (
        "import sys, sift.dcache\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tqdm', 'sift')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = eval(proc.stdout)
    assert "tqdm" not in loaded and "sift.cli" not in loaded
    assert all(name == "sift" or name.startswith("sift.dcache") for name in loaded)
