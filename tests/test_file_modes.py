"""Private by default: a store file sift creates, and its -wal and -shm, are 0600 whatever the umask;
an existing file keeps its mode. The writers' lock file (``-lock``) has the
store file's mode too."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import make_job, make_targets

from sift import dcache
from sift.cli import main


@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def modes(path: Path) -> dict[str, int]:
    """The permission bits of the store file and of its -wal, -shm and -lock files."""
    return {
        suffix or "store": stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode)
        for suffix in ("", "-wal", "-shm", "-lock")
    }


def write_some(path: Path) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    assert os.path.exists(f"{path}-wal") and os.path.exists(f"{path}-shm")


# 0o277 takes the owner's own bits: it must not lock the owner out.
@pytest.mark.parametrize("umask", [0o022, 0o000, 0o002, 0o277], indirect=True, ids=oct)
def test_new_store_and_its_wal_shm_and_lock_files_are_private(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "new.db"
    dcache.open_db(path)
    try:
        write_some(path)
        assert modes(path) == {"store": 0o600, "-wal": 0o600, "-shm": 0o600, "-lock": 0o600}
    finally:
        dcache.close_db()


@pytest.mark.parametrize("umask", [0o022, 0o000], indirect=True, ids=oct)
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o666], ids=oct)
def test_an_existing_store_keeps_its_mode(tmp_path: Path, umask: int, mode: int) -> None:
    path = tmp_path / "shared.db"
    dcache.open_db(path)
    dcache.close_db()
    for leftover in (f"{path}-wal", f"{path}-shm"):
        if os.path.exists(leftover):
            os.unlink(leftover)
    os.chmod(path, mode)  # the -lock file made at the first open stays, with 0600
    dcache.open_db(path)
    try:
        write_some(path)
        # SQLite copies the file's mode to the -wal and -shm files; the queue makes the -lock follow it
        assert modes(path) == {"store": mode, "-wal": mode, "-shm": mode, "-lock": mode}
    finally:
        dcache.close_db()


@pytest.mark.parametrize("umask", [0o022], indirect=True, ids=oct)
def test_an_existing_empty_file_keeps_its_mode(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "empty.db"
    path.touch(mode=0o644)
    os.chmod(path, 0o644)
    dcache.open_db(path)
    try:
        write_some(path)
        assert modes(path)["store"] == 0o644
    finally:
        dcache.close_db()


@pytest.mark.parametrize("umask", [0o022], indirect=True, ids=oct)
def test_the_cli_creates_a_private_store(
    tmp_path: Path, umask: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cli.db"
    assert main(["--db", str(path), "init"]) == 0  # the command that creates a store
    capsys.readouterr()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
