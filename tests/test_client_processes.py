"""The client's calls from several processes at once: one key submitted by 4 processes makes one job per
key; a cancel races a runner process's last write and each job ends one way, counts exact."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import SPAWN, make_job, make_targets, run_processes

from sift import dcache
from sift.dcache import JobStatus, db

KEYS = 40
PROCESSES = 4
URLS = ["https://example.com/a", "https://other.example/b"]
RACES = 300

pytestmark = pytest.mark.slow


def submitter(target: str, barrier: Any) -> dict[str, Any]:
    """One process: submit the same request under each key in turn, as every other process does."""
    dcache.open_db(target)
    try:
        barrier.wait(120)
        return {"answers": [tuple(dcache.submit("alice", URLS, idem_key=f"key-{k}")) for k in range(KEYS)]}
    finally:
        dcache.close_db()


def test_a_burst_of_processes_with_one_key_makes_one_job(shared_store: str) -> None:
    reports = run_processes(submitter, [(shared_store,)] * PROCESSES)
    assert all("errors" not in r for r in reports), reports
    for k in range(KEYS):
        answers = [r["answers"][k] for r in reports]
        assert len({job_id for job_id, _ in answers}) == 1, answers
        assert sorted(created for _, created in answers) == [False] * (PROCESSES - 1) + [True]
    assert db.execute_sql("SELECT COUNT(*) FROM batch_job").fetchone()[0] == KEYS
    assert dcache.check_store().ok


def last_writer(target: str, go: Any, out: Any) -> None:
    """The runner process: for each job in turn, write both its claimed targets and finish it."""
    dcache.open_db(target)
    seen: list[tuple[bool, Any]] = []
    try:
        go.wait(120)
        for n in range(RACES):
            results = [{"idx": 0, "status": "done", "result": "ok"}, {"idx": 1, "status": "failed"}]
            try:
                dcache.update_batch_targets(f"race-{n}", results, runner="r")
                wrote = True
            except dcache.ClaimLost:
                wrote = False
            finished = dcache.finish_batch_job(f"race-{n}")
            seen.append((wrote, None if finished is None else str(finished)))
        out.put(seen)
    finally:
        dcache.close_db()


def test_cancel_racing_a_runner_process(shared_store: str) -> None:
    """The runner process and this one walk the same jobs in the same order, one writing and finishing
    each, the other cancelling it: every job ends finished by the runner or cancelled, never both."""
    for n in range(RACES):
        dcache.create_batch_job(make_job(f"race-{n}", status="running", targets_total=2), make_targets(2))
    assert len(dcache.claim_batch_targets(2 * RACES, runner="r", per_job=2, fair=False)) == 2 * RACES
    go, out = SPAWN.Event(), SPAWN.Queue()
    runner = SPAWN.Process(target=last_writer, args=(shared_store, go, out))
    runner.start()
    go.set()
    cancelled = [dcache.cancel_batch_job(f"race-{n}", reason="raced") for n in range(RACES)]
    seen = out.get(timeout=300)
    runner.join(60)
    assert runner.exitcode == 0
    outcomes = {"cancelled": 0, "finished": 0}
    for n, (was_cancelled, (wrote, finished)) in enumerate(zip(cancelled, seen, strict=True)):
        job, targets = dcache.batch_job(f"race-{n}"), dcache.batch_targets(f"race-{n}")
        assert job is not None and targets is not None
        assert (finished is not None) != was_cancelled, (n, wrote, finished, was_cancelled)
        assert job.targets_done == job.targets_total == 2
        assert all(t.runner is None for t in targets)
        if was_cancelled:
            outcomes["cancelled"] += 1
            assert job.status == "cancelled"
            expected = (
                [("done", "ok", None), ("failed", None, None)] if wrote else [("failed", None, "raced")] * 2
            )
            assert [(t.status, t.result, t.error) for t in targets] == expected, n
        else:
            outcomes["finished"] += 1
            assert wrote and finished == JobStatus.PARTIAL.value and job.status == "partial"
    assert sum(outcomes.values()) == RACES
    assert dcache.check_store().ok
