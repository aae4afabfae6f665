"""Crash safety: a child process writing large jobs is killed with SIGKILL at random moments.

The trials themselves live in ``scripts/crash_trials.py`` (which also runs any number of them from the
command line); this test runs 25 of them on one file and requires every check of every trial to pass.
The smaller tests show the checker is not blind: it catches a half-written create, a lost committed
write, a drifted ``nbytes`` and a drifted byte total.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from helpers import load_script

from sift import dcache

TRIALS = 25
SEED = 2026

#: Figures of the last run, for docs/explanation/guarantees.md.
RECORD: dict[str, Any] = {}

pytestmark = pytest.mark.sqlite_only


crash_trials = load_script("crash_trials")


@pytest.mark.slow
def test_sigkill_trials(tmp_path: Path) -> None:
    summary = crash_trials.run_trials(TRIALS, SEED, tmp_path)
    print("\n" + summary.report())
    assert summary.failures == []
    assert summary.trials == TRIALS
    assert summary.kills == TRIALS  # every child died of the SIGKILL, none stopped on its own
    assert summary.writes_verified > TRIALS
    assert sum(summary.killed_in.values()) > 0
    RECORD.update(
        trials=summary.trials,
        kills=summary.kills,
        writes_verified=summary.writes_verified,
        failures=len(summary.failures),
        seed=SEED,
    )


# -- The checker catches what it must ----------------------------------------------------------------------


def write(path: Path, ops: list[list[Any]]) -> list[dict[str, Any]]:
    """Make ``ops`` through the package and return the log a child would have written for them."""
    dcache.open_db(path)
    log: list[dict[str, Any]] = []
    for n, op in enumerate(ops):
        log.append({"b": n, "op": op})
        log.append({"c": n, "ret": crash_trials.perform(op)})
    dcache.close_db()
    return log


def tamper(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in statements:
        conn.execute(statement)
    conn.close()


def failures_of(path: Path, log: list[dict[str, Any]]) -> list[str]:
    summary = crash_trials.Summary(seed=0)
    crash_trials.check_file(path, {}, log, 0, summary)
    return list(summary.failures)


CREATE = ["create", "full-a", 20_000, 20_000, "running", 10_000]
UPDATE = ["update", "full-a", 7, "done", [1, 500], None, "hint\x01", 10_001]


@pytest.mark.slow
def test_checker_passes_an_untouched_file(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    assert failures_of(path, write(path, [CREATE, UPDATE, ["sweep", 5, 10_002], ["evict", 0]])) == []


@pytest.mark.slow
def test_checker_passes_a_write_in_flight_either_way(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    log = write(path, [CREATE, UPDATE])
    assert failures_of(path, log[:-1]) == []  # committed but killed before its line: wholly there
    path2 = tmp_path / "crash2.db"
    log = write(path2, [CREATE])
    assert failures_of(path2, [*log, {"b": 1, "op": UPDATE}]) == []  # killed before it ran: wholly absent


@pytest.mark.slow
@pytest.mark.parametrize(
    ("statements", "expected"),
    [
        (["DELETE FROM batch_target WHERE job_id = 'full-a' AND idx >= 19000"], "holds 19000 of the 20000"),
        (["DELETE FROM batch_job"], "orphan targets"),
        (["UPDATE batch_target SET status = 'pending', result = NULL WHERE idx = 7"], "the log says"),
        (["UPDATE batch_job SET nbytes = nbytes + 1"], "its targets give"),
        (["UPDATE batch_totals SET nbytes = nbytes + 1"], "batch_totals holds"),
        (["UPDATE batch_target SET result = result || 'x' WHERE idx = 7"], "its targets give"),
    ],
)
def test_checker_catches(tmp_path: Path, statements: list[str], expected: str) -> None:
    path = tmp_path / "crash.db"
    log = write(path, [CREATE, UPDATE])
    tamper(path, *statements)
    failures = failures_of(path, log)
    assert any(expected in failure for failure in failures), failures
