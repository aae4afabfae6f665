"""Stores with results for the disk-space and backup tests: filled through the package's own functions."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from helpers import make_job, make_targets

from sift import dcache
from sift.dcache.database import BASE_SCHEMA

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
    """The store invariants that fail in the file at ``path``, read with plain sqlite3: SQLite's
    integrity_check, targets_done and nbytes against the target rows, the kept byte total, orphans and
    the total's triggers.

    A stand-in until ``sift.dcache.check_store()`` (issue 11, item 2) is on this branch: the tests that
    say a copy "passes the check" should then call it on the copy and assert its report's ``ok``.
    """
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        problems = [row[0] for row in conn.execute("PRAGMA integrity_check") if row[0] != "ok"]
        queries = {
            "targets_done differs from the done and failed targets": (
                "SELECT COUNT(*) FROM batch_job AS j WHERE targets_done != (SELECT COUNT(*) FROM "
                "batch_target AS t WHERE t.job_id = j.id AND t.status IN ('done', 'failed'))"
            ),
            "nbytes differs from the results' bytes": (
                "SELECT COUNT(*) FROM batch_job AS j WHERE nbytes != (SELECT COALESCE(SUM(length("
                "CAST(t.result AS BLOB))), 0) FROM batch_target AS t WHERE t.job_id = j.id)"
            ),
            "batch_totals differs from SUM(nbytes)": (
                "SELECT COUNT(*) FROM batch_totals WHERE id = 0 AND "
                "nbytes != (SELECT COALESCE(SUM(nbytes), 0) FROM batch_job)"
            ),
            "targets without their job": (
                "SELECT COUNT(*) FROM batch_target WHERE job_id NOT IN (SELECT id FROM batch_job)"
            ),
        }
        for problem, sql in queries.items():
            if n := conn.execute(sql).fetchone()[0]:
                problems.append(f"{problem}: {n}")
        if conn.execute("SELECT COUNT(*) FROM batch_totals").fetchone()[0] != 1:
            problems.append("batch_totals has no total")
        triggers = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        if missing := {"batch_totals_insert", "batch_totals_delete", "batch_totals_update"} - triggers:
            problems.append(f"missing triggers: {sorted(missing)}")
        return problems
