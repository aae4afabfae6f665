"""The files beside a SQLite store cannot be turned against their owner: the writers' lock file is never
opened through a symlink nor given the store's mode unless it is the store owner's own; a -wal, -shm or
-journal file that is a symlink or not a regular file is refused, naming it; the store path is resolved
once, and a dangling symlink is refused, naming it."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from cli_helpers import sift_script
from helpers import make_job, make_targets

from sift import dcache

PRIVATE_KEY = b"-----BEGIN PRIVATE KEY-----\n"


def private_file(path: Path) -> Path:
    """A file of the user running the tests that must stay 0600 and unchanged."""
    path.write_bytes(PRIVATE_KEY)
    path.chmod(0o600)
    return path


def shared_store(folder: Path) -> Path:
    """A closed store in a folder anyone may write, made 0666 (a store shared with others)."""
    folder.mkdir()
    folder.chmod(0o1777)
    store = folder / "store.db"
    dcache.open_db(store)
    dcache.close_db()
    store.chmod(0o666)
    Path(f"{store}-lock").unlink()
    return store


@pytest.mark.parametrize("plant", ["symlink", "hard link"])
def test_the_lock_file_never_gives_the_stores_mode_to_a_planted_file(tmp_path: Path, plant: str) -> None:
    secret = private_file(tmp_path / "victim_private_key")
    store = shared_store(tmp_path / "shared")
    lock = Path(f"{store}-lock")
    if plant == "symlink":
        lock.symlink_to(secret)
    else:
        os.link(secret, lock)
    done = subprocess.run(
        [str(sift_script()), "reconcile", "--reason", "restart", "--db", str(store)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr  # the store still writes
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.read_bytes() == PRIVATE_KEY


@pytest.mark.parametrize("end", ["-wal", "-shm", "-journal"])
def test_a_symlinked_companion_file_is_refused_naming_it(tmp_path: Path, end: str) -> None:
    secret = private_file(tmp_path / "victim_private_key")
    store = shared_store(tmp_path / "shared")
    companion = Path(f"{store}{end}")
    companion.symlink_to(secret)
    with pytest.raises(dcache.StoreUnavailable, match="is a symlink; sift does not follow") as info:
        dcache.open_db(store)
    assert info.value.field == "path" and str(companion) in str(info.value)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.read_bytes() == PRIVATE_KEY


@pytest.mark.parametrize("end", ["-wal", "-shm", "-journal"])
def test_a_companion_that_is_not_a_regular_file_is_refused_naming_it(tmp_path: Path, end: str) -> None:
    store = shared_store(tmp_path / "shared")
    companion = Path(f"{store}{end}")
    companion.mkdir()
    with pytest.raises(dcache.StoreUnavailable, match="is not a regular file") as info:
        dcache.open_db(store)
    assert info.value.field == "path" and str(companion) in str(info.value)
    assert companion.is_dir()


def test_a_dangling_symlink_is_refused_as_a_store_path(tmp_path: Path) -> None:
    link = tmp_path / "sift.db"
    link.symlink_to(tmp_path / "data.db")  # a volume not mounted yet, say
    with pytest.raises(dcache.StoreUnavailable, match=r"is a symlink to .*, which does not exist") as info:
        dcache.open_db(link)
    assert info.value.field == "path" and str(link) in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["sift.db"]  # nothing made, neither the target nor a -lock


def test_a_store_reached_through_a_symlink_has_one_set_of_files(tmp_path: Path) -> None:
    real = tmp_path / "data.db"
    dcache.open_db(real)
    dcache.close_db()
    link = tmp_path / "sift.db"
    link.symlink_to(real)
    dcache.open_db(link)
    try:
        dcache.create_batch_job(make_job("job-1"), make_targets(3))
        with pytest.raises(dcache.InvalidBatchInput, match="is the store itself"):
            dcache.backup_store(tmp_path / "data.db-lock")
    finally:
        dcache.close_db()
    # One writers' queue for the link and the real path: the -lock beside the file, none beside the link.
    assert sorted(os.listdir(tmp_path)) == ["data.db", "data.db-lock", "sift.db"]
