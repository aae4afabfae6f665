"""Stores with results for the disk-space and backup tests: filled through the package's own functions."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from helpers import make_job, make_targets

from sift import dcache
from sift.dcache.backends.sqlite.schema import BASE_SCHEMA

RESULT = "r" * 3000  # most of a 4 KiB page


def fill(
    jobs: int, *, prefix: str = "job", targets: int = 10, lease: int = 1_000, result: str = RESULT
) -> None:
    """``jobs`` finished jobs of ``targets`` targets, each holding ``result`` (3 KB unless given)."""
    for n in range(jobs):
        job_id = f"{prefix}-{n}"
        dcache.create_batch_job(
            make_job(job_id, targets_total=targets, lease=lease, created_at=lease), make_targets(targets)
        )
        for idx in range(targets):
            dcache.update_batch_target(job_id, idx, "done", result=result, now=lease)
        dcache.set_batch_job_status(job_id, "done", now=lease + n)


def old_store(path: Path) -> None:
    """A store made before incremental auto-vacuum, with most of its jobs swept: many free pages."""
    with closing(sqlite3.connect(path)) as old:
        old.execute("PRAGMA journal_mode = wal")
        for statement in BASE_SCHEMA:
            old.execute(statement)
    dcache.open_db(path)
    fill(60, prefix="old", lease=1_000)
    fill(6, prefix="new", lease=10**6)
    assert dcache.sweep_batch(10, now=2_000) == 60


def check_problems(path: Path) -> list[str]:
    """What the store's invariant check finds wrong in the file at ``path`` (``sift check --json``, which
    is ``check_store()`` on a read-only open), run in a process of its own so that the store this test has
    open stays open: one line per violation, empty when the file passes."""
    proc = subprocess.run(
        [sys.executable, "-m", "sift", "check", "--json", "--db", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode not in (0, 1) or proc.stderr:
        return [f"sift check failed: exit {proc.returncode}: {proc.stderr.strip()}"]
    report = json.loads(proc.stdout)
    assert report["ok"] == (proc.returncode == 0)
    return [f"{v['kind']} ({v['job_id']}): {v['detail']}" for v in report["violations"]]
