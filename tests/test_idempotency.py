"""Rule 3: the idempotency lookup (caller, idem_key, lease + ttl > now, status filter, newest first)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from helpers import job_with_bytes, make_job

from sift import dcache

IDEM_STATUSES = ["queued", "running", "done", "partial"]
NEVER_STATUSES = ["failed", "cancelled"]


def idem_job(job_id: str, **fields: Any) -> None:
    values: dict[str, Any] = {"caller": "alice", "idem_key": "key", "lease": 1_000, "created_at": 1_000}
    values.update(fields)
    dcache.create_batch_job(make_job(job_id, **values))


@pytest.mark.parametrize(
    ("now", "found"),
    [(0, True), (1_000, True), (1_099, True), (1_100, False), (1_101, False), (10**12, False)],
)
def test_lease_plus_ttl_must_be_after_now(store: Any, now: int, found: bool) -> None:
    idem_job("job-1")
    assert dcache.batch_job_by_idem("alice", "key", 100, now=now) == ("job-1" if found else None)


@pytest.mark.parametrize(
    ("ttl", "now", "found"),
    [
        (0, 999, True),
        (0, 1_000, False),
        (0.0, 1_000, False),
        (0.5, 1_000, True),
        (0.5, 1_001, False),
        (99.5, 1_099, True),
        (99.5, 1_100, False),
        (100.0, 1_099, True),
        (100.0, 1_100, False),
        (timedelta(0), 999, True),
        (timedelta(0), 1_000, False),
        (timedelta(seconds=100), 1_099, True),
        (timedelta(seconds=100), 1_100, False),
        (timedelta(milliseconds=500), 1_000, True),
        (timedelta(milliseconds=500), 1_001, False),
        (timedelta(seconds=99, microseconds=999_999), 1_099, True),
        (timedelta(seconds=100, microseconds=1), 1_100, True),
        (timedelta(seconds=100, microseconds=1), 1_101, False),
        (timedelta(days=1), 1_000 + 86_399, True),
        (timedelta(days=1), 1_000 + 86_400, False),
    ],
)
def test_ttl_as_timedelta_int_and_fractional_seconds(store: Any, ttl: Any, now: int, found: bool) -> None:
    idem_job("job-1")
    assert dcache.batch_job_by_idem("alice", "key", ttl, now=now) == ("job-1" if found else None)


@pytest.mark.parametrize("status", IDEM_STATUSES + NEVER_STATUSES)
def test_status_filter(store: Any, status: str) -> None:
    idem_job("job-1", status=status)
    expected = "job-1" if status in IDEM_STATUSES else None
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_050) == expected


@pytest.mark.parametrize("status", NEVER_STATUSES)
def test_failed_or_cancelled_job_after_set_status_is_never_returned(store: Any, status: str) -> None:
    idem_job("job-1", status="running")
    dcache.set_batch_job_status("job-1", status, "stopped", now=1_010)
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_050) is None
    idem_job("job-2", created_at=1_020, lease=1_020)
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_050) == "job-2"


def test_newest_by_created_at(store: Any) -> None:
    idem_job("job-c", created_at=2_000)
    idem_job("job-a", created_at=3_000)
    idem_job("job-b", created_at=1_000)
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_050) == "job-a"


def test_newest_ignores_lease_and_id(store: Any) -> None:
    idem_job("job-z", created_at=1_000, lease=5_000)
    idem_job("job-a", created_at=1_001, lease=1_000)
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_050) == "job-a"


def test_newest_non_matching_is_skipped(store: Any) -> None:
    idem_job("older", created_at=1_000)
    idem_job("newer-failed", created_at=2_000, status="failed")
    idem_job("newer-expired", created_at=3_000, lease=900)
    idem_job("newer-other-key", created_at=4_000, idem_key="key2")
    idem_job("newer-other-caller", created_at=5_000, caller="bob")
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_050) == "older"


@pytest.mark.parametrize(
    "ids",
    [["a", "b"], ["b", "a"], ["b", "a", "c"], ["c", "a", "b"], ["job-9", "job-10", "job-1"]],
)
def test_tie_on_created_at_goes_to_most_recently_created(store: Any, ids: list[str]) -> None:
    idem_job("older", created_at=500)
    for job_id in ids:
        idem_job(job_id, created_at=1_000)
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_050) == ids[-1]


def test_tie_survives_deleting_the_last_created(store: Any) -> None:
    idem_job("a", created_at=1_000, lease=1_000)
    idem_job("b", created_at=1_000, lease=1_000)
    job_with_bytes("c", 1, idem_key="key", created_at=1_000, lease=500, status="done")
    assert dcache.batch_job_by_idem("alice", "key", 1_000, now=1_050) == "c"
    assert dcache.evict_batch_oldest(0) == 1
    assert dcache.batch_job_by_idem("alice", "key", 1_000, now=1_050) == "b"


def test_empty_idem_key_never_matches(store: Any) -> None:
    idem_job("job-1", idem_key="")
    idem_job("job-2", idem_key="", status="done")
    assert dcache.batch_job_by_idem("alice", "", 100, now=1_050) is None
    assert dcache.batch_job_by_idem("alice", "", timedelta(days=365), now=0) is None
    assert dcache.stats()["batch_idem_miss"] == 2


def test_other_callers_job_is_never_returned(store: Any) -> None:
    idem_job("bobs", caller="bob", created_at=5_000)
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_050) is None
    idem_job("alices", caller="alice", created_at=1_000)
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_050) == "alices"
    assert dcache.batch_job_by_idem("bob", "key", 100, now=1_050) == "bobs"
    assert dcache.batch_job_by_idem("carol", "key", 100, now=1_050) is None


@pytest.mark.parametrize(
    ("caller", "key"),
    [
        ("alice", "Key"),
        ("Alice", "key"),
        ("alice", "key "),
        ("alice ", "key"),
        ("alice", "ke"),
        ("alic", "key"),
    ],
)
def test_caller_and_key_must_match_exactly(store: Any, caller: str, key: str) -> None:
    idem_job("job-1")
    assert dcache.batch_job_by_idem(caller, key, 100, now=1_050) is None
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_050) == "job-1"


def test_non_ascii_caller_and_key(store: Any) -> None:
    idem_job("job-1", caller="ålice", idem_key="clé-😀")
    assert dcache.batch_job_by_idem("ålice", "clé-😀", 100, now=1_050) == "job-1"
    assert dcache.batch_job_by_idem("ålice", "cle-😀", 100, now=1_050) is None


def test_lookup_follows_the_sliding_lease(store: Any) -> None:
    idem_job("job-1", status="running")
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_100) is None
    dcache.touch_batch_job("job-1", now=1_050)
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_100) == "job-1"
    assert dcache.batch_job_by_idem("alice", "key", 100, now=1_150) is None


def test_idem_hits_and_misses_are_counted(store: Any) -> None:
    idem_job("job-1")
    dcache.batch_job_by_idem("alice", "key", 100, now=1_050)
    dcache.batch_job_by_idem("alice", "key", 100, now=1_050)
    dcache.batch_job_by_idem("alice", "nope", 100, now=1_050)
    stats = dcache.stats()
    assert (stats["batch_idem_hit"], stats["batch_idem_miss"]) == (2, 1)
