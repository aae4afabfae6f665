"""The store's only clock read, so freezegun (or a test) controls every default ``now``."""

import time
from collections.abc import Callable

# A test's clock (sift.testing's sift_clock) that replaces the system time while it is set.
_test_clock: Callable[[], int] | None = None


def unix_now() -> int:
    """Current time as whole unix seconds (a test clock's time while one is set)."""
    if _test_clock is not None:
        return _test_clock()
    return int(time.time())


def unix_time() -> float:
    """Current time as unix seconds with their fraction (a test clock's whole seconds while one is set):
    for a wait that must last at least a given time, which whole seconds would cut short."""
    if _test_clock is not None:
        return float(_test_clock())
    return time.time()


def set_test_clock(clock: Callable[[], int] | None) -> Callable[[], int] | None:
    """Make ``unix_now()`` return ``clock()``, or the system time again with None; return the previous
    test clock, to restore it."""
    global _test_clock
    previous, _test_clock = _test_clock, clock
    return previous
