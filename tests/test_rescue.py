"""rescue_stale_jobs: a live job whose lease is stale_after old is failed, whole, its targets as they are;
a job with a fresh lease never is, even while another process refreshes it; a killed claimer's job is
rescued with exact counts; a late result on a rescued job is stored and counted, and the job stays failed."""

from __future__ import annotations

import datetime
import math
import os
import random
import signal
import time
from typing import Any

import pytest
from helpers import SPAWN, killed_after_it_reports, make_job, make_targets, refuse_each, run_processes

from sift import dcache
from sift.dcache import db

STATUSES = ["queued", "running", "done", "partial", "failed", "cancelled"]


def jobs() -> dict[str, tuple[Any, ...]]:
    rows = db.execute_sql("SELECT id, status, error, lease, targets_done, nbytes FROM batch_job").fetchall()
    return {row[0]: row[1:] for row in rows}


def targets() -> list[tuple[Any, ...]]:
    return sorted(db.execute_sql("SELECT * FROM batch_target").fetchall(), key=repr)


@pytest.mark.parametrize("status", STATUSES)
def test_only_stale_live_jobs_fail(store: Any, status: str) -> None:
    # now 1000, stale_after 100: a lease of 900 or less is stale, 901 is not.
    dcache.create_batch_job(make_job("stale", status=status, error="before", lease=900), make_targets(3))
    dcache.create_batch_job(make_job("fresh", status=status, error="before", lease=901), make_targets(3))
    before, targets_before = jobs(), targets()
    live = status in ("queued", "running")
    assert dcache.rescue_stale_jobs(100, "runner lost", now=1_000) == int(live)
    after = jobs()
    assert after["fresh"] == before["fresh"]
    expected = ("failed", "runner lost", 1_000, 0, 0) if live else before["stale"]
    assert after["stale"] == expected
    assert targets() == targets_before
    assert dcache.stats()["jobs_rescued"] == int(live)


@pytest.mark.parametrize(
    ("stale_after", "rescued"),
    [
        (100, {"a", "b"}),
        (100.5, {"a"}),  # lease + 100.5 <= 1000: lease <= 899
        (datetime.timedelta(seconds=100), {"a", "b"}),
        (datetime.timedelta(seconds=100, microseconds=1), {"a"}),
        (0, {"a", "b", "c"}),
        (10**6, set()),
    ],
)
def test_stale_after_takes_what_ttl_takes(store: Any, stale_after: Any, rescued: set[str]) -> None:
    for job_id, lease in (("a", 899), ("b", 900), ("c", 1_000)):
        dcache.create_batch_job(make_job(job_id, status="running", lease=lease))
    assert dcache.rescue_stale_jobs(stale_after, "gone", now=1_000) == len(rescued)
    assert {job_id for job_id, row in jobs().items() if row[0] == "failed"} == rescued


def test_targets_and_counts_stay_as_stored(store: Any) -> None:
    # The seed's restart rule: the whole job fails; running targets stay running and count nothing.
    dcache.create_batch_job(make_job("job", status="queued", targets_total=4, lease=10), make_targets(4))
    claimed = dcache.claim_batch_targets(3, now=20)
    assert [t.idx for t in claimed] == [0, 1, 2]
    dcache.update_batch_target("job", 0, "done", result="abc", now=21)
    dcache.update_batch_target("job", 1, "failed", error="timeout", now=22)
    targets_before = targets()
    assert dcache.rescue_stale_jobs(60, "runner lost", now=82) == 1
    assert jobs()["job"] == ("failed", "runner lost", 82, 2, 3)
    assert targets() == targets_before
    assert [t.status for t in dcache.batch_targets("job") or []] == ["done", "failed", "running", "pending"]
    assert dcache.claim_batch_targets(10, now=83) == []  # a failed job's pending target is never claimed
    assert dcache.rescue_stale_jobs(0, "again", now=10**6) == 0  # failed is not live: once only


def test_a_late_result_on_a_rescued_job_is_stored_and_the_job_stays_failed(store: Any) -> None:
    # A slow runner that was not dead writes after the rescue: update_batch_target never looks at the
    # job's status, so the result is stored and counted once, the lease moves, and the job stays failed.
    dcache.create_batch_job(make_job("job", status="queued", targets_total=2, lease=10), make_targets(2))
    dcache.claim_batch_targets(2, now=10)
    assert dcache.rescue_stale_jobs(30, "runner lost", now=100) == 1
    dcache.update_batch_target("job", 1, "done", result="é" * 4, now=105)
    assert jobs()["job"] == ("failed", "runner lost", 105, 1, 8)
    dcache.update_batch_target("job", 1, "done", result="é" * 4, now=106)  # a repeat counts nothing more
    assert jobs()["job"] == ("failed", "runner lost", 106, 1, 8)
    assert dcache.batch_nbytes() == 8
    assert dcache.rescue_stale_jobs(0, "again", now=10**6) == 0


BAD_INPUT = [
    ("stale_after", lambda: dcache.rescue_stale_jobs(-1, "r", now=5)),
    ("stale_after", lambda: dcache.rescue_stale_jobs(math.nan, "r", now=5)),
    ("stale_after", lambda: dcache.rescue_stale_jobs(math.inf, "r", now=5)),
    ("stale_after", lambda: dcache.rescue_stale_jobs("60", "r", now=5)),  # type: ignore[arg-type]
    ("stale_after", lambda: dcache.rescue_stale_jobs(None, "r", now=5)),  # type: ignore[arg-type]
    ("stale_after", lambda: dcache.rescue_stale_jobs(datetime.timedelta(seconds=-1), "r", now=5)),
    ("reason", lambda: dcache.rescue_stale_jobs(60, None, now=5)),  # type: ignore[arg-type]
    ("reason", lambda: dcache.rescue_stale_jobs(60, "a\x00b", now=5)),
    ("reason", lambda: dcache.rescue_stale_jobs(60, "\ud800", now=5)),
    ("now", lambda: dcache.rescue_stale_jobs(60, "r", now=-1)),
    ("now", lambda: dcache.rescue_stale_jobs(60, "r", now=True)),
]


def test_bad_input_names_the_field_and_changes_nothing(store: Any) -> None:
    dcache.create_batch_job(make_job("a", status="running", lease=0), make_targets(3))
    refuse_each((f"{field} #{i}", call, field) for i, (field, call) in enumerate(BAD_INPUT))


# -- A fresh lease is never rescued, while another process refreshes it -------------------------------------

JOBS = 1_200
RESCUE_NOW = 90_000  # every rescue's now (and so the lease it sets)
TOUCH_NOW = 100_000  # every refresh's now: fresher than any rescue's cutoff


TOUCHERS = 4
TOUCHES = TOUCHERS * (JOBS // 4)


def _rescue_or_touch(kind: str, target: str, seed: int, touches: Any, barrier: Any) -> dict[str, Any]:
    dcache.open_db(target)
    rng = random.Random(seed)
    errors: list[str] = []
    touched: list[str] = []
    rescued = 0
    barrier.wait()
    if kind == "rescue":
        # The cutoff climbs through the old leases (1..JOBS) in steps, so jobs become stale one band at a
        # time while the refreshers run, and the last calls find every untouched job stale. A step waits
        # (a while at most) for the refreshers to have done their share so far: on a busy machine the
        # rescues would otherwise run to the end before a refresher is scheduled at all.
        cutoffs = [*range(0, JOBS + 1, 15), JOBS]
        deadline = time.monotonic() + 120
        for step, cutoff in enumerate(cutoffs):
            while touches.value < TOUCHES * step // (2 * len(cutoffs)) and time.monotonic() < deadline:
                time.sleep(0.001)
            try:
                rescued += dcache.rescue_stale_jobs(RESCUE_NOW - cutoff, "host lost", now=RESCUE_NOW)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    else:
        for i in rng.sample(range(JOBS), JOBS // 4):
            try:
                dcache.touch_batch_job(f"job-{i:04d}", now=TOUCH_NOW)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            touched.append(f"job-{i:04d}")
            with touches.get_lock():
                touches.value += 1
    dcache.close_db()
    return {"errors": errors, "touched": touched, "rescued": rescued}


@pytest.mark.slow
def test_a_refreshed_job_is_never_rescued(shared_store: str) -> None:
    for i in range(JOBS):
        status = "running" if i % 2 else "queued"
        dcache.create_batch_job(make_job(f"job-{i:04d}", status=status, lease=i + 1, targets_total=1))
    touches = SPAWN.Value("i", 0)
    reports = run_processes(
        _rescue_or_touch,
        [("rescue", shared_store, s, touches) for s in range(4)]
        + [("touch", shared_store, s, touches) for s in range(TOUCHERS)],
    )
    assert [r["errors"] for r in reports] == [[]] * 8
    touched = {job for r in reports for job in r["touched"]}
    after = jobs()
    # A rescue that failed a job after its refresh would have left the rescue's lease on it; a job rescued
    # before its refresh has the refresh's lease (touch_batch_job sets it whatever the status).
    assert {job for job in touched if after[job][2] == RESCUE_NOW} == set()
    assert {job for job in touched if after[job][0] != "failed"} == {
        job for job, row in after.items() if row[0] != "failed"
    }
    for job, (status, error, lease, *_) in after.items():
        if job not in touched:
            assert (status, error, lease) == ("failed", "host lost", RESCUE_NOW)
        elif status == "failed":
            assert (error, lease) == ("host lost", TOUCH_NOW)  # rescued first, refreshed after
        else:
            assert lease == TOUCH_NOW
    failed = sum(row[0] == "failed" for row in after.values())
    assert sum(r["rescued"] for r in reports) == failed  # each job rescued exactly once
    assert len(touched) > 0 and failed < JOBS
    assert any(after[job][0] != "failed" for job in touched)  # some refresh came before its rescue


# -- A claimer killed with SIGKILL ---------------------------------------------------------------------------


def _claim_then_hang(target: str, ready: Any) -> None:
    """A runner: claims 4 targets of the oldest job, writes results for 2, then hangs until killed."""
    dcache.open_db(target)
    claimed = dcache.claim_batch_targets(4, now=1_000)
    for t in claimed[:2]:
        dcache.update_batch_target(t.job_id, t.idx, "done", result="r" * (t.idx + 1), now=1_001)
    ready.put([(t.job_id, t.idx) for t in claimed])
    ready.put(os.getpid())
    while True:
        signal.pause()


def test_a_killed_claimers_job_is_rescued_with_exact_counts(shared_store: str) -> None:
    dcache.create_batch_job(make_job("dead-host", targets_total=6, created_at=1, lease=900), make_targets(6))
    dcache.create_batch_job(make_job("live-host", targets_total=2, created_at=2, lease=900), make_targets(2))
    claimed = killed_after_it_reports(_claim_then_hang, shared_store)
    assert claimed == [("dead-host", i) for i in range(4)]

    # Another host goes on: it claims and heartbeats its own job while the dead one's lease ages.
    assert [(t.job_id, t.idx) for t in dcache.claim_batch_targets(10, now=1_500)] == [
        ("dead-host", 4),
        ("dead-host", 5),
        ("live-host", 0),
        ("live-host", 1),
    ]
    # The survivor's result on the dead host's job is that job's heartbeat too: it stays fresh 60 s more.
    dcache.update_batch_target("dead-host", 4, "done", result="xyz", now=1_510)
    dcache.touch_batch_job("live-host", now=1_550)  # a slow fetch's heartbeat
    assert dcache.rescue_stale_jobs(60, "host lost", now=1_560) == 0  # both leases are fresh
    assert dcache.rescue_stale_jobs(60, "host lost", now=1_600) == 1
    after = jobs()
    assert after["dead-host"] == ("failed", "host lost", 1_600, 3, 1 + 2 + 3)
    assert after["live-host"][:3] == ("running", "", 1_550)
    statuses = {(row[0], row[1]): row[4] for row in targets()}
    assert [statuses["dead-host", i] for i in range(6)] == [
        "done",
        "done",
        "running",
        "running",
        "done",
        "running",
    ]
    assert dcache.batch_nbytes() == 6
    assert dcache.claim_batch_targets(10, now=1_700) == []
