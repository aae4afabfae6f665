"""Helpers for the tests of the ``sift`` command: a store with known contents, running ``main``, and
reading the file independently with plain ``sqlite3``."""

from __future__ import annotations

import fcntl
import os
import pty
import sqlite3
import struct
import subprocess
import sys
import termios
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import make_job, make_targets, snapshot

from sift import dcache
from sift.cli import main

#: The frozen "now" of tests that show ages: 2025-01-01 00:00:00 UTC.
FROZEN = "2025-01-01 00:00:00"
NOW = 1_735_689_600

#: Results with non-ASCII text, so that UTF-8 bytes differ from len().
RESULT_A0 = '{"body":"café"}'
RESULT_A1 = '{"body":"東京 🙂"}'
RESULT_A2 = '{"body":"plain"}'
RESULT_B0 = '{"body":"naïve"}'
RESULT_E0 = '{"body":"' + "x" * 500 + '"}'


def utf8(text: str) -> int:
    return len(text.encode("utf-8"))


@dataclass(frozen=True)
class Expected:
    """What :func:`populate` stored, job by job."""

    status: str
    caller: str
    caller_class: str
    created_at: int
    lease: int
    nbytes: int
    done: int
    total: int


EXPECTED: dict[str, Expected] = {
    "job-a": Expected(
        "done",
        "alice",
        "fleet",
        NOW - 7200,
        NOW - 3600,
        utf8(RESULT_A0) + utf8(RESULT_A1) + utf8(RESULT_A2),
        3,
        3,
    ),
    "job-b": Expected("running", "bob", "restricted", NOW - 600, NOW - 60, utf8(RESULT_B0), 1, 2),
    "job-c": Expected("failed", "alice", "fleet", NOW - 90_000, NOW - 90_000, 0, 2, 2),
    "job-d": Expected("queued", "carol", "restricted", NOW - 30, NOW - 30, 0, 0, 1),
    "job-e": Expected("partial", "bob", "fleet", NOW - 10_000, NOW - 8000, utf8(RESULT_E0), 2, 2),
}
NEWEST_FIRST = ["job-d", "job-b", "job-a", "job-e", "job-c"]


def populate(path: Path | str) -> None:
    """A store with five jobs, one per line of :data:`EXPECTED`, written through the package."""
    dcache.open_db(path)
    try:
        for job_id, e in EXPECTED.items():
            job = make_job(
                job_id,
                caller=e.caller,
                caller_class=e.caller_class,
                targets_total=e.total,
                created_at=e.created_at,
                lease=e.created_at,
                idem_key=f"key-{job_id}",
            )
            dcache.create_batch_job(job, make_targets(e.total))
        at = NOW - 3600
        for idx, result in enumerate((RESULT_A0, RESULT_A1, RESULT_A2)):
            dcache.update_batch_target("job-a", idx, "done", result=result, now=at)
        dcache.set_batch_job_status("job-a", "done", now=at)
        dcache.set_batch_job_status("job-b", "running", now=NOW - 60)
        dcache.update_batch_target("job-b", 0, "done", result=RESULT_B0, now=NOW - 60)
        at = NOW - 90_000
        dcache.update_batch_target(
            "job-c", 0, "failed", error="timeout after 10 s", hint="retry later", now=at
        )
        dcache.update_batch_target("job-c", 1, "failed", error="line one\nline two", now=at)
        dcache.set_batch_job_status("job-c", "failed", "every target failed", now=at)
        at = NOW - 8000
        dcache.update_batch_target("job-e", 0, "done", result=RESULT_E0, now=at)
        dcache.update_batch_target("job-e", 1, "failed", error="HTTP 503", now=at)
        dcache.set_batch_job_status("job-e", "partial", "1 of 2 targets failed", now=at)
    finally:
        dcache.close_db()


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """``main(argv)``: the exit status, standard output and standard error."""
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def connect_ro(path: Path) -> sqlite3.Connection:
    """A read-only plain sqlite3 connection, independent of the package."""
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the two batch tables, read with plain sqlite3."""
    with closing(connect_ro(path)) as conn:
        return {
            "batch_job": conn.execute("SELECT * FROM batch_job ORDER BY id").fetchall(),
            "batch_target": conn.execute("SELECT * FROM batch_target ORDER BY job_id, idx").fetchall(),
        }


def snapshot_of(path: Path | str) -> dict[str, list[tuple[Any, ...]]]:
    """The shared helpers' snapshot() of every table of the store at ``path``."""
    dcache.open_db(path)
    try:
        return snapshot()
    finally:
        dcache.close_db()


def job_ids(path: Path) -> set[str]:
    with closing(connect_ro(path)) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM batch_job")}


def sift_script() -> Path:
    """The installed ``sift`` console script, next to this interpreter."""
    return Path(sys.executable).parent / "sift"


def run_on_terminal(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run a command with standard error on a 100x24 pseudo-terminal; return status, stdout and what the
    terminal received."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = dict(os.environ, COLUMNS="100", LINES="24")
    try:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=slave, env=env)
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    proc.stdout.close()
    code = proc.wait(timeout=120)
    os.close(master)
    return code, out, b"".join(chunks).decode(errors="replace")


def store_of_25_jobs(folder: Path, *, first_at: int) -> Path:
    """A store file ``many.db`` in ``folder`` of 25 pending jobs, ``job-00`` to ``job-24``, created (and
    leased) one a second from ``first_at``."""
    path = folder / "many.db"
    dcache.open_db(path)
    for n in range(25):
        dcache.create_batch_job(make_job(f"job-{n:02d}", created_at=first_at + n, lease=first_at + n))
    dcache.close_db()
    return path
