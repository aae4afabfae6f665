"""``backup_store`` and ``sift backup``: an online, consistent copy taken while threads and processes write;
a killed backup leaves nothing at DEST; DEST is private."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from cli_helpers import run, run_on_terminal, sift_script
from helpers import make_job, make_targets, snapshot
from space_helpers import check_problems, fill

from sift import dcache

#: Results the writers store: 500 bytes each.
RESULT = "w" * 500


class Writers:
    """Threads that each create, finish and evict jobs on the open store until stopped."""

    def __init__(self, count: int, budget: int) -> None:
        self.budget = budget
        self.committed = 0
        self.changed = threading.Condition()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(count)]

    def run(self, i: int) -> None:
        try:
            n = 0
            while not self.stop.is_set():
                job_id = f"w{i}-{n}"
                dcache.create_batch_job(make_job(job_id, targets_total=4, lease=5_000 + n), make_targets(4))
                for idx in range(4):
                    dcache.update_batch_target(job_id, idx, "done", result=RESULT, now=5_000 + n)
                dcache.set_batch_job_status(job_id, "done", now=5_000 + n)
                if n % 5 == 0:  # deletes, so pages are freed and moved while the copy runs
                    dcache.evict_batch_oldest(self.budget)
                n += 1
                with self.changed:
                    self.committed += 1
                    self.changed.notify_all()
        except BaseException as exc:
            self.errors.append(exc)
            raise

    def wait_for_more(self, jobs: int) -> bool:
        with self.changed:
            goal = self.committed + jobs
            return self.changed.wait_for(lambda: self.committed >= goal, timeout=60)

    def __enter__(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)
        assert not self.errors, self.errors


@pytest.mark.slow
def test_backup_during_a_four_thread_write_load_is_consistent(file_store: Path, tmp_path: Path) -> None:
    fill(200, prefix="base")
    dest = tmp_path / "copy.db"
    seen: list[tuple[int, int]] = []
    with Writers(4, budget=dcache.batch_nbytes() // 2) as writers:
        assert writers.wait_for_more(10)  # the load is under way

        def progress(done: int, total: int) -> None:
            if not seen:  # the copy has begun: let the writers commit more before it goes on
                assert writers.wait_for_more(20)
            seen.append((done, total))

        report = dcache.backup_store(dest, progress=progress, pages_per_step=16)
        assert writers.wait_for_more(5)  # still writing after the copy
    assert len(seen) > 10
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)  # never started over
    assert seen[-1] == (report.pages, report.pages)
    assert report.dest == str(dest) and dest.stat().st_size == report.nbytes
    assert check_problems(dest) == []
    assert check_problems(file_store) == []
    in_copy = dcache.BatchJob.select().count()
    dcache.open_db(dest)  # opens as a store
    assert dcache.BatchJob.select().count() < in_copy  # the snapshot: later commits are not in it
    assert dcache.store_space().auto_vacuum == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


WRITER_PROCESS = """
import sys
from sift import dcache
from sift.dcache import BatchJob, BatchTarget
dcache.open_db(sys.argv[1])
n = 0
while True:
    job_id = f"p-{n}"
    dcache.create_batch_job(
        BatchJob(id=job_id, caller="p", caller_class="fleet", idem_key="", status="queued", targets_total=2,
                 created_at=9_000 + n, lease=9_000 + n),
        [BatchTarget(idx=i, url=f"https://p.example/{i}", options="{}") for i in range(2)],
    )
    for i in range(2):
        dcache.update_batch_target(job_id, i, "done", result="p" * 700, now=9_000 + n)
    if n % 5 == 0:
        dcache.evict_batch_oldest(int(sys.argv[2]))
    print(n, flush=True)
    n += 1
"""


@pytest.mark.slow
def test_backup_while_another_process_writes_is_consistent(file_store: Path, tmp_path: Path) -> None:
    fill(200, prefix="base")
    budget = dcache.batch_nbytes() // 2
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER_PROCESS, str(file_store), str(budget)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    lines = iter(writer.stdout)
    seen: list[int] = []

    def progress(done: int, total: int) -> None:
        if not seen:
            for _ in range(20):  # the other process commits 20 jobs while the copy is open
                next(lines)
        seen.append(done)

    try:
        next(lines)
        dest = tmp_path / "copy.db"
        dcache.backup_store(dest, progress=progress, pages_per_step=16)
    finally:
        writer.kill()
        writer.wait(timeout=30)
    assert seen == sorted(seen) and len(seen) > 10
    assert check_problems(dest) == []
    assert check_problems(file_store) == []


KILLED_BACKUP = """
import sys
from sift import dcache
dcache.open_db(sys.argv[1])
# One line of 1 KiB per page: the parent stops reading, the pipe fills, and the copy stops half-way.
line = lambda done, total: print(f"{done} {total}".ljust(1023), flush=True)
dcache.backup_store(sys.argv[2], progress=line, pages_per_step=1)
print("finished", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("older", [False, True], ids=["no-dest", "older-dest"])
def test_a_backup_killed_half_way_leaves_no_dest(file_store: Path, tmp_path: Path, older: bool) -> None:
    """Killed half-way: no DEST, or the older backup at DEST as it was."""
    folder = tmp_path / "backups"
    folder.mkdir()
    dest = folder / "copy.db"
    if older:
        dcache.backup_store(dest)  # of the store while still empty
    before = dest.read_bytes() if older else None
    fill(300, prefix="base")
    dcache.close_db()
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_BACKUP, str(file_store), str(dest)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    done, total = map(int, child.stdout.readline().split())
    assert 0 < done < total > 1000
    temp = [p for p in folder.iterdir() if p.name.endswith(dcache.backup.TEMP_SUFFIX)]
    assert len(temp) == 1 and temp[0].name.startswith(".copy.db.")  # the copy under way
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    child.stdout.close()
    assert (dest.read_bytes() if dest.exists() else None) == before
    assert sorted(p.name for p in folder.iterdir()) == sorted([temp[0].name, *(["copy.db"] if older else [])])
    dcache.open_db(file_store)  # a second backup works beside the leftover
    dcache.backup_store(dest)
    assert check_problems(dest) == []


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask_022")
def test_a_new_dest_is_private_and_an_existing_one_keeps_its_mode(file_store: Path, tmp_path: Path) -> None:
    fill(5)
    new = tmp_path / "new.db"
    dcache.backup_store(new)
    assert mode(new) == 0o600
    old = tmp_path / "old.db"
    old.write_bytes(b"an older backup")
    old.chmod(0o640)
    dcache.backup_store(old)
    assert mode(old) == 0o640
    assert check_problems(old) == [] and check_problems(new) == []


@pytest.mark.parametrize(
    ("dest", "message"),
    [
        ("", "dest: must be a non-empty str"),
        (42, "dest: must be a non-empty str"),
        ("{tmp}", "is a directory"),
        ("{tmp}/missing/copy.db", "does not exist"),
        ("{tmp}/store.db", "is the store itself"),
        ("{tmp}/store.db-wal", "is the store itself"),
        ("{tmp}/store.db-lock", "is the store itself"),  # the writers' lock file
    ],
)
def test_bad_dest_is_refused_and_nothing_is_written(
    file_store: Path, tmp_path: Path, dest: object, message: str
) -> None:
    fill(3)
    before, listing = snapshot(), sorted(os.listdir(tmp_path))
    if isinstance(dest, str):
        dest = dest.format(tmp=tmp_path)
    with pytest.raises(dcache.InvalidBatchInput, match=message) as info:
        dcache.backup_store(dest)  # type: ignore[arg-type]
    assert info.value.field == "dest"
    assert snapshot() == before and sorted(os.listdir(tmp_path)) == listing


def test_a_bad_step_is_refused(file_store: Path, tmp_path: Path) -> None:
    with pytest.raises(dcache.InvalidBatchInput, match="pages_per_step: must be an int >= 1") as info:
        dcache.backup_store(tmp_path / "copy.db", pages_per_step=0)
    assert info.value.field == "pages_per_step"
    assert not (tmp_path / "copy.db").exists()


def test_a_memory_store_cannot_be_backed_up(tmp_path: Path) -> None:
    dcache.open_db(":memory:")
    try:
        with pytest.raises(dcache.StoreUnavailable, match="in-memory"):
            dcache.backup_store(tmp_path / "copy.db")
    finally:
        dcache.close_db()
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_store_can_be_backed_up(file_store: Path, tmp_path: Path) -> None:
    fill(5)
    dcache.open_db(file_store, readonly=True)
    dcache.backup_store(tmp_path / "copy.db")
    assert check_problems(tmp_path / "copy.db") == []


# -- sift backup -----------------------------------------------------------------------------------------


@pytest.mark.usefixtures("umask_022")
def test_cli_backup_json(file_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fill(5)
    dcache.close_db()
    dest = tmp_path / "copy.db"
    code, out, err = run(capsys, "--db", file_store, "backup", dest, "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report == {
        "db": str(file_store),
        "dest": str(dest),
        "pages": report["pages"],
        "bytes": dest.stat().st_size,
    }
    assert report["bytes"] == report["pages"] * 4096
    assert mode(dest) == 0o600 and check_problems(dest) == []
    code, out, err = run(capsys, "--db", file_store, "backup", dest)
    assert code == 0 and out.startswith(f"backed up {file_store} to {dest}: ")


def test_cli_backup_refuses_the_store_itself(file_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dcache.close_db()
    code, out, err = run(capsys, "--db", file_store, "backup", file_store)
    assert (code, out) == (1, "")
    assert err == f"sift: dest: {str(file_store)!r} is the store itself; back it up to another file\n"


@pytest.mark.parametrize(
    ("command", "said"),
    [("backup", "backed up "), ("restore", "restored 50 jobs ")],
)
def test_cli_backup_and_restore_show_progress_on_a_terminal(
    file_store: Path, tmp_path: Path, command: str, said: str
) -> None:
    fill(50)
    dcache.close_db()
    dest = tmp_path / "dest.db"
    argv = (
        ["--db", str(file_store), "backup", str(dest)]
        if command == "backup"
        else ["restore", str(file_store), "--db", str(dest)]
    )
    code, out, terminal = run_on_terminal([str(sift_script()), *argv], cwd=tmp_path)
    assert code == 0, terminal
    assert command in terminal and "100%" in terminal
    assert out.startswith(said)
    assert check_problems(dest) == []


def test_a_store_file_is_copied_by_its_pages_never_by_its_rows(file_store: Path, tmp_path: Path) -> None:
    with (
        closing(sqlite3.connect(tmp_path / "rows.db")) as dst,
        pytest.raises(dcache.StoreUnavailable, match="page by page"),
    ):
        dcache.db.backend.copy_rows_into(dst, None, rows_per_step=10)
    assert not (tmp_path / "rows.db").stat().st_size  # nothing written into it
