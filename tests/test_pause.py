"""Pause and resume of jobs and callers: each call one transaction that says whether it changed anything;
claims take no pending target of paused work, and take it up again where it stood once resumed."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import make_job, make_targets, snapshot

from sift import dcache


def test_a_job_is_paused_once_and_resumed_once(store: Any) -> None:
    dcache.create_batch_job(make_job("j"), make_targets(3))
    assert dcache.paused_jobs() == []
    assert dcache.pause_batch_job("j", now=1_100) is True
    assert dcache.pause_batch_job("j", now=1_200) is False
    assert dcache.paused_jobs() == ["j"]
    job = dcache.batch_job("j")
    assert job is not None and (job.status, job.lease) == ("queued", 1_000)  # the lease runs on, untouched
    assert dcache.resume_batch_job("j") is True
    assert dcache.resume_batch_job("j") is False
    assert dcache.paused_jobs() == []


def test_a_finished_job_has_nothing_to_pause(store: Any) -> None:
    dcache.create_batch_job(make_job("j"), make_targets(3))
    assert dcache.cancel_batch_job("j", now=1_100)
    before = snapshot()
    assert dcache.pause_batch_job("j") is False
    assert snapshot() == before


def test_an_unknown_job_is_job_not_found(store: Any) -> None:
    before = snapshot()
    for call in (dcache.pause_batch_job, dcache.resume_batch_job):
        with pytest.raises(dcache.JobNotFound) as caught:
            call("nope")
        assert caught.value.field == "job_id"
    assert snapshot() == before


def test_callers_are_paused_before_they_send_anything(store: Any) -> None:
    assert dcache.pause_caller("bob") is True
    assert dcache.pause_caller("bob") is False
    assert dcache.pause_caller("alice") is True
    assert dcache.paused_callers() == ["alice", "bob"]
    assert dcache.resume_caller("bob") is True
    assert dcache.resume_caller("bob") is False
    assert dcache.paused_callers() == ["alice"]


@pytest.mark.parametrize(
    ("call", "args", "field"),
    [
        (dcache.pause_batch_job, (7,), "job_id"),
        (dcache.pause_batch_job, ("",), "job_id"),
        (dcache.resume_batch_job, (None,), "job_id"),
        (dcache.pause_caller, ("",), "caller"),
        (dcache.pause_caller, ("a\x00b",), "caller"),
        (dcache.resume_caller, (b"bob",), "caller"),
        (dcache.pause_caller, ("x" * 2000,), "caller"),
    ],
)
def test_bad_input_names_its_field_and_changes_nothing(store: Any, call: Any, args: Any, field: str) -> None:
    dcache.create_batch_job(make_job("j"), make_targets(3))
    dcache.pause_caller("carol")
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as caught:
        call(*args)
    assert caught.value.field == field
    assert snapshot() == before


# -- Claims skip paused work ------------------------------------------------------------------------------


def add_job(caller: str, name: str, count: int, *, created_at: int = 1) -> str:
    job_id = f"{caller}/{name}"
    dcache.create_batch_job(
        make_job(job_id, caller=caller, targets_total=count, created_at=created_at), make_targets(count)
    )
    return job_id


def keys(targets: list[dcache.BatchTarget]) -> list[tuple[str, int]]:
    return [(t.job_id, t.idx) for t in targets]


@pytest.mark.parametrize("fair", [True, False])
def test_a_paused_job_is_never_claimed_and_resumes_where_it_was(store: Any, fair: bool) -> None:
    add_job("alice", "old", 4, created_at=1)
    add_job("alice", "new", 2, created_at=2)
    assert keys(dcache.claim_batch_targets(1, fair=fair, runner="r", now=5)) == [("alice/old", 0)]
    assert dcache.pause_batch_job("alice/old")
    assert keys(dcache.claim_batch_targets(10, fair=fair, runner="r", now=6)) == [
        ("alice/new", 0),
        ("alice/new", 1),
    ]
    assert dcache.claim_batch_targets(10, fair=fair, runner="r", now=7) == []
    # its running target finishes as it would
    dcache.update_batch_target("alice/old", 0, "done", result="x", runner="r", now=8)
    assert dcache.resume_batch_job("alice/old")
    assert keys(dcache.claim_batch_targets(10, fair=fair, runner="r", now=9)) == [
        ("alice/old", 1),
        ("alice/old", 2),
        ("alice/old", 3),
    ]


def test_a_paused_caller_is_skipped_and_the_ring_goes_on(store: Any) -> None:
    for caller in ("alice", "bob", "carol"):
        add_job(caller, "j", 3)
    assert keys(dcache.claim_batch_targets(1, runner="r", now=5)) == [("alice/j", 0)]
    assert dcache.pause_caller("bob")
    assert keys(dcache.claim_batch_targets(4, runner="r", now=6)) == [
        ("carol/j", 0),
        ("alice/j", 1),
        ("carol/j", 1),
        ("alice/j", 2),
    ]
    add_job("bob", "later", 2, created_at=3)  # a job sent while paused waits too
    assert keys(dcache.claim_batch_targets(10, runner="r", now=7)) == [("carol/j", 2)]
    assert keys(dcache.claim_batch_targets(10, fair=False, runner="r", now=7)) == []
    assert dcache.resume_caller("bob")
    assert keys(dcache.claim_batch_targets(10, runner="r", now=8)) == [
        ("bob/j", 0),
        ("bob/j", 1),
        ("bob/j", 2),
        ("bob/later", 0),
        ("bob/later", 1),
    ]


def test_a_paused_job_still_expires_with_its_lease(store: Any) -> None:
    add_job("alice", "j", 2)
    assert dcache.pause_batch_job("alice/j")
    assert dcache.rescue_stale_jobs(60, "client gone", now=1_000 + 61) == 1
    job = dcache.batch_job("alice/j")
    assert job is not None and job.status == "failed"
    assert dcache.paused_jobs() == []  # a finished job is not listed as paused


# -- Pause and back-off from one process while 4 others claim --------------------------------------------

UNFINISHED = "SELECT COUNT(*) FROM batch_target WHERE status IN ('pending', 'running')"
HELD_HOST = "held.example"


def _claimer(target: str, name: str, barrier: Any) -> dict[str, Any]:
    """Claim in a loop, recording each claim's wall-clock window (before, after) and what it got (caller,
    host); write every result; until nothing is left."""
    import time

    dcache.open_db(target)
    claims: list[tuple[float, float, list[tuple[str, str]]]] = []
    barrier.wait()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        before = time.time()
        got = dcache.claim_batch_targets(2, runner=name)
        after = time.time()
        claims.append((before, after, [(t.job_id.split("/")[0], dcache.url_host(t.url)) for t in got]))
        for t in got:
            time.sleep(0.02)  # a fetch
            dcache.update_batch_target(t.job_id, t.idx, "done", result=name, runner=name)
        if not got:
            if dcache.db.execute_sql(UNFINISHED).fetchone()[0] == 0:
                break
            time.sleep(0.02)
    dcache.close_db()
    return {"claims": claims}


def _operator(target: str, barrier: Any) -> dict[str, Any]:
    """Pause bob, back off the held host for 1.5 s, then resume bob once the others have been served a while;
    record when each call had returned (committed)."""
    import time

    dcache.open_db(target)
    barrier.wait()
    time.sleep(0.2)
    assert dcache.pause_caller("bob")
    paused = time.time()
    until = dcache.back_off_host(HELD_HOST, time.time() + 1.5)
    backed_off = time.time()
    time.sleep(1.0)
    resuming = time.time()
    assert dcache.resume_caller("bob")
    dcache.close_db()
    return {"paused": paused, "resuming": resuming, "backed_off": backed_off, "until": until}


def _worker(kind: str, *args: Any) -> dict[str, Any]:
    return _claimer(*args) if kind == "claimer" else _operator(*args)


@pytest.mark.slow
def test_a_pause_and_a_back_off_hold_for_every_claimer_process(shared_store: str) -> None:
    from helpers import run_processes

    for caller in ("alice", "bob", "carol"):
        urls = [f"https://{caller}-{i % 3}.example/{i}" for i in range(100)]
        urls += [f"https://{HELD_HOST}/{caller}-{i}" for i in range(4)]
        targets = [dcache.BatchTarget(idx=i, url=url, options="{}") for i, url in enumerate(urls)]
        dcache.create_batch_job(make_job(f"{caller}/j", caller=caller, targets_total=len(urls)), targets)
    args: list[tuple[Any, ...]] = [("claimer", shared_store, f"runner-{r}") for r in range(4)]
    args.append(("operator", shared_store))
    reports = run_processes(_worker, args)
    assert not [r for r in reports if "errors" in r], reports
    (times,) = [r for r in reports if "paused" in r]
    claims = [c for r in reports if "claims" in r for c in r["claims"]]
    paused_window = [
        got for before, after, got in claims if times["paused"] < before and after < times["resuming"]
    ]
    held_window = [
        got for before, after, got in claims if times["backed_off"] < before and after < times["until"]
    ]
    assert paused_window and held_window  # claims ran while each held
    assert not [got for got in paused_window if any(caller == "bob" for caller, _ in got)]
    assert not [got for got in held_window if any(host == HELD_HOST for _, host in got)]
    served = {caller for got in paused_window for caller, _ in got}
    assert served == {"alice", "carol"}  # the others kept being served
    dcache.open_db(shared_store)
    assert dcache.db.execute_sql(UNFINISHED).fetchone()[0] == 0  # and bob and the host went on afterwards
    assert dcache.check_store().ok
