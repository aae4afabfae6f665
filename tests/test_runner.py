"""sift.runner.Runner against a real site on 127.0.0.1, on every backend: results, failures and retries
written once each with the right attempts, group commit that drops only a lost claim, a graceful stop
(SIGTERM to runner processes) that leaves no claim held, and a SIGKILLed runner's targets finished by
another runner once its claims go stale."""

from __future__ import annotations

import functools
import itertools
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from conftest import POSTGRES_URL, open_empty_postgres
from docs_pages import block
from helpers import make_job, make_targets, snapshot
from runner_site import fetch, fetch_private, serving

from sift import dcache
from sift.dcache import clock, db
from sift.runner import Backoff, Fail, GiveBack, Retry, Runner
from sift.runner import runner as runner_module
from sift.runner import writer as writer_module
from sift.runner.outcomes import MAX_SECONDS
from sift.runner.writer import Outcome, Writer

SITE_SCRIPT = Path(__file__).with_name("runner_site.py")
WAIT = 60.0  # generous: the machine is shared


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def running(runner: Runner) -> Iterator[Runner]:
    """``runner.run()`` on a thread of its own; stopped (and joined) at the end."""
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        runner.stop(grace=30)
        thread.join(WAIT)
        assert not thread.is_alive()


@contextmanager
def let_go_of(decided: threading.Event) -> Iterator[None]:
    """``decided`` set when the runner lets go of a retry or give-back (its INFO line names each)."""

    class LetGo(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "is held by a newer claim: not put back" in record.getMessage():
                decided.set()

    handler, logger = LetGo(), logging.getLogger("sift.runner")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def submit(urls: list[str], caller: str = "alice") -> str:
    return dcache.submit(caller, urls, idem_key="").job_id


def job_final(job_id: str) -> bool:
    job = dcache.batch_job(job_id)
    return job is not None and job.status in ("done", "partial", "failed")


def running_targets() -> int:
    return int(db.execute_sql("SELECT COUNT(*) FROM batch_target WHERE status = 'running'").fetchone()[0])


def claim_holders() -> set[str]:
    rows = db.execute_sql("SELECT DISTINCT runner FROM batch_target WHERE status = 'running'").fetchall()
    return {str(row[0]) for row in rows}


def held_claims() -> int:
    return int(
        db.execute_sql(
            "SELECT COUNT(*) FROM batch_target WHERE runner IS NOT NULL AND status IN ('pending', 'running')"
        ).fetchone()[0]
    )


def test_a_job_of_every_answer_ends_with_the_right_statuses(store: Any) -> None:
    with serving() as site:
        paths = ["/ok/0", "/missing/1", "/busy/2", "/slow/3", "/ok/4", "/slow/5"]
        job_id = submit([site.base + path for path in paths])
        runner = Runner(fetch, name="r1", concurrency=4, renew_every=0.5, stale_after=30)
        with running(runner):
            wait_for(lambda: job_final(job_id), "the job to finish")
        targets = dcache.batch_targets(job_id) or []
        got = [(t.status, t.attempts, t.error, t.hint) for t in targets]
        assert got == [
            ("done", 1, None, None),
            ("failed", 1, "HTTP 404", "the page is gone"),
            ("done", 2, None, None),
            ("done", 1, None, None),
            ("done", 1, None, None),
            ("done", 1, None, None),
        ]
        pid = os.getpid()
        assert [t.result for t in targets] == [
            f"page /ok/0 by {pid}",
            None,
            f"page /busy/2 by {pid}",
            f"slow /slow/3 by {pid}",
            f"page /ok/4 by {pid}",
            f"slow /slow/5 by {pid}",
        ]
        busy = site.times["/busy/2"]
        assert len(busy) == 2 and busy[1] - busy[0] >= 1.0  # Retry-After: 1, as the site recorded it
        assert all(len(site.times[path]) == 1 for path in paths if path != "/busy/2")
        job = dcache.batch_job(job_id)
        assert job is not None
        assert (job.status, job.targets_done, job.targets_total) == ("partial", 6, 6)
        progress = runner.progress()
        assert (progress.done, progress.failed, progress.retried, progress.lost, progress.running) == (
            5,
            1,
            1,
            0,
            0,
        )
        assert held_claims() == 0
        assert dcache.check_store().ok


def test_retries_back_off_and_the_last_attempt_fails_with_its_error(store: Any) -> None:
    calls: list[tuple[int, int]] = []

    def flaky(target: dcache.BatchTarget) -> str:
        calls.append((int(target.idx), int(target.attempts)))
        if target.idx == 0:
            raise ConnectionResetError("the peer reset it")
        if target.idx == 1 and target.attempts < 3:
            raise Retry("try later")  # the backoff's wait
        return "fine"

    job_id = submit(["https://a.example/0", "https://a.example/1"])
    runner = Runner(
        flaky, concurrency=2, max_attempts=3, backoff=Backoff(first=0.01, jitter=0), renew_every=0.5
    )
    with running(runner):
        wait_for(lambda: job_final(job_id), "the job to finish")
    targets = dcache.batch_targets(job_id) or []
    assert [(t.status, t.attempts, t.error, t.result) for t in targets] == [
        ("failed", 3, "ConnectionResetError: the peer reset it", None),
        ("done", 3, None, "fine"),
    ]
    assert sorted(calls) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    job = dcache.batch_job(job_id)
    assert job is not None and (job.status, job.targets_done) == ("partial", 2)
    assert dcache.check_store().ok


def test_a_host_wide_retry_waits_its_after(store: Any) -> None:
    seen: list[float] = []

    def asked_to_wait(target: dcache.BatchTarget) -> str:
        seen.append(time.time())
        if target.attempts == 1:
            raise Retry("429", after=1, host_wide=True)
        return "ok"

    job_id = submit(["https://a.example/0"])
    with running(Runner(asked_to_wait, concurrency=1, renew_every=0.5)):
        wait_for(lambda: job_final(job_id), "the job to finish")
    assert len(seen) == 2 and seen[1] - seen[0] >= 1.0


def test_a_runner_forgets_each_hosts_wait_once_it_has_ended(store: Any) -> None:
    """Hosts that asked to wait, none of whose targets comes again, are not kept for the runner's life: a
    keeper round after their waits forgets them."""
    hosts = 50
    job_id = submit([f"https://h{i}.example/" for i in range(hosts)])

    def asked_to_wait(target: dcache.BatchTarget) -> str:
        raise Retry("429 Too Many Requests", after=0.01, host_wide=True)

    runner = Runner(asked_to_wait, concurrency=4, max_attempts=1, renew_every=0.2)
    with running(runner):
        wait_for(lambda: job_final(job_id), "the job to fail")
        assert runner.progress().failed == hosts
        wait_for(lambda: not runner._waiting_hosts, "the hosts' waits forgotten")


def test_a_target_given_back_is_fetched_again_with_its_attempt_back(store: Any) -> None:
    seen: list[int] = []

    def not_now(target: dcache.BatchTarget) -> str:
        seen.append(int(target.attempts))
        if len(seen) == 1:
            raise GiveBack("the site's slot has passed")
        return "ok"

    job_id = submit(["https://a.example/0"])
    with running(Runner(not_now, concurrency=1, renew_every=0.5)) as runner:
        wait_for(lambda: job_final(job_id), "the job to finish")
    assert seen == [1, 1]  # the second claim is its first attempt again
    targets = dcache.batch_targets(job_id) or []
    assert [(t.status, t.attempts, t.error) for t in targets] == [("done", 1, None)]
    progress = runner.progress()
    assert (progress.given_back, progress.retried, progress.done) == (1, 0, 1)


@pytest.mark.slow  # waits for a keeper's round
def test_a_claim_whose_answer_was_lost_is_given_back_not_held_while_the_runner_runs(
    store: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim made in the store whose answer never reached the runner (the connection lost as the COMMIT
    was answered): its targets are the runner's, unknown to it. Its keeper gives them back untried at its
    next round, where it renewed them for as long as it ran; each is then fetched once."""
    fetched: list[int] = []
    claim = dcache.claim_batch_targets
    lost: list[int] = []

    def answer_lost_once(limit: int, **request: Any) -> list[dcache.BatchTarget]:
        claimed = claim(limit, **request)
        if claimed and not lost:
            lost.extend(int(target.idx) for target in claimed)
            raise dcache.StoreUnavailable("database: the connection was lost (a test's)")
        return claimed

    def page(target: dcache.BatchTarget) -> str:
        fetched.append(int(target.idx))
        return f"page {target.idx}"

    monkeypatch.setattr(runner_module, "claim_batch_targets", answer_lost_once)
    job_id = submit([f"https://a.example/{i}" for i in range(6)])
    runner = Runner(page, name="w", concurrency=2, renew_every=0.5)
    with caplog.at_level(logging.WARNING, logger="sift.runner"), running(runner):
        wait_for(lambda: job_final(job_id), "the job to finish")
    assert lost and sorted(fetched) == list(range(6))  # each once: the lost claim's after their give-back
    targets = dcache.batch_targets(job_id) or []
    assert [(t.status, t.result, t.attempts) for t in targets] == [("done", f"page {i}", 1) for i in range(6)]
    assert caplog.text.count("was claimed unknown to it: given back") == len(lost)
    assert held_claims() == 0


@pytest.mark.slow  # waits out the writer's wait before it writes again
@pytest.mark.parametrize("answer", ["retry", "give_back"])
def test_an_outcome_sent_again_after_its_answer_was_lost_leaves_the_targets_new_claim_alone(
    store: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, answer: str
) -> None:
    """The store took a retry (or give-back) whose answer was lost (the connection lost as the COMMIT was
    answered); the target, pending at once, is claimed again by the same runner. The writer's second
    sending of that outcome, a moment later, is not made: it would put the target back from under the
    fetch of its new claim. The target is fetched twice, not three times, and ends done at once."""
    monkeypatch.setattr(writer_module, "RETRY_WAIT", 0.1)
    put_back = dcache.retry_batch_targets
    sent: list[int] = []
    claimed_again = threading.Event()  # the target's second fetch has begun
    decided = threading.Event()  # the writer's second sending of the outcome: made, or let go of

    def answer_lost_once(job_id: str, retries: list[dict[str, Any]], **kwargs: Any) -> int:
        sent.extend(retry["idx"] for retry in retries)
        if len(sent) > 1:
            decided.set()
        done = put_back(job_id, retries, **kwargs)
        if len(sent) == 1:  # taken, its answer lost
            raise dcache.StoreUnavailable("database: the connection was lost (a test's)")
        return done

    sending = runner_module._HeldClaims.sending
    sendings: list[int] = []

    def once_claimed_again(held: Any, put_back: list[Outcome]) -> Any:
        sendings.append(len(put_back))
        if len(sendings) > 1:  # the second sending waits for the new claim, whatever the writer's wait
            claimed_again.wait(WAIT)
        return sending(held, put_back)

    attempts: list[int] = []

    def page(target: dcache.BatchTarget) -> str:
        attempts.append(int(target.attempts))
        if len(attempts) == 1:
            raise Retry("503", after=0) if answer == "retry" else GiveBack("not sent by its send_by")
        if len(attempts) == 2:
            claimed_again.set()
            decided.wait(WAIT)  # in flight while the writer would send the first outcome again
        return "page"

    monkeypatch.setattr(writer_module, "retry_batch_targets", answer_lost_once)
    monkeypatch.setattr(runner_module._HeldClaims, "sending", once_claimed_again)
    job_id = submit(["https://a.example/0"])
    runner = Runner(page, name="w", concurrency=1)
    with let_go_of(decided), caplog.at_level(logging.INFO, logger="sift.runner"), running(runner):
        wait_for(lambda: job_final(job_id), "the job to finish")
    assert decided.is_set() and sent == [0]  # sent once: the second sending let go of
    assert attempts == ([1, 2] if answer == "retry" else [1, 1])
    targets = dcache.batch_targets(job_id) or []
    assert [(t.status, t.result, t.attempts) for t in targets] == [("done", "page", attempts[-1])]
    assert runner.progress().lost == 0 and held_claims() == 0


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
@pytest.mark.parametrize("answer", ["retry", "give_back"])
def test_an_outcome_of_a_claim_requeued_as_stale_leaves_the_targets_new_claim_alone(
    store: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, answer: str
) -> None:
    """The runner's claim was requeued as stale while its fetch went on (another runner's keeper took the
    runner for dead), and the runner claimed the target again. The first fetch's retry (or give-back) is
    not sent when it ends: it would put the target back from under the second fetch, which writes the
    result. The target is fetched twice, not three times."""
    put_back = dcache.retry_batch_targets
    sent: list[int] = []
    first_in_flight = threading.Event()
    fetched_again = threading.Event()
    decided = threading.Event()  # the first fetch's outcome: sent, or let go of

    def counted(job_id: str, retries: list[dict[str, Any]], **kwargs: Any) -> int:
        sent.extend(retry["idx"] for retry in retries)
        done = put_back(job_id, retries, **kwargs)
        decided.set()
        return done

    attempts: list[int] = []

    def page(target: dcache.BatchTarget) -> str:
        attempts.append(int(target.attempts))
        if len(attempts) == 1:
            first_in_flight.set()
            fetched_again.wait(WAIT)
            raise Retry("503", after=0) if answer == "retry" else GiveBack("not sent by its send_by")
        fetched_again.set()
        decided.wait(WAIT)  # in flight while the first fetch's outcome is written or let go of
        return "page"

    monkeypatch.setattr(writer_module, "retry_batch_targets", counted)
    job_id = submit(["https://a.example/0"])
    runner = Runner(page, name="w", concurrency=2)
    with let_go_of(decided), caplog.at_level(logging.INFO, logger="sift.runner"), running(runner):
        wait_for(first_in_flight.is_set, "the first fetch")
        assert dcache.requeue_stale_claims(0, runner="w", reason="its runner went quiet") == 1
        wait_for(lambda: job_final(job_id), "the job to finish")
    assert decided.is_set() and sent == []  # let go of, not sent
    assert attempts == [1, 2]
    targets = dcache.batch_targets(job_id) or []
    assert [(t.status, t.result, t.attempts) for t in targets] == [("done", "page", 2)]
    assert runner.progress().lost == 0 and held_claims() == 0


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
def test_the_newest_claims_retry_is_sent_while_a_claim_requeued_as_stale_still_fetches(store: Any) -> None:
    """The runner's claim was requeued as stale while its fetch hangs, and the runner claimed the target
    again; that second fetch answers first, with a retry. It is sent (the newest claim's), so the target is
    fetched a third time and finishes while the first fetch still hangs; that one's late retry then finds
    the target done, and is dropped as a lost claim."""
    first_in_flight = threading.Event()
    hang = threading.Event()
    attempts: list[int] = []

    def page(target: dcache.BatchTarget) -> str:
        attempts.append(int(target.attempts))
        if len(attempts) == 1:
            first_in_flight.set()
            hang.wait(WAIT)
            raise Retry("timed out", after=0)
        if len(attempts) == 2:
            raise Retry("503", after=0)
        return f"page {len(attempts)}"

    job_id = submit(["https://a.example/0"])
    runner = Runner(page, name="w", concurrency=3)
    try:
        with running(runner):
            wait_for(first_in_flight.is_set, "the first fetch")
            assert dcache.requeue_stale_claims(0, runner="w", reason="its runner went quiet") == 1
            wait_for(lambda: job_final(job_id), "the job to finish while the first fetch hangs")
            assert not hang.is_set() and attempts == [1, 2, 3]
            hang.set()
            wait_for(lambda: runner.progress().lost == 1, "the first fetch's retry to be dropped")
    finally:
        hang.set()
    targets = dcache.batch_targets(job_id) or []
    assert [(t.status, t.result, t.attempts) for t in targets] == [("done", "page 3", 3)]
    assert held_claims() == 0


@pytest.mark.slow  # waits out the writer's wait before it writes again
def test_a_result_sent_again_is_written_though_its_target_was_claimed_again(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer holds a result the store could not take (away; nothing written); meanwhile the runner's
    claim was requeued as stale (another runner's keeper) and the runner claims the target again. The
    result in hand is still written (a result puts no target back); the new fetch's retry then finds the
    target done, and is dropped as a lost claim."""
    monkeypatch.setattr(writer_module, "RETRY_WAIT", 0.1)
    write = dcache.update_batch_targets
    failed = threading.Event()  # the first result's write refused
    fetched_again = threading.Event()
    written = threading.Event()  # the result written after the second fetch began

    def away_until_fetched_again(job_id: str, entries: list[dict[str, Any]], **kwargs: Any) -> int:
        if not fetched_again.is_set():
            failed.set()
            raise dcache.StoreUnavailable("database: the server is away (a test's); nothing written")
        count = write(job_id, entries, **kwargs)
        written.set()
        return count

    attempts: list[int] = []

    def page(target: dcache.BatchTarget) -> str:
        attempts.append(int(target.attempts))
        if len(attempts) == 2:
            fetched_again.set()
            written.wait(WAIT)  # in flight while the writer sends the first result again
            raise Retry("503", after=0)
        return f"page {len(attempts)}"

    monkeypatch.setattr(writer_module, "update_batch_targets", away_until_fetched_again)
    job_id = submit(["https://a.example/0"])
    runner = Runner(page, name="w", concurrency=1)
    with running(runner):
        wait_for(failed.is_set, "the first write to be refused")
        assert dcache.requeue_stale_claims(0, runner="w", reason="its runner went quiet") == 1
        wait_for(lambda: job_final(job_id), "the job to finish")
    assert written.is_set() and attempts == [1, 2]
    targets = dcache.batch_targets(job_id) or []
    assert [(t.status, t.result) for t in targets] == [("done", "page 1")]
    assert runner.progress().lost == 1 and held_claims() == 0


def outcomes_of(claim: dcache.BatchTarget | None) -> tuple[Outcome, Outcome]:
    """A retry and a result of target 0 of job ``j``, by ``claim``."""
    retry = Outcome("j", 0, "pending", error="503", claim=claim)
    return retry, Outcome("j", 0, "done", result="p", claim=claim)


@pytest.mark.slow  # the rule's cases; the fast lane holds at most 4,000
@pytest.mark.parametrize(
    ("held", "of", "sent"),
    [
        (2, 0, False),  # a newer claim's fetch says what becomes of the target: not put back from under it
        (2, 1, True),  # the newest claim's own: an older one's fetch, still going on, is no reason to wait
        (1, 0, True),  # its own claim's, the one held
        (3, 1, False),
        (1, None, True),  # a claim that names none
    ],
)
def test_a_put_back_is_sent_unless_a_newer_claim_of_the_runner_holds_its_target(
    held: int, of: int | None, sent: bool, caplog: pytest.LogCaptureFixture
) -> None:
    claims = [dcache.BatchTarget(job="j", idx=0, url="https://x/0", options="{}") for _ in range(held)]
    holder = runner_module._HeldClaims("w")
    holder._claims[("j", 0)] = list(claims)
    retry, _ = outcomes_of(claims[of] if of is not None else None)
    with caplog.at_level(logging.INFO, logger="sift.runner"), holder.sending([retry]) as kept:
        assert kept == ([retry] if sent else [])
    assert ("is held by a newer claim: not put back" in caplog.text) is not sent


@pytest.mark.slow  # the rule's cases; the fast lane holds at most 4,000
@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_settled_outcome_lets_go_of_its_own_claim(order: tuple[int, int]) -> None:
    """Whichever of two claims of a target has its outcome settled first, the other stays held; an outcome
    carried to be written again holds its claim."""
    first, second = (dcache.BatchTarget(job="j", idx=0, url="https://x/0", options="{}") for _ in range(2))
    claims = [first, second]
    holder = runner_module._HeldClaims("w")
    holder._claims[("j", 0)] = list(claims)
    settled, left = (outcomes_of(claims[at])[1] for at in order)
    holder.settled([settled, left], [left])
    assert holder._claims[("j", 0)] == [claims[order[1]]] and holder._claims[("j", 0)][0] is claims[order[1]]
    holder.settled([left], [])
    assert holder.unknown([("j", 0)]) == [("j", 0)]


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
def test_a_round_that_fails_unexpectedly_carries_only_what_it_had_not_settled(store: Any) -> None:
    """The round's put-backs are settled before its results are written; should what follows fail in a way
    the writer did not foresee, only the outcomes not yet settled are carried to be written again (a
    put-back sent a second time could put its target back from under a newer claim)."""
    dcache.create_batch_job(make_job("j", targets_total=2), [dcache.BatchTarget(idx=i, url=f"https://x/{i}",
                            options="{}") for i in range(2)])  # fmt: skip
    dcache.claim_batch_targets(2, runner="w")
    calls: list[list[Outcome]] = []

    def settled(batch: list[Outcome], left: list[Outcome]) -> None:
        calls.append(batch)
        if len(calls) == 2:
            raise RuntimeError("a bug in what settles a round (a test's)")

    writer = Writer("w", lambda name, n: None, settled)
    retry, result = Outcome("j", 0, "pending", error="503"), Outcome("j", 1, "done", result="page")
    assert writer._round([retry, result]) == [result]
    assert calls == [[retry], [result]]


@pytest.mark.slow  # the same round's cases; the fast lane holds at most 4,000
@pytest.mark.parametrize(
    ("sent_again", "next_outcome", "written"),
    [
        (Outcome("j", 0, "done", result="page 1"), Outcome("j", 0, "pending", error="503"), "page 1"),
        (Outcome("j", 0, "done", result="page 1"), Outcome("j", 0, "failed", error="404"), "page 1"),
        (Outcome("j", 0, "failed", error="404"), Outcome("j", 0, "done", result="page 2"), "page 2"),
        (Outcome("j", 0, "done", result="page 1"), Outcome("j", 0, "done", result="page 2"), "page 1"),
    ],
)
def test_a_result_sent_again_beside_its_targets_next_outcome_finishes_it(
    store: Any, sent_again: Outcome, next_outcome: Outcome, written: str
) -> None:
    """A result the writer sends again and the outcome of the target's next claim, in one round: the target
    is finished and the retry is not sent (it would put the target back); of two that finish it, a result
    over a failure, else the one sent first. The other of the two is counted lost."""
    dcache.create_batch_job(
        make_job("j", targets_total=1), [dcache.BatchTarget(idx=0, url="https://x/0", options="{}")]
    )
    dcache.claim_batch_targets(1, runner="w")
    tally: dict[str, int] = {}
    writer = Writer("w", lambda name, n: tally.__setitem__(name, tally.get(name, 0) + n))
    assert writer.write([sent_again, next_outcome]) == []
    targets = dcache.batch_targets("j") or []
    assert [(t.status, t.result) for t in targets] == [("done", written)]
    assert tally.get("lost", 0) == 1 and tally.get("retried", 0) == 0
    job = dcache.batch_job("j")
    assert job is not None and (job.status, job.targets_done) == ("done", 1)


@pytest.mark.slow  # the idle rule's own case; the fast lane holds at most 4,000
def test_a_claim_that_found_nothing_holds_the_next_off_for_the_idle_wait(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a claim that found nothing, a worker looking for work makes no claim until ``IDLE_WAIT`` has
    passed; then the next claim takes a job submitted meanwhile."""
    now = [1_000.0]
    monkeypatch.setattr(runner_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    claims: list[int] = []

    class Counted(runner_module._HeldClaims):
        def claim(self, limit: int, **request: Any) -> list[dcache.BatchTarget]:
            claimed = super().claim(limit, **request)
            claims.append(len(claimed))
            return claimed

    monkeypatch.setattr(runner_module, "_HeldClaims", Counted)
    runner = Runner(lambda target: "page", name="w", concurrency=1)
    runner._writer = Writer("w", lambda name, n: None)
    assert runner._take() is None and claims == [0]
    job_id = submit(["https://a.example/0"])
    now[0] += runner_module.IDLE_WAIT / 2
    assert runner._take() is None and claims == [0]
    assert [t.status for t in dcache.batch_targets(job_id) or []] == ["pending"]
    now[0] += runner_module.IDLE_WAIT / 2
    taken = runner._take()
    assert taken is not None and (taken.job_id, taken.idx) == (job_id, 0) and claims == [0, 1]
    assert [(t.status, t.runner) for t in dcache.batch_targets(job_id) or []] == [("running", "w")]


@pytest.mark.slow  # the flush rule's own cases; the fast lane holds at most 4,000
def test_the_writer_is_told_to_wait_for_no_more_when_nothing_more_can_join_its_round() -> None:
    """With no fetch in flight and no claim under way, the writer waits for no more outcomes once the fetch
    just finished took its wait or longer (the next fetches would too), or when no target waits and no
    claim is to come (the last found nothing a moment ago); else the next claim's outcomes join the round."""
    runner = Runner(lambda target: "page", name="w")
    flushed: list[bool] = []
    runner._writer = Writer("w", lambda name, n: None)
    runner._writer.flush = lambda: flushed.append(True)  # type: ignore[method-assign]
    slow, fast, later = writer_module.WRITE_WAIT, writer_module.WRITE_WAIT / 2, time.monotonic() + 3600
    waiting = dcache.BatchTarget(idx=0, url="https://a.example/0", options="{}")
    for fetched_in, quiet_until, ready, expected in [
        (0.0, 0.0, [], []),
        (fast, 0.0, [], []),
        (slow, 0.0, [], [True]),
        (slow, 0.0, [waiting], [True]),
        (0.0, later, [], [True]),
        (0.0, later, [waiting], []),
    ]:
        flushed.clear()
        runner._busy, runner._quiet_until, runner._ready = 1, quiet_until, deque(ready)
        runner._flush_if_idle(fetched_in=fetched_in)
        assert (runner._busy, flushed) == (0, expected), (fetched_in, quiet_until, ready)


@pytest.mark.slow  # each fetch takes the writer's wait
def test_an_outcome_of_a_fetch_slower_than_the_writers_wait_is_written_at_once(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner whose fetches take the writer's wait or longer has each outcome written at once (the writer
    told so while the next claim is still to be made, or while claimed targets wait), not after its wait."""
    monkeypatch.setattr(writer_module, "WRITE_WAIT", 0.05)
    monkeypatch.setattr(runner_module, "PREFETCH_WINDOW", 10_000.0)  # the second claim takes the rest

    def page(target: dcache.BatchTarget) -> str:
        time.sleep(writer_module.WRITE_WAIT * 1.2)
        return "page"

    runner = Runner(page, name="w", concurrency=1)
    told: list[tuple[bool, int]] = []  # each flush: whether the runner was quiet, and the targets waiting

    class Watched(Writer):
        def flush(self) -> None:
            told.append((runner._stop.is_set() or time.monotonic() < runner._quiet_until, len(runner._ready)))
            super().flush()

    monkeypatch.setattr(runner_module, "Writer", Watched)
    job_id = submit([f"https://a.example/{i}" for i in range(3)])
    with running(runner):
        wait_for(lambda: job_final(job_id), "the job to finish")
    # after the first fetch the next claim was still to come; after the second a claimed target waited
    assert (False, 0) in told and (False, 1) in told, told
    assert [t.status for t in dcache.batch_targets(job_id) or []] == ["done"] * 3


@pytest.mark.slow  # the held claims' second case; the fast lane holds at most 4,000
def test_a_target_claimed_again_beside_its_stale_claim_is_held_until_each_outcome_settles(store: Any) -> None:
    """A claim requeued as stale while its fetch goes on may be made again by its runner: it holds both, so
    after a claim in doubt the keeper's give-back leaves the target to the workers fetching it; each
    outcome settled lets go of its own claim."""
    job_id = submit(["https://a.example/0"])
    runner = Runner(lambda target: "page", name="w")
    held = runner._held
    [first] = held.claim(1, runner="w")
    assert dcache.requeue_stale_claims(0, runner="w", reason="its runner went quiet") == 1
    [second] = held.claim(1, runner="w")
    held.in_doubt = True
    runner_module._give_back_unknown_claims(runner)
    assert held.unknown([(job_id, 0)]) == [] and not held.in_doubt
    assert [(t.status, t.runner) for t in dcache.batch_targets(job_id) or []] == [("running", "w")]
    held.settled([Outcome(job_id, 0, "pending", error="timed out", claim=first)], [])
    assert held._claims[(job_id, 0)][0] is second
    held.settled([Outcome(job_id, 0, "pending", error="timed out", claim=first)], [])  # once only
    assert held._claims[(job_id, 0)][0] is second
    held.settled([Outcome(job_id, 0, "done", result="page", claim=second)], [])
    assert held.unknown([(job_id, 0)]) == [(job_id, 0)]


@pytest.mark.slow  # waits out the claim's pause after an error
def test_a_claim_in_doubt_of_a_target_just_put_back_is_given_back(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's round puts target 0 back and then writes target 1's result, slowly. Meanwhile a worker
    claims target 0 again, and that claim's answer is lost. The round let go of target 0's earlier claim
    before claims went on, so the keeper's next round knows the new claim for one none of the runner's
    claims returned, and gives it back: the job finishes."""
    meet = threading.Barrier(2, timeout=WAIT)
    fetched: list[int] = []

    def page(target: dcache.BatchTarget) -> str:
        fetched.append(int(target.idx))
        if fetched.count(int(target.idx)) == 1:
            meet.wait()  # both first outcomes in one round: the retry of 0 and the result of 1
            if target.idx == 0:
                raise Retry("503", after=0)
        return "page"

    put_back, write = dcache.retry_batch_targets, dcache.update_batch_targets
    claim = dcache.claim_batch_targets
    sent, in_doubt, go_on = threading.Event(), threading.Event(), threading.Event()

    def retry(*args: Any, **kwargs: Any) -> Any:
        done = put_back(*args, **kwargs)
        sent.set()
        return done

    def slow_write(*args: Any, **kwargs: Any) -> Any:
        if sent.is_set():
            go_on.wait(WAIT)  # the round's results, written while claims go on
        return write(*args, **kwargs)

    def answer_lost(limit: int, **kwargs: Any) -> list[dcache.BatchTarget]:
        claimed = claim(limit, **kwargs)
        if sent.is_set() and not in_doubt.is_set() and any(t.idx == 0 for t in claimed):
            in_doubt.set()
            raise dcache.StoreUnavailable("database: the connection was lost (a test's)")
        return claimed

    monkeypatch.setattr(writer_module, "retry_batch_targets", retry)
    monkeypatch.setattr(writer_module, "update_batch_targets", slow_write)
    monkeypatch.setattr(runner_module, "claim_batch_targets", answer_lost)
    job_id = submit(["https://a.example/0", "https://a.example/1"])
    runner = Runner(page, name="w", concurrency=2, renew_every=30)
    try:
        with running(runner):
            wait_for(in_doubt.is_set, "a claim in doubt of target 0 while the round's results are written")
            runner_module._give_back_unknown_claims(runner)  # the keeper's next round, before it renews
            go_on.set()
            wait_for(lambda: job_final(job_id), "the job to finish")
    finally:
        go_on.set()
    assert sorted(fetched) == [0, 0, 1]
    assert [(t.status, t.attempts) for t in dcache.batch_targets(job_id) or []] == [("done", 2), ("done", 1)]
    assert held_claims() == 0


@pytest.fixture
def pg_schema(postgres_schema: str) -> Iterator[str]:
    """The worker's PostgreSQL schema, open and empty; yields its name."""
    open_empty_postgres(postgres_schema)
    yield postgres_schema
    dcache.close_db()


def sessions_blocked_by(pid: int) -> int:
    """How many of the server's sessions wait for a lock session ``pid`` holds."""
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)
        )
        return int(row.fetchone()[0])  # type: ignore[index]


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
@pytest.mark.postgres
@pytest.mark.parametrize(
    ("outcome", "in_doubt"), [("a result", False), ("a retry", False), ("a retry", True)]
)
def test_the_keeper_renews_while_a_call_of_the_writer_waits_on_a_lock(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch, outcome: str, in_doubt: bool
) -> None:
    """A runner's writer writes job a's outcome while another session holds job a's row (an operator's open
    transaction, say), and waits: the keeper goes on renewing the runner's claims meanwhile, job b's (its
    fetch still running) and job a's alike, even with a claim in doubt to make sure of first (its give-back
    waits for the put-backs' round no longer than a quarter of ``renew_every``); once the lock is let go
    of, the write goes on."""
    job_a, job_b = submit(["https://a.example/0"]), submit(["https://b.example/0"])
    fetching, locked, go_on = threading.Semaphore(0), threading.Event(), threading.Event()

    def fetch(target: dcache.BatchTarget) -> str:
        if target.job_id == job_b:
            fetching.release()
            go_on.wait(WAIT)
            return "page b"
        if target.attempts > 1:
            return "page a"
        fetching.release()
        locked.wait(WAIT)  # a claim waits for a job's row it would claim from: claimed first, then locked
        if outcome == "a retry":
            raise Retry("503", after=0)
        return "page a"

    renewed: list[int] = []
    renew = dcache.renew_claims

    def counted_renew(name: str, **kwargs: Any) -> int:
        renewed.append(renew(name, **kwargs))
        return renewed[-1]

    monkeypatch.setattr(runner_module, "renew_claims", counted_renew)
    runner = Runner(fetch, name="w", concurrency=2, renew_every=0.05, stale_after=60)
    try:
        with psycopg.connect(POSTGRES_URL) as other, running(runner):
            other.execute(f'SET search_path TO "{pg_schema}"')
            for _ in range(2):
                assert fetching.acquire(timeout=WAIT), "both targets claimed and fetched"
            other.execute("SELECT 1 FROM batch_job WHERE id = %s FOR UPDATE", (job_a,))
            locked.set()
            wait_for(lambda: sessions_blocked_by(other.info.backend_pid), "the writer to wait on job a")
            runner._held.in_doubt = in_doubt
            before = len(renewed)
            wait_for(lambda: len(renewed) >= before + 3, "three renewals while the writer waits")
            assert sessions_blocked_by(other.info.backend_pid) == 1  # the writer waits yet
            assert renewed[before:] == [2] * (len(renewed) - before)  # both claims, each time
            other.rollback()
            go_on.set()
            wait_for(lambda: job_final(job_a) and job_final(job_b), "both jobs to finish")
    finally:
        locked.set()
        go_on.set()
    results = [(t.status, t.result) for job in (job_a, job_b) for t in dcache.batch_targets(job) or []]
    assert results == [("done", "page a"), ("done", "page b")]
    assert held_claims() == 0


@pytest.mark.slow  # the held claims' third case; the fast lane holds at most 4,000
def test_a_give_back_that_fails_leaves_the_claims_renewed_and_in_doubt(
    store: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The keeper's give-back after a claim in doubt fails (the store still away, say): the round goes on
    to renew the runner's claims, which would go stale otherwise, and the give-back is made again at the
    next round."""
    job_id = submit(["https://a.example/0"])
    runner = Runner(lambda target: "page", name="w")
    runner._held.claim(1, runner="w", now=1_000)

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise dcache.StoreUnavailable("database: the server is away (a test's)")

    monkeypatch.setattr(runner_module, "stale_claims", unavailable)
    runner._held.in_doubt = True
    with caplog.at_level(logging.ERROR, logger="sift.runner"):
        runner_module._keeper_round(runner)
    assert runner._held.in_doubt and "giving back the claims unknown to it failed" in caplog.text
    ((status, heartbeat),) = [(t.status, t.heartbeat) for t in dcache.batch_targets(job_id) or []]
    assert status == "running" and heartbeat is not None and heartbeat > 1_000  # renewed


def test_a_paced_target_its_runner_reaches_after_send_by_is_given_back_unfetched(store: Any) -> None:
    """Every read of this clock is 0.1 s after the last, more than the send window: the claim's paced
    target is always late when the runner comes to it, so it is never fetched, and never costs an attempt."""
    readings = itertools.count()
    previous = clock.set_test_clock(lambda: 2_000_000_000 + next(readings) * 0.1)
    try:
        dcache.set_host_policy("a.example", min_interval=0.001)
        job_id = submit(["https://a.example/0"])
        fetched: list[int] = []

        def fetch_once(target: dcache.BatchTarget) -> str:
            fetched.append(int(target.idx))
            return "ok"

        with running(Runner(fetch_once, concurrency=1, renew_every=0.5)) as runner:
            wait_for(lambda: runner.progress().given_back >= 2, "two give-backs")
    finally:
        clock.set_test_clock(previous)
    assert fetched == []
    (target,) = dcache.batch_targets(job_id) or []
    assert (target.status, target.attempts, target.error) == ("pending", 0, None)
    assert dcache.check_store().ok


def test_allow_private_is_passed_to_fetch(store: Any) -> None:
    with serving() as site:
        job_id = submit([site.base + "/ok/0"])
        with running(Runner(fetch_private, concurrency=1, allow_private=True, renew_every=0.5)):
            wait_for(lambda: job_final(job_id), "the job to finish")
        targets = dcache.batch_targets(job_id) or []
        assert [t.status for t in targets] == ["done"]
        other = submit([site.base + "/ok/1"])
        with running(Runner(fetch_private, concurrency=1, renew_every=0.5)):
            wait_for(lambda: job_final(other), "the job to finish")
        assert [t.error for t in dcache.batch_targets(other) or []] == ["private addresses are not allowed"]


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_allow_private_needs_a_fetch_that_takes_it() -> None:
    """A fetch that cannot be called with ``allow_private=True`` is refused at once, rather than fail every
    target it is given; one that takes any keyword, or whose signature Python cannot read, is not."""
    with pytest.raises(dcache.InvalidBatchInput) as caught:
        Runner(lambda target: "page", allow_private=True)
    assert caught.value.field == "allow_private"
    Runner(fetch_private, allow_private=True)
    Runner(lambda target, **options: "page", allow_private=True)

    @functools.wraps(lambda target: "page")
    def wrapper(target: dcache.BatchTarget, *, allow_private: bool = False) -> str:
        return "page"

    Runner(wrapper, allow_private=True)  # its own signature, not the function it wraps
    Runner(max, allow_private=True)  # no signature to read: the call itself says


def test_what_fetch_says_that_the_store_cannot_hold_fails_or_is_cleaned_for_its_target_alone(
    store: Any,
) -> None:
    """Results the store cannot hold fail their target; errors and hints keep their text, NUL and lone
    surrogates as U+FFFD; the other targets are written and the job finishes, each target counted once."""
    job_id = submit([f"https://a.example/{i}" for i in range(9)])

    seen_errors: list[str | None] = []
    answers = {
        0: b"bytes",
        1: "x" * (dcache.MAX_RESULT_BYTES + 1),
        2: "before\x00after",
        3: "lone \udcff",
        4: "\u00e9t\u00e9",
    }

    def odd(target: dcache.BatchTarget) -> Any:
        idx = int(target.idx)
        if idx == 5:
            raise Fail("bad \x00 page", hint="see \udcff")
        if idx == 6:
            raise Unprintable()
        if idx == 7:
            seen_errors.append(target.error)
            if target.attempts == 1:
                raise ValueError("nul \x00 and \ud800 here")  # retried, with that error as the store keeps it
        return answers.get(idx, "fine")

    with running(Runner(odd, concurrency=3, backoff=Backoff(first=0.01, jitter=0), renew_every=0.5)):
        wait_for(lambda: job_final(job_id), "the job to finish")
    assert seen_errors == [None, "ValueError: nul \ufffd and \ufffd here"]
    targets = dcache.batch_targets(job_id) or []
    assert [(t.status, t.attempts, t.error, t.hint, t.result) for t in targets] == [
        ("failed", 1, "fetch returned bytes, not text", None, None),
        (
            "failed",
            1,
            f"the result is {dcache.MAX_RESULT_BYTES + 1} bytes, over the store's {dcache.MAX_RESULT_BYTES}",
            None,
            None,
        ),
        ("failed", 1, "the result holds a NUL character (\\x00), which no store text may hold", None, None),
        ("failed", 1, "the result is not valid UTF-8 text (it holds a lone surrogate)", None, None),
        ("done", 1, None, None, "\u00e9t\u00e9"),
        ("failed", 1, "bad \ufffd page", "see \ufffd", None),
        ("failed", 3, "Unprintable", None, None),  # retried as any exception, to its last attempt
        ("done", 2, None, None, "fine"),
        ("done", 1, None, None, "fine"),
    ]
    job = dcache.batch_job(job_id)
    assert job is not None and (job.status, job.targets_done) == ("partial", 9)
    assert held_claims() == 0
    assert dcache.check_store().ok


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
def test_the_writer_puts_a_rounds_targets_back_in_one_call_a_job_dropping_only_what_the_store_refuses(
    store: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round's retries and give-backs go to the store in one ``retry_batch_targets`` call for each job. A
    lost claim refuses the call and is dropped (counted lost), as is a retry the store refuses (logged); the
    rest are then sent one a call."""
    for job_id, count in (("a", 3), ("b", 2)):
        targets = [dcache.BatchTarget(idx=i, url=f"https://x/{i}", options="{}") for i in range(count)]
        dcache.create_batch_job(make_job(job_id, targets_total=count), targets)
    dcache.claim_batch_targets(5, runner="r1", now=1_000, fair=False)
    dcache.requeue_stale_claims(10, now=2_000)  # r1's claims went stale
    assert [(t.job_id, t.idx) for t in dcache.claim_batch_targets(1, runner="r2", now=2_001)] == [("a", 0)]
    assert len(dcache.claim_batch_targets(4, runner="r1", now=2_002, fair=False)) == 4
    put_back = dcache.retry_batch_targets
    calls: list[tuple[str, list[int]]] = []

    def counted(job_id: str, retries: list[dict[str, Any]], **kwargs: Any) -> int:
        calls.append((job_id, [retry["idx"] for retry in retries]))
        return put_back(job_id, retries, **kwargs)

    monkeypatch.setattr(writer_module, "retry_batch_targets", counted)
    tally: dict[str, int] = {}
    writer = Writer("r1", lambda name, n: tally.__setitem__(name, tally.get(name, 0) + n))
    outcomes = [
        Outcome("a", 0, "pending", error="503"),  # r2's now
        Outcome("a", 1, "pending", error="503", not_before=3_000),
        Outcome("a", 2, "pending", attempted=False),
        Outcome("b", 0, "pending", error="reset"),
        Outcome("b", 1, "pending", error="reset", not_before=-5),  # a time no target may wait for
    ]
    with caplog.at_level(logging.WARNING, logger="sift.runner"):
        assert writer.write(outcomes) == []
    assert calls == [("a", [0, 1, 2]), ("a", [1]), ("a", [2]), ("b", [0, 1]), ("b", [0])]
    assert "target 1 of job b: retries[1].not_before: " in caplog.text
    assert tally == {"lost": 1, "retried": 2, "given_back": 1}
    states = [
        (t.job_id, t.idx, t.status, t.runner, t.error) for j in "ab" for t in dcache.batch_targets(j) or []
    ]
    assert states == [
        ("a", 0, "running", "r2", None),
        ("a", 1, "pending", None, "503"),
        ("a", 2, "pending", None, None),
        ("b", 0, "pending", None, "reset"),
        ("b", 1, "running", "r1", None),  # never taken: released when the runner stops
    ]


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
@pytest.mark.parametrize(
    ("first_not_before", "tally"),
    [(None, {"retried": 1, "lost": 1}), (-5, {"retried": 1})],
)
def test_a_second_put_back_of_one_target_in_a_round_is_sent_alone_after_the_first(
    store: Any, first_not_before: int | None, tally: dict[str, int]
) -> None:
    """Two put-backs of one target in one round (outcomes that name no claim): the second is sent after the
    first, alone. It finds the claim ended by the first (counted lost), or, the first refused, puts the
    target back itself."""
    job_id = submit(["https://a.example/0"])
    dcache.claim_batch_targets(1, runner="w")
    counted: dict[str, int] = {}
    writer = Writer("w", lambda name, n: counted.__setitem__(name, counted.get(name, 0) + n))
    outcomes = [
        Outcome(job_id, 0, "pending", error="first", not_before=first_not_before),
        Outcome(job_id, 0, "pending", error="second"),
    ]
    assert writer.write(outcomes) == []
    assert counted == tally
    ((status, error),) = [(t.status, t.error) for t in dcache.batch_targets(job_id) or []]
    assert (status, error) == ("pending", "first" if first_not_before is None else "second")


def test_the_writer_drops_only_a_lost_claim_and_fails_only_a_refused_outcome_from_a_group(
    store: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    dcache.create_batch_job(
        make_job("a", targets_total=4),
        [dcache.BatchTarget(idx=i, url=f"https://x/{i}", options="{}") for i in range(4)],
    )
    dcache.claim_batch_targets(4, runner="r1", now=1_000)
    dcache.requeue_stale_claims(10, now=2_000)  # r1's claims went stale
    assert [t.idx for t in dcache.claim_batch_targets(1, runner="r2", now=2_001)] == [0]
    assert [t.idx for t in dcache.claim_batch_targets(3, runner="r1", now=2_002)] == [1, 2, 3]
    tally: dict[str, int] = {}
    writer = Writer("r1", lambda name, n: tally.__setitem__(name, tally.get(name, 0) + n))
    outcomes = [Outcome("a", i, "done", result=f"result {i}") for i in range(3)]
    finishes: list[str] = []

    def finish_fails_once(job_id: str) -> None:  # the store lost between the write and the finish
        finishes.append(job_id)
        if len(finishes) == 1:
            raise dcache.StoreUnavailable("the store is down")
        dcache.finish_batch_job(job_id)

    monkeypatch.setattr(writer_module, "finish_batch_job", finish_fails_once)
    with caplog.at_level(logging.ERROR, logger="sift.runner"):
        # a text no store text may hold: written as it is, the round would be refused for ever; an idx
        # no target has: no write at all
        bad = [Outcome("a", 3, "done", result="nul \x00"), Outcome("a", -1, "done")]
        returned: list[list[Outcome]] = []
        round_ = threading.Thread(target=lambda: returned.append(writer.write(outcomes + bad)), daemon=True)
        round_.start()
        round_.join(WAIT)  # a refusal written again as it is would loop for ever
        assert not round_.is_alive()
        (left,) = returned
    refused = f"results[3].result: {dcache.validation.NUL_PROBLEM}"
    assert refused in caplog.text
    assert "results[4].idx: " in caplog.text
    assert "finishing job a failed" in caplog.text
    assert (left, finishes) == ([], ["a"])  # written: nothing to write again, the keeper finishes it
    targets = dcache.batch_targets("a") or []
    assert [(t.status, t.runner, t.result, t.error) for t in targets] == [
        ("running", "r2", None, None),  # r2's: r1's late write dropped
        ("done", "r1", "result 1", None),
        ("done", "r1", "result 2", None),
        ("failed", None, None, f"the store refused its outcome: {refused}"),
    ]
    assert tally == {"lost": 1, "done": 2, "failed": 1}
    job = dcache.batch_job("a")
    assert job is not None and job.targets_done == 3


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
@pytest.mark.parametrize("lost", ["every claim, its job cancelled", "half, taken by another runner"])
def test_a_round_of_many_lost_claims_is_written_in_calls_linear_in_its_size(
    store: Any, lost: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round of 40 results of one job: after its second lost claim, the rest go one a call (40 + 39 + 38
    entries sent in all, not 40 + 39 + ... as each refusal of the whole call would cost), and every target
    the runner still holds is written."""
    dcache.create_batch_job(make_job("a", targets_total=40), make_targets(40))
    dcache.claim_batch_targets(40, runner="r1", now=1_000)
    if lost.startswith("every"):
        dcache.cancel_batch_job("a", now=1_001)
        held: list[int] = []
    else:
        dcache.requeue_stale_claims(10, now=2_000)
        held = [t.idx for t in dcache.claim_batch_targets(20, runner="r1", now=2_001)]
        assert len(dcache.claim_batch_targets(20, runner="r2", now=2_001)) == 20
    before = snapshot()
    sizes: list[int] = []

    def counted(job_id: str, results: list[dict[str, Any]], **arguments: Any) -> int:
        sizes.append(len(results))
        return dcache.update_batch_targets(job_id, results, **arguments)

    monkeypatch.setattr(writer_module, "update_batch_targets", counted)
    tally: dict[str, int] = {}
    writer = Writer("r1", lambda name, n: tally.__setitem__(name, tally.get(name, 0) + n))
    order = [idx for pair in zip(range(20), range(20, 40), strict=True) for idx in pair]  # lost ones spread
    assert writer.write([Outcome("a", idx, "done", result=f"result {idx}") for idx in order]) == []
    assert sizes == [40, 39] + [1] * 38
    assert tally == ({"lost": 40} if not held else {"lost": 20, "done": 20})
    targets = dcache.batch_targets("a") or []
    if not held:
        assert snapshot() == before
    else:
        assert [(t.status, t.runner, t.result) for t in targets] == [
            ("done", "r1", f"result {t.idx}") if t.idx in held else ("running", "r2", None) for t in targets
        ]
    assert dcache.check_store().ok


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
@pytest.mark.parametrize(
    ("then", "at_call"), [("the store away", 4), ("the store away", 2), ("the job gone", 4)]
)
def test_results_that_meet_an_error_send_again_only_those_neither_written_nor_dropped(
    store: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, then: str, at_call: int
) -> None:
    """Job "a"'s targets 0 and 1 are another runner's now: after their two refusals, r1's results go one a
    call. The second single call (or the second call, after target 0's refusal) meets the store away: the
    round sends again only the results neither written nor dropped yet, and each lost claim is counted once.
    Or the job is gone by then: nothing is sent again, and its finish is not taken for an error."""
    dcache.create_batch_job(make_job("a", targets_total=6), make_targets(6))
    dcache.claim_batch_targets(6, runner="r1", now=1_000)
    dcache.requeue_stale_claims(10, now=2_000)
    assert len(dcache.claim_batch_targets(2, runner="r2", now=2_001)) == 2  # targets 0 and 1
    assert len(dcache.claim_batch_targets(4, runner="r1", now=2_001)) == 4
    calls: list[list[int]] = []

    def away_once(job_id: str, results: list[dict[str, Any]], **arguments: Any) -> int:
        calls.append([entry["idx"] for entry in results])
        if len(calls) == at_call:
            if then == "the store away":
                raise dcache.StoreUnavailable("database: the server is away (a test's)")
            db.execute_sql("DELETE FROM batch_target WHERE job_id = 'a'")
            db.execute_sql("DELETE FROM batch_job WHERE id = 'a'")
        return dcache.update_batch_targets(job_id, results, **arguments)

    monkeypatch.setattr(writer_module, "update_batch_targets", away_once)
    tally: dict[str, int] = {}
    writer = Writer("r1", lambda name, n: tally.__setitem__(name, tally.get(name, 0) + n))
    with caplog.at_level(logging.INFO, logger="sift.runner"):
        left = writer.write([Outcome("a", idx, "done", result=f"result {idx}") for idx in range(6)])
    assert calls[:at_call] == [[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [2], [3]][:at_call]
    assert tally == ({"lost": 2, "done": 1} if at_call == 4 else {"lost": 1})
    if then == "the job gone":
        assert left == [] and dcache.batch_job("a") is None
        assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
        return
    assert [outcome.idx for outcome in left] == ([3, 4, 5] if at_call == 4 else [1, 2, 3, 4, 5])
    assert writer.write(left) == []
    assert tally == {"lost": 2, "done": 4}
    targets = dcache.batch_targets("a") or []
    assert [(t.status, t.runner) for t in targets] == [("running", "r2")] * 2 + [("done", "r1")] * 4


@pytest.mark.parametrize(
    ("field", "arguments"),
    [
        ("fetch", {"fetch": "not callable"}),
        ("concurrency", {"concurrency": 0}),
        ("prefetch", {"prefetch": -1}),
        ("prefetch", {"prefetch": True}),
        ("name", {"name": ""}),
        ("per_host", {"per_host": 0}),
        ("weights", {"weights": {"fleet": 0}}),
        ("stale_after", {"stale_after": -1}),
        pytest.param("stale_after", {"stale_after": 1e10}, marks=pytest.mark.slow),  # over MAX_SECONDS
        ("renew_every", {"renew_every": 60, "stale_after": 60}),
        ("max_attempts", {"max_attempts": 0}),
        ("backoff", {"backoff": 5}),
        ("budget", {"budget": -1}),
        ("sweep_ttl", {"sweep_ttl": float("nan")}),
        ("allow_private", {"allow_private": "yes"}),
        ("fair", {"fair": 1}),
    ],
)
def test_a_runner_refuses_bad_options_naming_them(field: str, arguments: dict[str, Any]) -> None:
    call: dict[str, Any] = {"fetch": fetch, **arguments}
    with pytest.raises(dcache.InvalidBatchInput) as refused:
        Runner(call.pop("fetch"), **call)
    assert refused.value.field == field


@pytest.mark.slow
def test_a_runner_with_the_longest_waits_stops_and_releases_its_claims(store: Any) -> None:
    """``renew_every`` and ``grace`` at ``MAX_SECONDS``, the longest a thread can wait: the stop's waits stay
    within it, and the claims are released."""
    job_id = submit(["https://a.example/0", "https://a.example/1"])
    started, crashed = threading.Event(), []

    def held(target: dcache.BatchTarget) -> str:
        started.set()
        raise GiveBack("not now")

    runner = Runner(held, concurrency=1, stale_after=MAX_SECONDS, renew_every=MAX_SECONDS - 1)

    def run() -> None:
        try:
            runner.run(grace=MAX_SECONDS)
        except BaseException as exc:  # a thread's exception would not fail the test by itself
            crashed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(WAIT)
    runner.stop()
    thread.join(WAIT)
    assert not thread.is_alive() and crashed == []
    assert held_claims() == 0
    assert {t.status for t in dcache.batch_targets(job_id) or []} == {"pending"}


# -- Runner processes ------------------------------------------------------------------------------------


def start_runner(
    store: str, name: str, *, stale_after: float = 30, grace: float = 30
) -> subprocess.Popen[str]:
    paths = [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}
    return subprocess.Popen(
        [sys.executable, str(SITE_SCRIPT), store, name, "4", str(stale_after), "0.5", str(grace)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_runner_processes_stopped_by_sigterm_exit_0_holding_no_claim(shared_store: str) -> None:
    with serving() as site:
        # claimed in idx order: each runner's four workers first take four of the hanging pages
        job_id = submit(
            [f"{site.base}/hang/{i}" for i in range(8)] + [f"{site.base}/slow/{i}" for i in range(8, 80)]
        )
        procs = [start_runner(shared_store, f"p{i}") for i in range(2)]

        def both_fetching() -> bool:  # however long each runner took to start
            return site.asked("/hang/") == 8 and claim_holders() == {"p0", "p1"}

        wait_for(both_fetching, "both runners to be fetching")  # so both run run(), which handles SIGTERM
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        site.release.set()  # the fetches in flight end within the grace
        for proc in procs:
            _, err = proc.communicate(timeout=WAIT)
            assert proc.returncode == 0, err
        assert running_targets() == 0 and held_claims() == 0
        job = dcache.batch_job(job_id)
        assert job is not None and job.status == "running" and 0 < job.targets_done < 80
        # every fetch that ran was written (the grace let the in-flight ones finish): none asked twice yet
        written = {t.url for t in dcache.batch_targets(job_id) or [] if t.status == "done"}
        assert written == {site.base + path for path in site.times}
        with running(Runner(fetch, name="after", concurrency=8, renew_every=0.5)):
            wait_for(lambda: job_final(job_id), "the job to finish")
        targets = dcache.batch_targets(job_id) or []
        assert [t.status for t in targets] == ["done"] * 80
        assert all(len(times) == 1 for times in site.times.values()) and len(site.times) == 80
        job = dcache.batch_job(job_id)
        assert job is not None and (job.status, job.targets_done) == ("done", 80)
        assert dcache.check_store().ok


def killed_holding_fetches(store: str, site: Any, name: str, stale_after: float) -> tuple[str, set[int]]:
    """A job of six targets whose fetches hang, and a runner process ``name`` SIGKILLed while it holds four
    or more of them: the job's id and the targets it held."""
    job_id = submit([f"{site.base}/hang/{i}" for i in range(6)])
    killed = start_runner(store, name, stale_after=stale_after)
    wait_for(lambda: site.asked("/hang/") >= 4, "the runner to hold four fetches")
    killed.kill()
    killed.communicate(timeout=WAIT)
    assert killed.returncode == -signal.SIGKILL
    held = {t.idx for t in dcache.batch_targets(job_id) or [] if t.runner == name}
    assert len(held) >= 4
    return job_id, held


def assert_finished_once_by(job_id: str, held: set[int], runner: str, pid: int) -> None:
    """Every target written once, by ``runner`` in process ``pid``, a second attempt where the killed runner
    held it; the job done and the store sound."""
    targets = dcache.batch_targets(job_id) or []
    assert [(t.status, t.runner, t.result) for t in targets] == [
        ("done", runner, f"hung /hang/{t.idx} by {pid}") for t in targets
    ]
    assert [t.attempts for t in targets] == [2 if t.idx in held else 1 for t in targets]
    job = dcache.batch_job(job_id)
    assert job is not None and (job.status, job.targets_done) == ("done", 6)
    assert dcache.check_store().ok


@pytest.mark.slow
def test_a_sigkilled_runners_targets_are_finished_by_another_after_stale_after(shared_store: str) -> None:
    with serving() as site:
        job_id, held = killed_holding_fetches(shared_store, site, "killed", stale_after=2)
        site.release.set()
        survivor = Runner(fetch, name="survivor", concurrency=4, stale_after=2, renew_every=0.5)
        with running(survivor):
            wait_for(lambda: job_final(job_id), "the survivor to finish the job")
        assert_finished_once_by(job_id, held, "survivor", os.getpid())


@pytest.mark.slow
def test_a_sigkilled_runner_restarted_under_its_name_requeues_its_claims_as_it_starts(
    shared_store: str,
) -> None:
    """A runner restarted under the name it died with (a service's fixed name) finds claims under that name
    that none of its workers hold: it requeues them before its first claim, each attempt counted, where its
    keeper would otherwise renew them for as long as it ran (here stale_after is far longer than the wait)."""
    with serving() as site:
        job_id, held = killed_holding_fetches(shared_store, site, "fixed", stale_after=3_600)
        site.release.set()
        restarted = start_runner(shared_store, "fixed", stale_after=3_600)
        try:
            wait_for(lambda: job_final(job_id), "the restarted runner to finish the job")
        finally:
            restarted.send_signal(signal.SIGTERM)
            _, err = restarted.communicate(timeout=WAIT)
        assert restarted.returncode == 0, err
        assert_finished_once_by(job_id, held, "fixed", restarted.pid)


@pytest.mark.slow
def test_the_docs_runner_runs_until_sigterm(tmp_path: Path) -> None:
    """The README's and the guide's five lines, as a script of their own: they finish a job, then exit 0 on
    SIGTERM."""
    (tmp_path / "app.py").write_text(block("runner"))
    dcache.open_db(tmp_path / "sift.db")
    try:
        with serving() as site:
            job_id = submit([f"{site.base}/ok/0", f"{site.base}/slow/1"])
            proc = subprocess.Popen(
                [sys.executable, "app.py"],
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            wait_for(lambda: job_final(job_id), "the job to finish")
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=WAIT)
            assert proc.returncode == 0, err
            assert [t.result for t in dcache.batch_targets(job_id) or []] == ["page /ok/0", "slow /slow/1"]
            assert held_claims() == 0
    finally:
        dcache.close_db()


def test_the_writer_writes_again_a_round_the_store_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process holds the file's write lock past the busy timeout: the round fails, and is written
    once the lock is gone, each target once, its retry too, its job finished."""
    path = tmp_path / "store.db"
    dcache.open_db(path, timeout=0.2)
    try:
        job_id = submit(["https://a.example/0", "https://a.example/1", "https://a.example/2"])
        assert len(dcache.claim_batch_targets(3, runner="w")) == 3
        tally: dict[str, int] = {}
        writer = Writer("w", lambda name, n: tally.__setitem__(name, tally.get(name, 0) + n))
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        writer.start()
        with caplog.at_level(logging.ERROR, logger="sift.runner"):
            writer.put(Outcome(job_id, 0, "done", result="zero"))
            writer.put(Outcome(job_id, 1, "failed", error="gone"))
            writer.put(Outcome(job_id, 2, "pending", error="busy"))  # a retry: left running, it was lost
            wait_for(lambda: "outcomes failed" in caplog.text, "the refused round")
            wait_for(
                lambda: f"putting back 1 of job {job_id}'s targets failed" in caplog.text, "the refused retry"
            )
        holder.execute("ROLLBACK")
        holder.close()
        wait_for(lambda: held_claims() == 0, "the round written again")
        assert writer.close(WAIT)
        targets = dcache.batch_targets(job_id) or []
        assert [(t.status, t.result, t.error, t.runner) for t in targets] == [
            ("done", "zero", None, "w"),
            ("failed", None, "gone", None),
            ("pending", None, "busy", None),
        ]
        job = dcache.batch_job(job_id)
        assert job is not None and (job.status, job.targets_done) == ("running", 2)
        assert tally == {"done": 1, "failed": 1, "retried": 1}
    finally:
        dcache.close_db()


def test_a_closing_writer_stops_trying_at_its_time_with_more_than_a_round_waiting(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses every round of a closing writer holding more outcomes than one round takes: it
    gives up at the close's time, the runner releasing what it did not write, rather than try for ever."""
    monkeypatch.setattr(writer_module, "RETRY_WAIT", 0.05)
    tries: list[int] = []

    def refused(job_id: str, entries: list[dict[str, Any]], **kwargs: Any) -> int:
        tries.append(len(entries))
        raise dcache.StoreUnavailable("database: every write refused")

    monkeypatch.setattr(writer_module, "update_batch_targets", refused)
    writer = Writer("w", lambda name, n: None)
    for idx in range(writer_module.WRITE_BATCH + 44):
        writer.put(Outcome("job", idx, "done", result="page"))
    writer.start()
    wait_for(lambda: tries, "the first refused round")
    writer.close(0.5)
    writer.thread.join(WAIT)
    assert not writer.thread.is_alive()
    assert all(size == writer_module.WRITE_BATCH for size in tries)


@contextmanager
def locked_as_it_stops(path: Path, grace: float) -> Iterator[tuple[Runner, threading.Event]]:
    """A runner of two workers whose fetches return once another process's connection has taken the file's
    write lock, which then stops it with ``grace``. Yields the runner, not yet run, and an event that ends
    the lock when set."""
    locked, unlock = threading.Event(), threading.Event()
    runner = Runner(
        lambda target: "page" if locked.wait(WAIT) else "", name="w", concurrency=2, renew_every=0.5
    )

    def hold() -> None:
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            wait_for(lambda: runner.progress().running == 2, "two fetches")
            holder.execute("BEGIN IMMEDIATE")
            locked.set()
            runner.stop(grace=grace)
            unlock.wait(WAIT)
            holder.execute("ROLLBACK")
        finally:
            holder.close()

    holding = threading.Thread(target=hold, daemon=True)
    holding.start()
    try:
        yield runner, unlock
    finally:
        unlock.set()
        holding.join(WAIT)


@pytest.mark.slow
def test_a_stopping_runner_writes_its_results_once_the_store_is_back_within_the_grace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store refuses the stopping runner's round (another process holds the write lock past the busy
    timeout): the writer writes it again once the lock is gone, within the grace, each target once, and no
    claim is left."""
    path = tmp_path / "store.db"
    dcache.open_db(path, timeout=0.2)
    try:
        job_id = submit(["https://a.example/0", "https://a.example/1"])
        with (
            caplog.at_level(logging.ERROR, logger="sift.runner"),
            locked_as_it_stops(path, grace=WAIT) as (runner, unlock),
        ):
            thread = threading.Thread(target=runner.run, daemon=True)
            thread.start()
            # the first refusal may come before the stop reaches the writer; the second is while it stops
            wait_for(lambda: caplog.text.count("outcomes failed") >= 2, "the round refused twice")
            unlock.set()
            thread.join(WAIT)
        assert not thread.is_alive()
        targets = dcache.batch_targets(job_id) or []
        assert [(t.status, t.result, t.attempts) for t in targets] == [("done", "page", 1)] * 2
        assert held_claims() == 0 and job_final(job_id)
    finally:
        dcache.close_db()


@pytest.mark.slow
def test_a_runner_whose_claims_cannot_be_released_raises_and_puts_the_sigterm_handler_back(
    tmp_path: Path,
) -> None:
    """The store refuses the stopping runner's writes, and the release of its claims after the writer's
    last try: ``run`` raises the store's error, with the SIGTERM handler it found put back; the claims are
    left held, to go stale."""
    path = tmp_path / "store.db"
    dcache.open_db(path, timeout=0.2)
    try:
        job_id = submit(["https://a.example/0", "https://a.example/1"])
        previous = signal.getsignal(signal.SIGTERM)
        with locked_as_it_stops(path, grace=0) as (runner, _):
            with pytest.raises(dcache.StoreUnavailable):
                runner.run()  # on pytest's main thread: it sets a SIGTERM handler
            # the writer's last try may still wait on the lock: it must end before the lock does
            for thread in threading.enumerate():
                if thread.name == "sift-writer w":
                    thread.join(WAIT)
        assert signal.getsignal(signal.SIGTERM) is previous
        targets = dcache.batch_targets(job_id) or []
        assert [(t.status, t.runner) for t in targets] == [("running", "w")] * 2
    finally:
        dcache.close_db()


@pytest.mark.slow
def test_a_runners_take_back_of_earlier_claims_is_tried_again_while_the_store_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process holds the file's write lock past the busy timeout as a runner starts: its take-back
    of an earlier run's claims fails, and is made again once the lock is gone; then the runner works."""
    path = tmp_path / "store.db"
    dcache.open_db(path, timeout=0.2)
    try:
        job_id = submit(["https://a.example/0", "https://a.example/1"])
        assert len(dcache.claim_batch_targets(2, runner="w")) == 2  # the earlier run's, which died
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        runner = Runner(lambda target: f"page {target.idx}", name="w", concurrency=2, renew_every=0.5)
        with caplog.at_level(logging.ERROR, logger="sift.runner"), running(runner):
            wait_for(
                lambda: "requeueing an earlier run's claims failed" in caplog.text, "the refused take-back"
            )
            holder.execute("ROLLBACK")
            holder.close()
            wait_for(lambda: job_final(job_id), "the job to finish")
        targets = dcache.batch_targets(job_id) or []
        assert [(t.status, t.result, t.attempts) for t in targets] == [
            ("done", "page 0", 2),
            ("done", "page 1", 2),
        ]
    finally:
        dcache.close_db()


def test_run_on_the_main_thread_stops_on_sigterm_and_puts_the_handler_back(
    store: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its idle worker, waiting for work when the SIGTERM comes, ends at once: the stop wakes it (with an
    idle wait of an hour, it would still be waiting when the grace ran out)."""
    monkeypatch.setattr(runner_module, "IDLE_WAIT", 3600.0)
    caplog.set_level(logging.WARNING, logger="sift.runner")
    job_id = submit(["https://a.example/0"])
    previous = signal.getsignal(signal.SIGTERM)
    runner = Runner(lambda target: "fetched", concurrency=1, renew_every=0.5)

    def terminate() -> None:  # once the job is done, and only once run() handles SIGTERM
        wait_for(lambda: job_final(job_id) and signal.getsignal(signal.SIGTERM) is not previous, "run()")
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=terminate, daemon=True)
    sender.start()
    runner.run(grace=5)  # on pytest's main thread: returns once the SIGTERM stopped it
    sender.join(WAIT)
    assert signal.getsignal(signal.SIGTERM) is previous
    assert [t.result for t in dcache.batch_targets(job_id) or []] == ["fetched"]
    assert held_claims() == 0
    assert "still running after the grace" not in caplog.text
