"""The store's only clock read, so freezegun (or a test) controls every default ``now``."""

import time
from collections.abc import Callable

# A test's clock (sift.testing's sift_clock) that replaces the system time while it is set.
_test_clock: Callable[[], float] | None = None


def unix_now() -> int:
    """Current time as whole unix seconds (a test clock's time while one is set)."""
    if _test_clock is not None:
        return _test_micros(_test_clock) // 1_000_000
    return int(time.time())


def unix_now_ms() -> int:
    """Current time as whole unix milliseconds (a test clock's time while one is set): the clock of host
    pacing and back-off, which need sub-second time."""
    if _test_clock is not None:
        return _test_micros(_test_clock) // 1000
    return int(time.time() * 1000)


def unix_time() -> float:
    """Current time as unix seconds with their fraction (a test clock's time while one is set): for a wait
    that must last at least a given time, which whole seconds would cut short."""
    if _test_clock is not None:
        return _test_micros(_test_clock) / 1_000_000
    return time.time()


def _test_micros(clock: Callable[[], float]) -> int:
    """A test clock's time in whole microseconds: an int exactly, a float's fraction rounded as the clock
    stored it."""
    now = clock()
    return now * 1_000_000 if type(now) is int else round(now * 1_000_000)


def set_test_clock(clock: Callable[[], float] | None) -> Callable[[], float] | None:
    """Make ``unix_now()`` return ``clock()`` (unix seconds, whole or not) in whole seconds, and
    ``unix_now_ms()`` in milliseconds, or the system time again with None; return the previous
    test clock, to restore it."""
    global _test_clock
    previous, _test_clock = _test_clock, clock
    return previous


def monotonic() -> float:
    """Seconds on a clock that never goes back, for the deadline of a wait (never stored)."""
    return time.monotonic()
