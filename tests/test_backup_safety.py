"""A backup never destroys the store nor anything that is not a backup: DEST may not be the store or a file
beside it however it is reached (symlinks, hard links), may not be anything but a regular file, and what
an earlier store at DEST left beside it is removed, so the next open reads exactly the copy."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import run, sift_script
from helpers import make_job, make_targets, snapshot
from space_helpers import check_problems, fill

from sift import dcache

#: A process that commits 50 jobs to a store, says so, and waits to be killed: its jobs are in the -wal.
APP = """
import sys
from sift import dcache
from sift.dcache import BatchJob, BatchTarget
dcache.open_db(sys.argv[1])
for i in range(int(sys.argv[2])):
    dcache.create_batch_job(
        BatchJob(id=f"{sys.argv[3]}-{i}", caller=sys.argv[3], caller_class="fleet", idem_key="",
                 status="queued", targets_total=2, created_at=1, lease=1),
        [BatchTarget(idx=k, url="https://x/", options="{}") for k in range(2)],
    )
print("committed", flush=True)
sys.stdin.readline()
"""


def start_app(store: Path | str, jobs: int, caller: str) -> subprocess.Popen[str]:
    app = subprocess.Popen(
        [sys.executable, "-c", APP, str(store), str(jobs), caller],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert app.stdout is not None and app.stdout.readline() == "committed\n"
    return app


def kill(app: subprocess.Popen[str]) -> None:
    os.kill(app.pid, signal.SIGKILL)
    app.wait(timeout=30)


def fingerprint(path: Path) -> tuple[int, int, int, str] | None:
    """What a file is (inode, kind and mode, size, content hash of a regular file), not following a link."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else ""
    return info.st_ino, info.st_mode, info.st_size, digest


def folder_state(folder: Path) -> dict[str, tuple[int, int, int, str] | None]:
    return {name: fingerprint(folder / name) for name in sorted(os.listdir(folder))}


def callers(path: Path) -> list[tuple[str, int]]:
    """Jobs per caller in the SQLite file at ``path``, read with plain sqlite3 (as the next open reads)."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT caller, COUNT(*) FROM batch_job GROUP BY caller ORDER BY caller"
        ).fetchall()
    finally:
        conn.close()


# -- The store itself, however reached -------------------------------------------------------------------


def test_the_live_wal_reached_through_a_symlinked_directory_is_never_replaced(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    store = real / "s.db"
    app = start_app(store, 50, "app")
    try:
        wal = fingerprint(real / "s.db-wal")
        assert wal is not None and wal[2] > 0  # the 50 jobs are in the -wal, not yet in the file
        done = subprocess.run(
            [str(sift_script()), "backup", str(link / "s.db-wal"), "--db", str(store)],
            capture_output=True,
            text=True,
        )
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            f"sift: dest: {str(link / 's.db-wal')!r} is the store itself; back it up to another file\n"
        )
        assert fingerprint(real / "s.db-wal") == wal
        assert callers(store) == [("app", 50)]  # another process reads every job meanwhile
    finally:
        kill(app)  # the app dies before any checkpoint: its jobs live only in the -wal
    assert callers(store) == [("app", 50)]
    assert check_problems(store) == []


def reach(file_store: Path, tmp_path: Path, end: str, route: str) -> Path:
    """A DEST that is the store's file ``end`` (``""`` the store itself) by ``route``."""
    if route == "symlinked directory":
        (tmp_path / "elsewhere").symlink_to(file_store.parent)
        return tmp_path / "elsewhere" / f"{file_store.name}{end}"
    other = tmp_path / "other"
    other.mkdir()
    if route == "symlink":
        (other / "dest.db").symlink_to(f"{file_store}{end}")
    else:
        os.link(f"{file_store}{end}", other / "dest.db")
    return other / "dest.db"


#: Every file beside the store, by every route; a WAL store has no -journal to hard-link to.
ROUTES = [
    (end, route)
    for end in ("", "-wal", "-shm", "-journal", "-lock")
    for route in ("symlinked directory", "symlink", "hard link")
    if (end, route) != ("-journal", "hard link")
]


@pytest.mark.parametrize(("end", "route"), ROUTES)
def test_the_store_and_every_file_beside_it_are_refused_however_reached(
    file_store: Path, tmp_path: Path, end: str, route: str
) -> None:
    fill(3)  # the -wal, -shm and -lock files exist; -journal does not (WAL mode)
    dest = reach(file_store, tmp_path, end, route)
    before, state = snapshot(), folder_state(file_store.parent)
    with pytest.raises(dcache.InvalidBatchInput) as info:
        dcache.backup_store(dest)
    assert info.value.field == "dest"
    assert str(dest) in str(info.value)
    assert snapshot() == before and folder_state(file_store.parent) == state


# -- DEST is a regular file or nothing ---------------------------------------------------------------------

Make = Callable[[Path], None]


def make_fifo(path: Path) -> None:
    os.mkfifo(path, 0o644)


def make_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


def make_device(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private twin of /dev/null
    os.chmod(path, 0o666)


def make_link_to_fifo(path: Path) -> None:
    make_fifo(path.with_name("fifo"))
    path.symlink_to(path.with_name("fifo"))


def make_dangling_link(path: Path) -> None:
    path.symlink_to(path.with_name("nothing.db"))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (make_device, "is a character device, not a regular file"),
        (make_fifo, "is a FIFO, not a regular file"),
        (make_socket, "is a socket, not a regular file"),
        (make_link_to_fifo, "is a FIFO, not a regular file"),
        (make_dangling_link, "is a symlink to nothing"),
    ],
    ids=["device", "fifo", "socket", "symlink to a fifo", "dangling symlink"],
)
def test_a_dest_that_is_not_a_regular_file_is_refused_and_left_as_it_is(
    shared_store: str, tmp_path: Path, make: Make, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "dest"
    folder.mkdir()
    dest = folder / "dest.db"
    make(dest)
    dcache.create_batch_job(make_job("job-1", targets_total=2), make_targets(2))
    before, state = snapshot(), folder_state(folder)
    with pytest.raises(dcache.InvalidBatchInput, match=message) as info:
        dcache.backup_store(dest)
    assert info.value.field == "dest" and str(dest) in str(info.value)
    assert snapshot() == before and folder_state(folder) == state
    dcache.close_db()
    code, out, err = run(capsys, "--db", shared_store, "backup", dest)
    assert (code, out) == (1, "")
    assert err.startswith(f"sift: dest: {str(dest)!r} ") and message in err and err.count("\n") == 1
    assert folder_state(folder) == state


def test_a_symlink_to_a_regular_file_is_written_through(shared_store: str, tmp_path: Path) -> None:
    dcache.create_batch_job(make_job("job-1", targets_total=2), make_targets(2))
    target = tmp_path / "backups" / "monday.db"
    target.parent.mkdir()
    target.write_bytes(b"last week's backup")
    target.chmod(0o640)
    link = tmp_path / "latest.db"
    link.symlink_to(target)
    done = dcache.backup_store(link)
    assert done.dest == str(target)
    assert link.is_symlink() and os.readlink(link) == str(target)  # the link stays a link
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the file it replaced was a regular file
    assert callers(target) == [("alice", 1)] and check_problems(target) == []


# -- What an earlier store at DEST left beside it ------------------------------------------------------


def test_a_stale_wal_beside_dest_is_removed_so_the_copy_is_what_opens(
    shared_store: str, tmp_path: Path
) -> None:
    dest = tmp_path / "backup.db"
    kill(start_app(dest, 30, "old"))  # an old store at DEST, its process killed: its -wal holds 30 jobs
    assert os.path.getsize(f"{dest}-wal") > 0
    Path(f"{dest}-journal").write_bytes(b"a journal left by another program")
    for i in range(5):
        dcache.create_batch_job(make_job(f"new-{i}", caller="new", targets_total=2), make_targets(2))
    dcache.backup_store(dest)
    assert not any(os.path.exists(f"{dest}{end}") for end in ("-wal", "-shm", "-journal"))
    assert callers(dest) == [("new", 5)]
    assert check_problems(dest) == []


def test_a_file_beside_dest_that_is_the_stores_own_is_refused_and_kept(
    file_store: Path, tmp_path: Path
) -> None:
    fill(3)
    other = tmp_path / "other"
    other.mkdir()
    dest = other / "copy.db"
    os.link(f"{file_store}-wal", f"{dest}-wal")  # the live -wal, by another name beside DEST
    before, state, beside = snapshot(), folder_state(other), folder_state(file_store.parent)
    with pytest.raises(dcache.InvalidBatchInput, match="is one of the store's own files") as info:
        dcache.backup_store(dest)
    assert info.value.field == "dest"
    assert snapshot() == before and folder_state(other) == state
    assert folder_state(file_store.parent) == beside


def test_a_directory_beside_dest_is_refused(shared_store: str, tmp_path: Path) -> None:
    dest = tmp_path / "copy.db"
    Path(f"{dest}-wal").mkdir()
    state = folder_state(tmp_path)
    with pytest.raises(dcache.InvalidBatchInput, match=r"-wal', left beside .* is a directory") as info:
        dcache.backup_store(dest)
    assert info.value.field == "dest"
    assert folder_state(tmp_path) == state


def test_a_replaced_regular_file_gives_its_permission_bits_only(shared_store: str, tmp_path: Path) -> None:
    dest = tmp_path / "copy.db"
    dest.write_bytes(b"an older backup")
    dest.chmod(0o4750)  # a set-user-ID bit means nothing on a store file
    dcache.backup_store(dest)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o750
