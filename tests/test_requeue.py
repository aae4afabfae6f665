"""Claims with their own heartbeat: a claim records its runner, its heartbeat and the target's attempts;
renew_claims, release_claims and requeue_stale_claims move only claims, never a job's lease; a stale
claim's target goes back to pending, or fails at its last attempt, counted once; a late write from a
runner whose claim was requeued is refused; a runner killed with SIGKILL loses its targets to another
runner while a client keeps polling, and the job ends done. On every backend."""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any

import pytest
from helpers import count_statements, killed_after_it_reports, make_job, make_targets, snapshot

from sift import dcache
from sift.dcache import db

WAIT_S = 60.0  # how long a test waits for a condition before it fails (never a timing assertion)


def claims(job_id: str = "job-1") -> list[tuple[Any, ...]]:
    return [(t.idx, t.status, t.runner, t.heartbeat, t.attempts) for t in dcache.batch_targets(job_id) or []]


def job_row(job_id: str = "job-1") -> tuple[Any, ...]:
    job = dcache.batch_job(job_id)
    assert job is not None
    return (job.status, job.error, job.lease, job.targets_done, job.nbytes)


def test_a_claim_records_its_runner_heartbeat_and_attempt(store: Any) -> None:
    dcache.create_batch_job(make_job(targets_total=3), make_targets(3))
    claimed = dcache.claim_batch_targets(2, runner="host-a:1", now=2_000)
    assert [(t.idx, t.runner, t.heartbeat, t.attempts) for t in claimed] == [
        (0, "host-a:1", 2_000, 1),
        (1, "host-a:1", 2_000, 1),
    ]
    assert claims() == [
        (0, "running", "host-a:1", 2_000, 1),
        (1, "running", "host-a:1", 2_000, 1),
        (2, "pending", None, None, 0),
    ]


def test_without_a_runner_the_claim_names_this_host_and_process(store: Any) -> None:
    dcache.create_batch_job(make_job(targets_total=1), make_targets(1))
    assert dcache.runner_name() == f"{socket.gethostname()}:{os.getpid()}"
    assert [t.runner for t in dcache.claim_batch_targets(1, now=2_000)] == [dcache.runner_name()]


def test_touching_the_job_never_renews_a_claim_and_renewing_never_moves_the_lease(store: Any) -> None:
    dcache.create_batch_job(make_job(targets_total=2), make_targets(2))
    dcache.claim_batch_targets(2, runner="a", now=2_000)
    dcache.touch_batch_job("job-1", now=2_500)  # the client's poll
    assert [c[3] for c in claims()] == [2_000, 2_000]
    assert dcache.renew_claims("a", now=2_600) == 2
    assert [c[3] for c in claims()] == [2_600, 2_600]
    assert job_row()[2] == 2_500
    # The client's fresh lease does not save a claim whose runner stopped renewing.
    dcache.touch_batch_job("job-1", now=2_700)
    assert dcache.requeue_stale_claims(100, now=2_700) == 2
    assert claims() == [(0, "pending", None, None, 1), (1, "pending", None, None, 1)]
    assert job_row() == ("running", "", 2_700, 0, 0)


def test_renew_counts_only_the_runners_unfinished_claims(store: Any) -> None:
    dcache.create_batch_job(make_job(targets_total=4), make_targets(4))
    dcache.claim_batch_targets(3, runner="a", now=2_000)
    dcache.claim_batch_targets(1, runner="b", now=2_000)
    dcache.update_batch_target("job-1", 0, "done", result="x", runner="a", now=2_001)
    assert dcache.renew_claims("a", now=2_050) == 2
    assert dcache.renew_claims("nobody", now=2_050) == 0
    assert [c[3] for c in claims()] == [2_000, 2_050, 2_050, 2_000]
    assert dcache.stats()["claims_renewed"] == 2


def test_release_gives_the_targets_and_their_attempt_back(store: Any) -> None:
    dcache.create_batch_job(make_job(targets_total=3), make_targets(3))
    dcache.claim_batch_targets(2, runner="a", now=2_000)
    dcache.claim_batch_targets(1, runner="b", now=2_000)
    before = job_row()
    assert dcache.release_claims("a") == 2
    assert claims() == [
        (0, "pending", None, None, 0),
        (1, "pending", None, None, 0),
        (2, "running", "b", 2_000, 1),
    ]
    assert job_row() == before
    assert [t.idx for t in dcache.claim_batch_targets(5, runner="c", now=2_001)] == [0, 1]


@pytest.mark.parametrize(("heartbeat", "requeued"), [(900, True), (901, False)])
def test_stale_means_heartbeat_plus_stale_after_at_most_now(
    store: Any, heartbeat: int, requeued: bool
) -> None:
    dcache.create_batch_job(make_job(targets_total=1), make_targets(1))
    dcache.claim_batch_targets(1, runner="a", now=heartbeat)
    assert [t.idx for t in dcache.stale_claims(100, now=1_000)] == ([0] if requeued else [])
    assert dcache.requeue_stale_claims(100, now=1_000) == int(requeued)
    assert claims()[0][1] == ("pending" if requeued else "running")


@pytest.mark.parametrize(("done_first", "status"), [(True, "partial"), (False, "failed")])
def test_the_last_attempt_fails_the_target_once_and_finishes_the_job(
    store: Any, done_first: bool, status: str
) -> None:
    dcache.create_batch_job(make_job(targets_total=2, lease=1_000), make_targets(2))
    if done_first:
        dcache.claim_batch_targets(1, per_job=1, runner="ok", now=1_000)
        dcache.update_batch_target("job-1", 0, "done", result="abc", runner="ok", now=1_001)
    for attempt in (1, 2, 3):
        now = 1_000 * (attempt + 1)
        assert [t.attempts for t in dcache.claim_batch_targets(5, runner=f"r{attempt}", now=now)] == (
            [attempt] if done_first else [attempt, attempt]
        )
        moved = dcache.requeue_stale_claims(10, max_attempts=3, reason="host lost", now=now + 10)
        assert moved == (1 if done_first else 2)
        finished = attempt == 3
        assert job_row()[0] == (status if finished else "running")
    assert job_row() == (status, "", 4_010, 2, 3 if done_first else 0)
    failed = claims()[1]
    assert failed == (1, "failed", None, None, 3)  # a failure ends the claim: no runner, no heartbeat
    # so the last claimer's late result is refused, not written over the failure
    before = snapshot()
    with pytest.raises(dcache.ClaimLost):
        dcache.update_batch_target("job-1", 1, "done", result="late", runner="r3", now=4_020)
    assert snapshot() == before
    assert dcache.batch_targets("job-1")[1].error == "host lost"  # type: ignore[index]
    # Once final, nothing moves again: not counted twice.
    assert dcache.requeue_stale_claims(0, max_attempts=1, now=9_000) == 0
    assert job_row()[3] == 2
    assert dcache.stats()["targets_failed_stale"] == (1 if done_first else 2)


def test_a_job_whose_stale_targets_all_fail_after_the_rest_were_done_ends_done_only_without_failures(
    store: Any,
) -> None:
    dcache.create_batch_job(make_job(targets_total=1), make_targets(1))
    dcache.claim_batch_targets(1, runner="a", now=1_000)
    assert dcache.requeue_stale_claims(10, max_attempts=2, now=1_010) == 1
    dcache.claim_batch_targets(1, runner="b", now=1_020)
    dcache.update_batch_target("job-1", 0, "done", result="ok", runner="b", now=1_021)
    assert dcache.requeue_stale_claims(0, max_attempts=1, now=5_000) == 0
    assert job_row() == ("running", "", 1_021, 1, 2)  # the runner sets done itself (the docs' runner loop)


def test_a_late_write_of_a_requeued_claim_is_refused_and_changes_nothing(store: Any) -> None:
    dcache.create_batch_job(make_job(targets_total=2), make_targets(2))
    dcache.claim_batch_targets(2, runner="slow", now=1_000)
    dcache.requeue_stale_claims(60, now=1_060)
    before = snapshot()
    with pytest.raises(dcache.ClaimLost, match=r"^runner: 'slow' no longer holds target 0 of job 'job-1'"):
        dcache.update_batch_target("job-1", 0, "done", result="late", runner="slow", now=1_061)
    assert snapshot() == before
    dcache.claim_batch_targets(2, runner="fast", now=1_070)
    dcache.update_batch_target("job-1", 0, "done", result="abc", runner="fast", now=1_071)
    before = snapshot()
    with pytest.raises(dcache.ClaimLost, match=r"now held by 'fast'") as caught:
        dcache.update_batch_target("job-1", 1, "done", result="late", runner="slow", now=1_072)
    assert (caught.value.job_id, caught.value.idx, caught.value.holder) == ("job-1", 1, "fast")
    with pytest.raises(dcache.ClaimLost):  # a finished target is the finisher's too
        dcache.update_batch_target("job-1", 0, "done", result="late", runner="slow", now=1_073)
    assert snapshot() == before
    assert job_row()[3:] == (1, 3)
    assert dcache.stats()["late_writes_refused"] == 3
    # A write without a runner is the client's or the original service's: it is not checked.
    dcache.update_batch_target("job-1", 1, "failed", error="cancelled by hand", now=1_080)
    assert job_row()[3:] == (1 + 1, 3)


def test_a_runners_restart_requeues_its_claims_and_leaves_queued_jobs_alone(store: Any) -> None:
    dcache.create_batch_job(make_job("started", targets_total=3, created_at=1), make_targets(3))
    dcache.create_batch_job(make_job("queued", targets_total=2, created_at=2), make_targets(2))
    (first,) = dcache.claim_batch_targets(1, runner="before-restart", now=1_000)
    (other,) = dcache.claim_batch_targets(1, runner="other", now=1_000)
    # Among many runners, one restarted under its name takes back its own claims, however fresh, each
    # attempt counted (a crash's, as a stale claim's); the other runners' stay theirs.
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as caught:
        dcache.requeue_stale_claims(0, runner="", now=1_001)
    assert caught.value.field == "runner" and snapshot() == before
    with pytest.raises(dcache.InvalidBatchInput) as caught:
        dcache.stale_claims(0, runner="", now=1_001)
    assert caught.value.field == "runner"
    # what it would take back, and only that: stale_claims lists a runner's claims as it takes them
    assert [(t.job_id, t.idx) for t in dcache.stale_claims(0, runner="before-restart", now=1_001)] == [
        ("started", first.idx)
    ]
    assert len(dcache.stale_claims(0, now=1_001)) == 2 and snapshot() == before
    assert dcache.requeue_stale_claims(0, runner="before-restart", now=1_001) == 1
    assert claims("started")[first.idx] == (first.idx, "pending", None, None, 1)
    assert claims("started")[other.idx] == (other.idx, "running", "other", 1_000, 1)
    (again,) = dcache.claim_batch_targets(1, runner="before-restart", now=1_002)
    assert again.attempts == 2
    moved = dcache.requeue_stale_claims(0, runner="before-restart", max_attempts=2, reason="r", now=1_003)
    assert moved == 1 and job_row("started")[3] == 1  # at its last attempt: failed, counted once
    assert claims("started")[again.idx] == (again.idx, "failed", None, None, 2)  # its claim ended
    # A single runner's start: every running target was its previous run's.
    assert dcache.requeue_in_flight(now=1_004) == 1
    assert job_row("started")[0] == "running" and job_row("queued")[0] == "queued"
    assert claims("started")[other.idx] == (other.idx, "pending", None, None, 1)
    # mark_in_flight_failed keeps its contract: every live job fails, queued ones included.
    assert dcache.mark_in_flight_failed("restarted", now=1_002) == 2
    assert job_row("queued")[:2] == ("failed", "restarted")


@pytest.mark.parametrize(
    ("field", "call"),
    [
        ("runner", lambda: dcache.renew_claims("")),
        ("runner", lambda: dcache.release_claims(3)),  # type: ignore[arg-type]
        ("runner", lambda: dcache.claim_batch_targets(1, runner="")),
        ("runner", lambda: dcache.update_batch_target("job-1", 0, "done", runner=b"a")),  # type: ignore[arg-type]
        ("stale_after", lambda: dcache.requeue_stale_claims(-1)),
        ("max_attempts", lambda: dcache.requeue_stale_claims(1, max_attempts=0)),
        ("reason", lambda: dcache.requeue_stale_claims(1, reason=None)),  # type: ignore[arg-type]
        ("now", lambda: dcache.renew_claims("a", now="soon")),  # type: ignore[arg-type]
        ("max_attempts", lambda: dcache.requeue_in_flight(max_attempts=-2)),
    ],
)
def test_bad_input_names_the_field_and_changes_nothing(store: Any, field: str, call: Any) -> None:
    dcache.create_batch_job(make_job(targets_total=2), make_targets(2))
    dcache.claim_batch_targets(1, runner="a", now=1_000)
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as caught:
        call()
    assert caught.value.field == field
    assert snapshot() == before


# -- A runner killed with SIGKILL while its client polls --------------------------------------------------


def _claim_then_hang(target: str, ready: Any) -> None:
    dcache.open_db(target)
    claimed = dcache.claim_batch_targets(3, runner="doomed", now=10_000)
    dcache.update_batch_target("job-1", 0, "done", result="a", runner="doomed", now=10_001)
    dcache.renew_claims("doomed", now=10_002)  # its last heartbeat
    ready.put([t.idx for t in claimed])
    ready.put(os.getpid())
    signal.pause()


STALE_AFTER = 6
RENEW_EVERY = 2


def test_a_requeue_with_no_stale_claim_reads_once_and_writes_nothing(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keeper requeues every round, and most rounds find no stale claim: one read, then no write
    transaction (nor, on PostgreSQL, the claims' turn taken)."""
    dcache.create_batch_job(make_job(targets_total=2), make_targets(2))
    dcache.claim_batch_targets(1, runner="host-a:1", now=2_000)
    before = snapshot()
    seen = count_statements(monkeypatch)
    assert dcache.requeue_stale_claims(60, now=2_059) == 0
    assert len(seen) == 1 and "batch_target" in seen[0], seen
    assert snapshot() == before
    assert dcache.requeue_stale_claims(60, now=2_060) == 1  # stale now: the whole transaction
    assert len(seen) > 2, seen


@pytest.mark.postgres
def test_a_requeue_takes_the_claims_turn_before_it_locks_a_job(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim holds the ring's row while it locks jobs in claim order, and a requeue of stale claims locks
    their jobs in id order: the requeue takes the ring's row first, so that it holds no job a claim could
    wait for while it waits for one the claim holds (a deadlock)."""
    import threading

    import psycopg
    from conftest import POSTGRES_URL, open_empty_postgres

    open_empty_postgres(postgres_schema)
    for job_id in ("a", "b"):
        dcache.create_batch_job(make_job(job_id, targets_total=2, created_at=1), make_targets(2))
    claimed = dcache.claim_batch_targets(2, per_job=1, runner="dead", now=1_000)
    assert sorted((t.job_id, t.idx) for t in claimed) == [("a", 0), ("b", 0)]
    retried: list[BaseException] = []
    retry = db.backend.retry

    def counted(conflict: BaseException, run: Any) -> Any:
        retried.append(conflict)
        return retry(conflict, run)

    monkeypatch.setattr(db.backend, "retry", counted)
    moved: list[int] = []
    requeue = threading.Thread(target=lambda: moved.append(dcache.requeue_stale_claims(60, now=2_000)))
    with psycopg.connect(POSTGRES_URL) as claim:
        claim.execute(f"SET search_path TO {postgres_schema}")
        claim.execute("SELECT 1 FROM batch_claim_ring WHERE id = 0 FOR UPDATE")  # a claim's turn
        claim.execute("SELECT 1 FROM batch_job WHERE id = 'b' FOR UPDATE")  # the job it took from first
        requeue.start()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as watcher:
            blocked, deadline = 0, time.monotonic() + WAIT_S
            while not blocked and requeue.is_alive() and time.monotonic() < deadline:
                row = watcher.execute(  # the requeue's session, waiting for the claim's
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    (claim.info.backend_pid,),
                ).fetchone()
                blocked = row[0] if row else 0
                time.sleep(0.01)
        assert blocked and not moved
        # the claim's next job: the requeue holds no job while it waits, so none is in the claim's way
        claim.execute("SELECT 1 FROM batch_job WHERE id = 'a' FOR UPDATE NOWAIT")
        claim.rollback()
        requeue.join(timeout=60)
    assert moved == [2] and retried == []
    assert [(t.job_id, t.idx) for t in dcache.stale_claims(0)] == []
    assert [(t.status, t.runner) for job_id in ("a", "b") for t in dcache.batch_targets(job_id) or []] == [
        ("pending", None)
    ] * 4


@pytest.mark.slow
def test_a_killed_runners_targets_go_back_while_the_client_polls_and_another_runner_finishes(
    shared_store: str,
) -> None:
    dcache.create_batch_job(make_job(targets_total=5, created_at=1, lease=10_000), make_targets(5))
    claimed = killed_after_it_reports(_claim_then_hang, shared_store)
    assert claimed == [0, 1, 2]

    # Each second: the client polls (touches the job); the survivor renews and requeues on its timers,
    # claims what is pending and writes it. Its clock is given, so the test does not depend on timing.
    back_at = None
    for now in range(10_003, 10_030):
        dcache.touch_batch_job("job-1", now=now)
        if now % RENEW_EVERY == 0:
            dcache.renew_claims("survivor", now=now)
            dcache.requeue_stale_claims(STALE_AFTER, now=now)
        states = {t.idx: (t.status, t.runner) for t in dcache.batch_targets("job-1") or []}
        if back_at is None and all(states[i] != ("running", "doomed") for i in (1, 2)):
            back_at = now
        for target in dcache.claim_batch_targets(10, runner="survivor", now=now):
            dcache.update_batch_target("job-1", target.idx, "done", result="b", runner="survivor", now=now)
        job = dcache.batch_job("job-1")
        assert job is not None and job.lease == now  # the client's poll keeps it alive throughout
        if job.targets_done == job.targets_total:
            dcache.set_batch_job_status("job-1", "done", now=now)
            break
    assert back_at is not None and back_at <= 10_002 + STALE_AFTER + RENEW_EVERY
    assert job_row() == ("done", "", now, 5, 5)
    assert [(t.idx, t.runner, t.attempts) for t in dcache.batch_targets("job-1") or []] == [
        (0, "doomed", 1),
        (1, "survivor", 2),
        (2, "survivor", 2),
        (3, "survivor", 1),
        (4, "survivor", 1),
    ]
    assert db.execute_sql("SELECT COUNT(*) FROM batch_target WHERE status = 'running'").fetchone()[0] == 0


def test_check_store_names_claims_that_break_the_rules(store: Any) -> None:
    dcache.create_batch_job(make_job(targets_total=3), make_targets(3))
    dcache.claim_batch_targets(2, runner="a", now=1_000)
    assert dcache.check_store().ok
    db.execute_sql("UPDATE batch_target SET attempts = 0 WHERE idx = 0")  # running, no attempt counted
    db.execute_sql("UPDATE batch_target SET attempts = -1 WHERE idx = 2")
    report = dcache.check_store()
    assert [(v.kind, v.job_id, v.detail) for v in report.violations] == [
        (
            "target_attempts",
            "job-1",
            "2 targets with attempts below 0, or running for a runner with no attempt",
        )
    ]
