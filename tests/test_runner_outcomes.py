"""What a runner's fetch says: Retry, Fail, and the Backoff between attempts."""

from __future__ import annotations

import random

import pytest

from sift.dcache import MAX_MESSAGE_BYTES, InvalidBatchInput
from sift.runner import Backoff, Fail, GiveBack, Retry
from sift.runner.outcomes import MAX_SECONDS


def test_backoff_doubles_from_first_up_to_most() -> None:
    backoff = Backoff(first=1, factor=2, most=300, jitter=0)
    assert [backoff.delay(n) for n in range(1, 11)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]


def test_backoff_past_a_float_is_most() -> None:
    assert Backoff(jitter=0).delay(10**6) == 300


@pytest.mark.parametrize("attempts", [1, 3, 9, 40])
def test_backoff_jitter_stays_within_its_share(attempts: int) -> None:
    plain = Backoff(jitter=0).delay(attempts)
    rand = random.Random(attempts)
    delays = [Backoff(jitter=0.1).delay(attempts, rand) for _ in range(200)]
    assert all(plain * 0.9 <= d <= plain * 1.1 for d in delays)
    assert len(set(delays)) > 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"first": -1}, "first"),
        ({"most": float("inf")}, "most"),
        ({"factor": 0.5}, "factor"),
        ({"factor": True}, "factor"),
        ({"jitter": 1.5}, "jitter"),
        ({"first": "1"}, "first"),
        # past the longest wait a thread can make (MAX_SECONDS): its not_before would not fit the store
        pytest.param({"most": 1e19}, "most", marks=pytest.mark.slow),
    ],
)
def test_backoff_refuses_bad_settings(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidBatchInput) as caught:
        Backoff(**kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_retry_and_fail_keep_what_they_say() -> None:
    retry = Retry("503 Service Unavailable", after=2.5)
    assert (retry.error, retry.after) == ("503 Service Unavailable", 2.5)
    assert (Retry("timeout").after, Retry("timeout").host_wide) == (None, False)
    assert Retry("429 Too Many Requests", 3, host_wide=True).host_wide
    fail = Fail("404 Not Found", hint="check the URL")
    assert (fail.error, fail.hint) == ("404 Not Found", "check the URL")
    # NUL and lone surrogates, which no store text may hold, as U+FFFD
    fail = Fail("bad \x00 page", hint="see \udcff")
    assert (fail.error, fail.hint) == ("bad \ufffd page", "see \ufffd")
    assert Retry("a\ud800\x00b", after=MAX_SECONDS).error == "a\ufffd\ufffdb"
    assert GiveBack("late \x00").reason == "late \ufffd"


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Retry("x", after=-1), "after"),
        (lambda: Retry("x", after=float("nan")), "after"),
        (lambda: Retry(b"x"), "error"),  # type: ignore[arg-type]
        (lambda: Fail("x" * (MAX_MESSAGE_BYTES + 1)), "error"),
        (lambda: Fail("x", hint=3), "hint"),  # type: ignore[arg-type]
        (lambda: Retry("x", host_wide=1), "host_wide"),  # type: ignore[arg-type]
        pytest.param(lambda: Retry("x", after=1e19), "after", marks=pytest.mark.slow),
    ],
)
def test_retry_and_fail_refuse_bad_values(make: object, field: str) -> None:
    with pytest.raises(InvalidBatchInput) as caught:
        make()  # type: ignore[operator]
    assert caught.value.field == field
