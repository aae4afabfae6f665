"""The read commands (stats, jobs, show, and the dry runs of sweep and evict) open the store read-only: they
work on a file the user may not write, and never write to the file they read.

The commands run as a process that really cannot write there: as a normal user, file modes stop it; as
root, which ignores file modes, the process runs without the capabilities that let it (``setpriv``), and
``test_the_setup_cannot_write`` proves that it cannot.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cli_helpers import populate, sift_script

from sift import dcache

if os.geteuid() == 0:
    if shutil.which("setpriv") is None:  # pragma: no cover - depends on the machine
        pytest.skip("root ignores file modes, and setpriv is not there to drop that", allow_module_level=True)
    UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
else:
    UNPRIVILEGED = []

READ_COMMANDS = {
    "stats": (["stats"], "Live jobs     2"),
    "jobs": (["jobs"], "job-d  carol"),
    "show": (["show", "job-a"], "Job              job-a"),
    "show --result": (["show", "job-a", "--result", "0"], '{"body":"café"}'),
    "sweep --dry-run": (["sweep", "--ttl", "1h", "--dry-run"], "dry run: would sweep 5 jobs"),
    "evict --dry-run": (["evict", "--max-bytes", "0", "--dry-run"], "dry run: would evict 2 jobs"),
}


def sift(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*UNPRIVILEGED, str(sift_script()), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def state(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


@pytest.fixture
def read_only_file(tmp_path: Path) -> Iterator[Path]:
    """A store (checkpointed, no -wal file) whose file is chmod 444, in a directory that stays writable."""
    path = tmp_path / "store.db"
    populate(path)
    path.chmod(0o444)
    yield path
    path.chmod(0o644)


@pytest.fixture
def read_only_directory(read_only_file: Path) -> Iterator[Path]:
    """The same, in a directory that is chmod 555: not even SQLite's -wal and -shm files can be made."""
    read_only_file.parent.chmod(0o555)
    yield read_only_file
    read_only_file.parent.chmod(0o755)


def test_the_setup_cannot_write(read_only_directory: Path) -> None:
    script = (
        "import sys\n"
        "for path, mode in ((sys.argv[1], 'r+b'), (sys.argv[1] + '-new', 'wb')):\n"
        "    try:\n"
        "        open(path, mode).close()\n"
        "    except PermissionError:\n"
        "        print('denied')\n"
    )
    proc = subprocess.run(
        [*UNPRIVILEGED, "python3", "-c", script, str(read_only_directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout) == (0, "denied\ndenied\n")


def reads_and_changes_nothing(path: Path, command: tuple[list[str], str]) -> None:
    """``command`` (its arguments, and what its output holds) run on the store at ``path`` succeeds, says
    what it should, and leaves the store as it was."""
    argv, expected = command
    before = state(path)
    proc = sift([*argv, "--db", str(path)], path.parent)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert expected in proc.stdout
    assert state(path) == before


@pytest.mark.parametrize("command", READ_COMMANDS.values(), ids=list(READ_COMMANDS))
def test_read_commands_on_a_read_only_file(read_only_file: Path, command: tuple[list[str], str]) -> None:
    reads_and_changes_nothing(read_only_file, command)
    wal = Path(f"{read_only_file}-wal")
    assert not wal.exists() or wal.read_bytes() == b""  # at most SQLite's empty -wal file for readers


@pytest.mark.parametrize("command", READ_COMMANDS.values(), ids=list(READ_COMMANDS))
def test_read_commands_in_a_read_only_directory_say_why_they_cannot(
    read_only_directory: Path, command: tuple[list[str], str]
) -> None:
    """SQLite reads a WAL store only with a -shm file beside it. In a directory only others may write,
    one of them may write the store while we read it, so reading the file as it stands (SQLite's
    "immutable") could meet torn pages: refused, with the reason, and nothing changed."""
    argv, _ = command
    before = state(read_only_directory)
    proc = sift([*argv, "--db", str(read_only_directory)], read_only_directory.parent)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        f"sift: path: '{read_only_directory}' is a WAL store in a directory this process cannot write, "
        "where SQLite cannot make the -shm file it needs to read it; read it as a user who can write "
        "there, or copy it\n"
    )
    assert state(read_only_directory) == before
    # Only the store, and the lock file of its writers' queue: the read made no -wal or -shm
    assert sorted(os.listdir(read_only_directory.parent)) == ["store.db", "store.db-lock"]


@contextmanager
def tmpfs(mount: Path) -> Iterator[Path]:
    """A small tmpfs mounted on ``mount`` (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a file system read-only needs root")
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def remount_read_only(mount: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)


@pytest.fixture
def read_only_file_system(tmp_path: Path) -> Iterator[Path]:
    """A store (checkpointed, no -wal or -shm file) on a tmpfs remounted read-only: nobody can write it."""
    with tmpfs(tmp_path / "ro") as mount:
        path = mount / "store.db"
        populate(path)
        remount_read_only(mount)
        yield path


@pytest.mark.parametrize("command", READ_COMMANDS.values(), ids=list(READ_COMMANDS))
def test_read_commands_on_a_read_only_file_system(
    read_only_file_system: Path, command: tuple[list[str], str]
) -> None:
    """Nobody can write there, so the file is read as it stands."""
    reads_and_changes_nothing(read_only_file_system, command)
    # Only the store, and the lock file of its writers' queue: the read made no -wal or -shm
    assert sorted(os.listdir(read_only_file_system.parent)) == ["store.db", "store.db-lock"]


def test_a_write_command_on_a_read_only_file_is_one_line(read_only_file: Path) -> None:
    before = state(read_only_file)
    proc = sift(["reconcile", "--reason", "x", "--db", str(read_only_file)], read_only_file.parent)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith("sift: ") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr
    assert state(read_only_file) == before


@pytest.mark.slow
def test_read_commands_see_the_wal_and_never_write_to_it(tmp_path: Path) -> None:
    """Jobs another process committed to the -wal file (its connection still open) are read, and neither
    file changes."""
    path = tmp_path / "store.db"
    populate(path)
    dcache.open_db(path)
    try:
        dcache.mark_in_flight_failed("from another process", now=1)
        wal = Path(f"{path}-wal")
        before = (state(path), wal.read_bytes())
        assert before[1] != b""
        for argv, _ in READ_COMMANDS.values():
            proc = sift([*argv, "--db", str(path)], tmp_path)
            assert (proc.returncode, proc.stderr) == (0, ""), argv
        stats = sift(["stats", "--db", str(path)], tmp_path).stdout
        assert "Live jobs     0" in stats
        assert (state(path), wal.read_bytes()) == before
    finally:
        dcache.close_db()


def test_a_read_only_file_system_with_writes_in_the_wal_is_refused(tmp_path: Path) -> None:
    """Reading the -wal file needs a -shm file beside it, which that file system cannot hold: refused, not
    read as the stale file alone."""
    with tmpfs(tmp_path / "ro") as mount:
        path = mount / "store.db"
        populate(path)
        dcache.open_db(path)
        dcache.db.execute_sql("PRAGMA wal_autocheckpoint = 0")
        dcache.touch_batch_job("job-a", now=99)  # committed to the -wal only
        wal = Path(f"{path}-wal").read_bytes()
        dcache.close_db()  # the last connection checkpoints and removes the -wal: put the copy back
        Path(f"{path}-wal").write_bytes(wal)
        Path(f"{path}-shm").unlink(missing_ok=True)
        remount_read_only(mount)
        before = state(path)
        proc = sift(["stats", "--db", str(path)], tmp_path)
        assert proc.returncode == 1
        assert "has writes in its -wal file, and its read-only file system cannot hold" in proc.stderr
        assert state(path) == before
