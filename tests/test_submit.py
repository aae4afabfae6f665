"""``submit_batch_job``: the idempotency lookup and the create as one write transaction.

On a hit it answers the job ``batch_job_by_idem`` finds and writes nothing; on a miss it stores the job
and its targets. Eight real processes submitting the same key at the same moment make exactly one job.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest
from helpers import make_job, make_target, make_targets, snapshot

from sift import dcache

TTL = 3_600
PROCESSES = 8
BURSTS = 50
RESULT_TIMEOUT_S = 180.0

ctx = multiprocessing.get_context("spawn")


def test_a_miss_creates_the_job_and_its_targets(store: Any) -> None:
    job = make_job("a", idem_key="k", targets_total=2, lease=1_000)
    assert dcache.submit_batch_job(job, make_targets(2), TTL, now=1_000) == ("a", True)
    stored = dcache.batch_targets("a")
    assert stored is not None and [t.idx for t in stored] == [0, 1]


def test_a_hit_answers_the_existing_job_and_writes_nothing(store: Any) -> None:
    dcache.submit_batch_job(make_job("a", idem_key="k", lease=1_000), None, TTL, now=1_000)
    before = snapshot()
    consumed: list[int] = []

    def targets() -> Any:
        consumed.append(1)
        yield from make_targets(1)

    assert dcache.submit_batch_job(make_job("b", idem_key="k"), targets(), TTL, now=1_500) == ("a", False)
    assert snapshot() == before
    assert consumed == []  # a hit does not read the targets


def test_the_lookup_follows_the_idempotency_rule(store: Any) -> None:
    """Same answer as batch_job_by_idem: the lease window, the statuses, the newest job, the caller."""
    dcache.create_batch_job(make_job("old", idem_key="k", created_at=10, lease=10))
    dcache.create_batch_job(make_job("new", idem_key="k", created_at=20, lease=20))
    dcache.create_batch_job(make_job("gone", idem_key="g", status="failed", lease=20))
    assert dcache.submit_batch_job(make_job("x1", idem_key="k"), None, 100, now=115) == ("new", False)
    assert dcache.submit_batch_job(make_job("x2", idem_key="k"), None, 100, now=120) == ("x2", True)
    assert dcache.submit_batch_job(make_job("x3", idem_key="g"), None, 100, now=21) == ("x3", True)
    assert dcache.submit_batch_job(make_job("x4", idem_key="k", caller="bob"), None, 100, now=21) == (
        "x4",
        True,
    )


def test_an_empty_key_always_creates(store: Any) -> None:
    assert dcache.submit_batch_job(make_job("a", idem_key=""), None, TTL, now=1_000) == ("a", True)
    assert dcache.submit_batch_job(make_job("b", idem_key=""), None, TTL, now=1_000) == ("b", True)


def test_hits_and_misses_are_counted_as_the_lookup_counts_them(store: Any) -> None:
    dcache.submit_batch_job(make_job("a", idem_key="k"), None, TTL, now=1_000)
    dcache.submit_batch_job(make_job("b", idem_key="k"), None, TTL, now=1_000)
    dcache.submit_batch_job(make_job("c", idem_key=""), None, TTL, now=1_000)
    dcache.batch_job_by_idem("alice", "k", TTL, now=1_000)
    dcache.batch_job_by_idem("alice", "", TTL, now=1_000)
    counts = dcache.stats()
    assert (counts["batch_idem_hit"], counts["batch_idem_miss"]) == (2, 3)
    assert (counts["jobs_created"], counts["targets_put"]) == (2, 0)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: dcache.submit_batch_job(make_job("n", caller=""), None, TTL, now=1), "caller"),
        (lambda: dcache.submit_batch_job(make_job("n", idem_key=None), None, TTL, now=1), "idem_key"),
        (lambda: dcache.submit_batch_job(make_job("n", idem_key="k"), None, -1, now=1), "ttl"),
        (lambda: dcache.submit_batch_job(make_job("n", idem_key="k"), None, TTL, now=-1), "now"),
        (lambda: dcache.submit_batch_job("job", None, TTL, now=1), "job"),  # type: ignore[arg-type]
        (
            lambda: dcache.submit_batch_job(
                make_job("n", idem_key="new", targets_total=2),
                [*make_targets(1), *make_targets(1)],
                TTL,
                now=1,
            ),
            "idx",
        ),
        (
            lambda: dcache.submit_batch_job(
                make_job("n", idem_key="new", targets_total=1), [make_target(0, options="{bad")], TTL, now=1
            ),
            "options",
        ),
    ],
    ids=["caller", "idem_key", "ttl", "now", "job", "idx-twice", "options"],
)
def test_bad_input_names_the_field_and_writes_nothing(store: Any, call: Any, field: str) -> None:
    dcache.create_batch_job(make_job("a", idem_key="k"))
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput, match=f"^{field}: "):
        call()
    assert snapshot() == before


def test_a_taken_id_is_a_duplicate_and_writes_nothing(store: Any) -> None:
    dcache.create_batch_job(make_job("a", idem_key="k"))
    before = snapshot()
    with pytest.raises(dcache.DuplicateJob, match=r"^id: "):
        dcache.submit_batch_job(make_job("a", idem_key="other", targets_total=1), make_targets(1), TTL, now=1)
    assert snapshot() == before


def _submitter(path: str, p: int, barrier: Barrier, results: Any) -> None:
    answers: list[tuple[int, str, bool]] = []
    try:
        dcache.open_db(path)
        for b in range(BURSTS):
            job = make_job(f"p{p}-b{b}", idem_key=f"key-{b}", targets_total=5, lease=10_000 + b)
            barrier.wait(RESULT_TIMEOUT_S)
            answers.append((b, *dcache.submit_batch_job(job, make_targets(5), TTL, now=10_000 + b)))
        results.put((p, answers, None))
    except BaseException as exc:
        results.put((p, answers, f"{type(exc).__name__}: {exc}"))
    finally:
        dcache.close_db()


@pytest.mark.slow
def test_bursts_from_8_processes_make_one_job_per_key(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path)
    dcache.close_db()
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_submitter, args=(str(path), p, barrier, results)) for p in range(PROCESSES)]
    for proc in procs:
        proc.start()
    reports = [results.get(timeout=RESULT_TIMEOUT_S) for _ in procs]
    for proc in procs:
        proc.join(RESULT_TIMEOUT_S)
    assert [error for _, _, error in reports if error] == []
    by_burst: dict[int, list[tuple[str, bool]]] = {}
    for _, answers, _ in reports:
        for b, job_id, created in answers:
            by_burst.setdefault(b, []).append((job_id, created))
    assert sorted(by_burst) == list(range(BURSTS))
    for b, answers in by_burst.items():
        assert len(answers) == PROCESSES
        assert sum(created for _, created in answers) == 1, f"burst {b}: {answers}"
        assert len({job_id for job_id, _ in answers}) == 1, f"burst {b}: {answers}"
    dcache.open_db(path)
    try:
        assert dcache.BatchJob.select().count() == BURSTS
        assert dcache.BatchTarget.select().count() == BURSTS * 5
    finally:
        dcache.close_db()
