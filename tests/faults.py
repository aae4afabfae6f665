"""Real faults to put under a store, and a valid call of every public function of sift.dcache.

- a full disk: a small tmpfs filled up (as root), else ``RLIMIT_FSIZE`` with ``SIGXFSZ`` ignored;
- I/O errors: ``RLIMIT_FSIZE`` of 0, so every ``write()`` fails with EFBIG, which SQLite reports as
  ``SQLITE_IOERR_WRITE`` (a real failing system call, no patched connection);
- a damaged file: random bytes written over pages of a copy;
- a read-only store: its file system remounted read-only (as root), else the file and directory chmod-ed;
- a lock held past the busy timeout: another process inside ``BEGIN EXCLUSIVE``.
"""

from __future__ import annotations

import errno
import inspect
import itertools
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import create_partial, make_job, make_targets

from sift import dcache

IS_ROOT = os.geteuid() == 0

#: A result big enough that a few fill a page of their own.
RESULT = '{"body":"' + "r" * 3000 + '"}'


# -- The public functions, each with a valid call on a store made by populate() --------------------------

_ids = itertools.count()


def _new_id() -> str:
    return f"new-{next(_ids)}"


def _refused(call: Callable[[], object], error: type[dcache.BatchError], field: str) -> None:
    """A function that refuses this store before reading it: on a SQLite store, PostgreSQL's space
    functions; restore_store given the open store as its source. The refusal is the valid outcome."""
    with pytest.raises(error, match=field):
        call()


def _cancel_one() -> None:
    job_id = _new_id()
    dcache.create_batch_job(make_job(job_id, targets_total=2), make_targets(2))
    assert dcache.cancel_batch_job(job_id, now=2_000)


def _put_one() -> None:
    job_id = _new_id()
    dcache.create_batch_job(make_job(job_id, targets_total=2))
    dcache.put_batch_targets(job_id, make_targets(2))


#: Public function name -> a call with valid arguments. The store path is the argument of open_db.
PUBLIC_CALLS: dict[str, Callable[[Path], object]] = {
    # The copy goes beside the store's folder (pytest's), off a full or read-only file system under test.
    "backup_store": lambda path: dcache.backup_store(
        Path(tempfile.mkdtemp(dir=path.parent.parent)) / "copy.db"
    ),
    "batch_job": lambda _: dcache.batch_job("job-1"),
    "batch_job_by_idem": lambda _: dcache.batch_job_by_idem("alice", "k-1", 10**9, now=2_000),
    "batch_nbytes": lambda _: dcache.batch_nbytes(),
    "batch_targets": lambda _: dcache.batch_targets("job-1"),
    "cancel_batch_job": lambda _: _cancel_one(),
    "check_store": lambda _: dcache.check_store(),
    "claim_batch_targets": lambda _: dcache.claim_batch_targets(2, now=2_000),
    # each claims first, so that it has a claim of its own to renew, release or requeue
    "renew_claims": lambda _: _claimed_then(lambda: dcache.renew_claims("renewer", now=2_001), "renewer"),
    "release_claims": lambda _: _claimed_then(lambda: dcache.release_claims("releaser"), "releaser"),
    "requeue_stale_claims": lambda _: _claimed_then(
        lambda: dcache.requeue_stale_claims(0, now=2_001), "requeuer"
    ),
    "requeue_in_flight": lambda _: _claimed_then(lambda: dcache.requeue_in_flight(now=2_001), "restarted"),
    "runner_name": lambda _: dcache.runner_name(),
    "stale_claims": lambda _: dcache.stale_claims(0, now=2_000),
    "close_db": lambda _: dcache.close_db(),
    "create_batch_job": lambda _: dcache.create_batch_job(make_job(_new_id()), make_targets(3)),
    "evict_batch_oldest": lambda _: dcache.evict_batch_oldest(0),
    "evict_candidates": lambda _: dcache.evict_candidates(0),
    "live_batch_jobs": lambda _: dcache.live_batch_jobs("alice"),
    "live_batch_jobs_total": lambda _: dcache.live_batch_jobs_total(),
    "mark_in_flight_failed": lambda _: dcache.mark_in_flight_failed("restart", now=2_000),
    "open_db": lambda path: dcache.open_db(path),
    "put_batch_targets": lambda _: _put_one(),
    "relation_space": lambda _: _refused(dcache.relation_space, dcache.StoreUnavailable, "relation_space"),
    "restore_store": lambda path: _refused(
        lambda: dcache.restore_store(path), dcache.InvalidBatchInput, "is the open store itself"
    ),
    "finish_batch_job": lambda _: dcache.finish_batch_job("job-2", now=2_000),  # running, every target done
    "finish_complete_jobs": lambda _: dcache.finish_complete_jobs(now=2_000),  # job-2, if still running
    "retry_batch_target": lambda _: _retried_one(),
    "retry_batch_targets": lambda _: _retried_one(many=True),
    "retry_failed_targets": lambda _: _reopened_one(),
    "rescue_stale_jobs": lambda _: dcache.rescue_stale_jobs(0, "host lost", now=2_000),
    "set_batch_job_status": lambda _: dcache.set_batch_job_status("job-2", "done", now=2_000),
    "stats": lambda _: dcache.stats(),
    "store_load": lambda _: dcache.store_load(),
    "store_space": lambda _: dcache.store_space(),
    "submit": lambda _: dcache.submit("alice", ["https://example.com/a"], idem_key=_new_id(), now=2_000),
    "submit_batch_job": lambda _: dcache.submit_batch_job(
        make_job(_new_id(), idem_key=_new_id()), make_targets(3), 10**9, now=2_000
    ),
    "sweep_batch": lambda _: dcache.sweep_batch(0, now=10**6),
    "sweep_candidates": lambda _: dcache.sweep_candidates(0, now=10**6),
    "touch_batch_job": lambda _: dcache.touch_batch_job("job-1", now=2_000),
    "unix_now": lambda _: dcache.unix_now(),
    "update_batch_target": lambda _: dcache.update_batch_target("job-1", 1, "done", result=RESULT, now=2_000),
    "update_batch_targets": lambda _: dcache.update_batch_targets(
        "job-1", [{"idx": 1, "status": "done", "result": RESULT}], now=2_000
    ),
    "url_host": lambda _: dcache.url_host("https://example.com/"),
    "vacuum_relations": lambda _: _refused(dcache.vacuum_relations, dcache.StoreUnavailable, "vacuum_rel"),
    "vacuum_store": lambda _: dcache.vacuum_store(),
    "wait_for_batch_job": lambda _: dcache.wait_for_batch_job("job-1", timeout=0),
    # a host no fixture's URL names: the claims after it are not paced
    "set_host_policy": lambda _: dcache.set_host_policy("paced.example", max_running=2, min_interval=0.5),
    "host_policies": lambda _: dcache.host_policies(),
    "back_off_host": lambda _: dcache.back_off_host("paced.example", 3_000, now=2_000),
    "backed_off_hosts": lambda _: dcache.backed_off_hosts(now=2_000),
    # backs the host off first, so that the release writes, whatever came before
    "release_host": lambda _: (
        dcache.back_off_host("paced.example", 3_000, now=2_000),
        dcache.release_host("paced.example", now=2_000),
    ),
    # each pause is undone by the resume after it, which pauses first: both write, whatever came before
    "pause_batch_job": lambda _: dcache.pause_batch_job("job-2", now=2_000),
    "resume_batch_job": lambda _: (
        dcache.pause_batch_job("job-2", now=2_000),
        dcache.resume_batch_job("job-2"),
    ),
    "pause_caller": lambda _: dcache.pause_caller("alice", now=2_000),
    "resume_caller": lambda _: (dcache.pause_caller("alice", now=2_000), dcache.resume_caller("alice")),
    "paused_jobs": lambda _: dcache.paused_jobs(),
    "paused_callers": lambda _: dcache.paused_callers(),
    "unix_now_ms": lambda _: dcache.unix_now_ms(),
}


def _retried_one(*, many: bool = False) -> object:
    """A target claimed by "retrier" (of a new job when none is pending), then put back to wait; ``many``:
    by ``retry_batch_targets``."""
    claimed = dcache.claim_batch_targets(1, runner="retrier", now=2_000)
    if not claimed:
        dcache.create_batch_job(make_job(_new_id(), targets_total=1), make_targets(1))
        claimed = dcache.claim_batch_targets(1, runner="retrier", now=2_000)
    target = claimed[0]
    if many:
        retries = [{"idx": target.idx, "error": "later", "not_before": 3_000}]
        return dcache.retry_batch_targets(target.job_id, retries, runner="retrier")
    return dcache.retry_batch_target(
        target.job_id, target.idx, runner="retrier", error="later", not_before=3_000
    )


def _reopened_one() -> object:
    """A new job of one target, failed, then reopened by retry_failed_targets."""
    job_id = _new_id()
    dcache.create_batch_job(make_job(job_id, targets_total=1), make_targets(1))
    dcache.update_batch_target(job_id, 0, "failed", error="gone", now=2_000)
    return dcache.retry_failed_targets(job_id, now=2_000)


def _claimed_then(call: Callable[[], object], runner: str) -> object:
    """One target claimed by ``runner`` (if any is pending), then ``call``."""
    dcache.claim_batch_targets(1, runner=runner, now=2_000)
    return call()


def public_functions() -> list[str]:
    """Every function in ``sift.dcache.__all__``: a new one must get a PUBLIC_CALLS entry."""
    return sorted(name for name in dcache.__all__ if inspect.isfunction(getattr(dcache, name)))


def populate(jobs: int = 40, *, results: bool = True) -> None:
    """``jobs`` finished jobs of 3 targets, with results unless told not (job-1 keeps target 1 pending), and
    job-2 running."""
    for n in range(1, jobs + 1):
        dcache.create_batch_job(make_job(f"job-{n}", idem_key=f"k-{n}", status="done"), make_targets(3))
        for idx in range(3):
            if results and (n, idx) != (1, 1):
                dcache.update_batch_target(f"job-{n}", idx, "done", result=RESULT, now=1_000 + n)
    dcache.set_batch_job_status("job-2", "running", now=1_500)
    create_partial(make_job("job-live", created_at=1_600, lease=1_600), make_targets(2))  # to claim


# -- Faults ----------------------------------------------------------------------------------------------


@contextmanager
def tmpfs(directory: Path, size: str = "3m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``directory`` (root only), unmounted afterwards."""
    if not IS_ROOT:
        pytest.skip("mounting a tmpfs needs root")
    directory.mkdir(exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


def fill(directory: Path, leave: int = 0) -> Path:
    """Write a filler file until the file system holding ``directory`` is full (but for about ``leave``
    bytes); delete it to free the space."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for chunk in (1 << 20, 1 << 16, 1 << 12):
            try:
                while shutil.disk_usage(directory).free - chunk >= leave:
                    os.write(fd, b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """No file of this process may grow past ``limit`` bytes (and no write may start at or past it): a
    write crossing it is cut short, one starting past it fails with EFBIG. SIGXFSZ is ignored meanwhile."""
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


def damage(path: Path, at: float, seed: int = 13, size: int = 8192) -> None:
    """Overwrite ``size`` bytes of the closed store file with random bytes, from the page at fraction ``at``
    of the file (0: the header and the schema's page)."""
    offset = int(path.stat().st_size * at) // 4096 * 4096
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(random.Random(seed).randbytes(size))


def leave_wal_files(path: Path) -> None:
    """Make the -wal and -shm files exist beside a closed store, as a process that died with it open leaves
    them (a read-only WAL store can only be opened with them)."""
    code = "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT 1 FROM batch_job')"
    subprocess.run([sys.executable, "-c", code + "; os._exit(0)", str(path)], check=True)
    assert Path(f"{path}-shm").exists() and Path(f"{path}-wal").exists()


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """The closed store at ``path``, its -wal and -shm files and directory made read-only: the file system
    remounted read-only when ``path``'s directory is a mount point (as root), else chmod (not root)."""
    directory = path.parent
    leave_wal_files(path)
    if IS_ROOT:
        subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
        try:
            yield
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(directory)], check=True)
        return
    files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
    for file in files:
        file.chmod(0o444)
    directory.chmod(0o555)
    try:
        yield
    finally:
        directory.chmod(0o755)
        for file in files:
            file.chmod(0o644)


@contextmanager
def locked_by_another_process(path: Path) -> Iterator[None]:
    """Another process holds the store's write lock (BEGIN EXCLUSIVE) until the block ends."""
    code = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
