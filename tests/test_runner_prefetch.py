"""How a Runner claims and writes, pinned by what it does: a claim takes the free workers' count plus what
they started in ``PREFETCH_WINDOW`` at most ``prefetch`` more, so a batch of instant fetches takes few
claims and slow fetches claim no further ahead than the workers; claimed targets waiting are held by the
runner (renewed, released on stop); the writer does not wait for more once nothing is in flight."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import make_job, make_targets
from test_runner import WAIT, held_claims, job_final, running, running_targets, wait_for

from sift import dcache
from sift.runner import Retry, Runner
from sift.runner import runner as runner_module
from sift.runner import writer as writer_module

CONCURRENCY = 16


def counted_claims(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every claim the runner makes from now on: (its limit, how many it took)."""
    claims: list[tuple[int, int]] = []
    claim = dcache.claim_batch_targets

    def counting(limit: int, **kwargs: Any) -> list[dcache.BatchTarget]:
        taken = claim(limit, **kwargs)
        claims.append((limit, len(taken)))
        return taken

    monkeypatch.setattr(runner_module, "claim_batch_targets", counting)
    return claims


def submit_job(job_id: str, targets: int) -> None:
    dcache.create_batch_job(make_job(job_id, targets_total=targets), make_targets(targets))


def instant(target: dcache.BatchTarget) -> str:
    return f"result {target.idx}"


def test_instant_fetches_take_few_claims_and_few_rounds(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a window no pace falls short of, however busy the machine: the claim after the first takes the most
    monkeypatch.setattr(runner_module, "PREFETCH_WINDOW", 10_000.0)
    # a writer that would wait a minute for more: it writes a round when it is full or when nothing more is
    # on its way; a worker that finished the last claimed target claims next, so more is on its way then
    monkeypatch.setattr(writer_module, "WRITE_WAIT", 60.0)
    claims = counted_claims(monkeypatch)
    rounds: list[int] = []
    write = dcache.update_batch_targets

    def counted(job_id: str, entries: list[dict[str, Any]], **kwargs: Any) -> int:
        rounds.append(len(entries))
        return write(job_id, entries, **kwargs)

    monkeypatch.setattr(writer_module, "update_batch_targets", counted)
    submit_job("big", 1000)
    with running(Runner(instant, name="r", concurrency=CONCURRENCY)):
        wait_for(lambda: job_final("big"), "the job to finish")
    taken = [took for _, took in claims if took]
    assert sum(taken) == 1000
    # the first claim: the free workers; each later one up to CONCURRENCY + PREFETCH (272): 16 + 4 * 272
    assert taken[0] == CONCURRENCY and len(taken) <= 5, claims
    assert all(limit <= CONCURRENCY + runner_module.PREFETCH for limit, _ in claims), claims
    # each claim's tail waits for the next claim's outcomes: only the last round is short
    full = writer_module.WRITE_BATCH
    assert rounds == [full] * (1000 // full) + [1000 % full], rounds
    targets = dcache.batch_targets("big") or []
    assert [t.result for t in targets] == [f"result {i}" for i in range(1000)]
    assert {t.attempts for t in targets} == {1}


def test_slow_fetches_claim_no_further_ahead_than_the_free_workers(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a window every pace falls short of: nothing is claimed ahead
    monkeypatch.setattr(runner_module, "PREFETCH_WINDOW", 1e-12)
    claims = counted_claims(monkeypatch)
    submit_job("slow", 60)
    with running(Runner(instant, name="r", concurrency=4)):
        wait_for(lambda: job_final("slow"), "the job to finish")
    assert sum(took for _, took in claims) == 60
    assert all(limit <= 4 for limit, _ in claims), claims


@pytest.mark.slow
def test_slow_fetches_that_end_together_claim_no_further_ahead_than_the_free_workers(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fetches of a second or more that end at one moment (a site whose every answer takes as long): four
    workers start none in ``PREFETCH_WINDOW`` at that time a fetch, so no claim takes beyond the free
    workers, however soon after one another the workers come to claim."""
    claims = counted_claims(monkeypatch)
    submit_job("together", 12)
    together = threading.Barrier(4, timeout=10)

    def fetch(target: dcache.BatchTarget) -> str:
        time.sleep(1.0)
        with contextlib.suppress(threading.BrokenBarrierError):  # a round of fewer: they end as they come
            together.wait()
        return "ok"

    with running(Runner(fetch, name="r", concurrency=4)):
        wait_for(lambda: job_final("together"), "the job to finish")
    assert sum(took for _, took in claims) == 12
    assert all(limit <= 4 for limit, _ in claims), claims


def test_prefetch_0_claims_only_for_free_workers(file_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "PREFETCH_WINDOW", 10_000.0)
    claims = counted_claims(monkeypatch)
    submit_job("none", 40)
    with running(Runner(instant, name="r", concurrency=4, prefetch=0)):
        wait_for(lambda: job_final("none"), "the job to finish")
    assert all(limit <= 4 for limit, _ in claims), claims


def blocking_after(first: int, release: threading.Event) -> Callable[[dcache.BatchTarget], str]:
    """A fetch that returns at once for idx below ``first``, then waits for ``release``."""

    def fetch(target: dcache.BatchTarget) -> str:
        if target.idx >= first and not release.wait(WAIT):
            raise AssertionError("never released")
        return "ok"

    return fetch


def test_a_runner_holds_at_most_concurrency_plus_prefetch_and_releases_them_on_stop(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "PREFETCH_WINDOW", 10_000.0)
    submit_job("held", 200)
    release = threading.Event()
    runner = Runner(blocking_after(30, release), name="r", concurrency=4, prefetch=10, renew_every=0.2)
    with running(runner):
        wait_for(lambda: runner.progress().running == 4, "every worker to wait in its fetch")
        # the workers' targets and what waits for them: at most concurrency + prefetch, however long
        for _ in range(5):
            assert running_targets() <= 4 + 10
            threading.Event().wait(0.1)
        waiting = running_targets() - 4
        assert waiting > 0  # claimed ahead, held under the runner's name and renewed by its keeper
        renewed = dcache.renew_claims("r")
        assert renewed == running_targets()
        runner.stop(grace=0)  # the fetches in flight are abandoned at once; the rest is released
        release.set()
    assert held_claims() == 0 and running_targets() == 0
    targets = dcache.batch_targets("held") or []
    pending = [t for t in targets if t.status == "pending"]
    assert pending and all(t.attempts == 0 for t in pending)  # the attempts of released claims given back


def test_the_writer_writes_full_rounds_and_the_last_outcome_at_once_and_a_refused_round_again(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a writer that would wait a minute for more: a full round is written when it is full, the runner's
    # last outcome when nothing is in flight; the first round the store refuses is written again, first
    monkeypatch.setattr(writer_module, "WRITE_WAIT", 60.0)
    monkeypatch.setattr(writer_module, "WRITE_BATCH", 8)
    monkeypatch.setattr(writer_module, "RETRY_WAIT", 0.05)
    rounds: list[list[int]] = []
    written_once = threading.Event()  # a round written after the refused one
    write = dcache.update_batch_targets

    def refused_once(job_id: str, entries: list[dict[str, Any]], **kwargs: Any) -> int:
        rounds.append([entry["idx"] for entry in entries])
        if len(rounds) == 1:
            raise dcache.StoreUnavailable("database: a write refused once")
        written = write(job_id, entries, **kwargs)
        written_once.set()
        return written

    seen: list[bool] = []

    def fetch(target: dcache.BatchTarget) -> str:
        if target.idx == 0:  # in flight until rounds were written: no flush of an idle runner wrote them
            seen.append(written_once.wait(WAIT))
        return instant(target)

    monkeypatch.setattr(writer_module, "update_batch_targets", refused_once)
    submit_job("tail", 50)
    with running(Runner(fetch, name="r", concurrency=4)):
        wait_for(lambda: job_final("tail"), "the job to finish", timeout=WAIT * 2)
    job = dcache.batch_job("tail")
    assert job is not None and job.status == "done" and job.targets_done == 50
    assert seen == [True]
    assert all(len(idxs) <= 8 for idxs in rounds) and len(rounds) >= 1 + 50 // 8
    assert rounds[1][: len(rounds[0])] == rounds[0]  # the refused round, first in the next
    written = [idx for idxs in rounds[1:] for idx in idxs]
    assert sorted(written) == list(range(50))  # each outcome written once


def test_targets_claimed_ahead_of_a_host_that_asked_to_wait_are_not_fetched(
    file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the site answers 30 requests, then "wait an hour" (a 429 with Retry-After): by then the runner holds
    # targets claimed ahead; they are given back untried (their attempts given back) to wait as that
    # answer asked, without a request. Only the fetches already under way when the answer came reach the
    # site.
    monkeypatch.setattr(runner_module, "PREFETCH_WINDOW", 10_000.0)
    submit_job("polite", 200)
    calls: list[int] = []
    lock = threading.Lock()

    def fetch(target: dcache.BatchTarget) -> str:
        with lock:
            calls.append(int(target.idx))
            answered = len(calls) <= 30
        if not answered:
            raise Retry("429", after=3600, host_wide=True)
        return "ok"

    with running(Runner(fetch, name="r", concurrency=4, prefetch=50)) as runner:
        wait_for(lambda: len(calls) > 30 and running_targets() == 0, "every claimed target to be written")
    targets = dcache.batch_targets("polite") or []
    fetched = set(calls)
    given_back = [t for t in targets if t.idx not in fetched and t.error == "429"]
    assert len(given_back) == runner.progress().given_back > 0, "targets were claimed ahead and given back"
    assert all((t.status, t.attempts) == ("pending", 0) for t in given_back)  # never tried
    assert len(calls) <= 30 + 2 * 4, calls
    asked = [t for t in targets if t.idx in fetched and t.status == "pending"]
    assert asked and all((t.error, t.attempts) == ("429", 1) for t in asked)
