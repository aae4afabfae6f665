"""The store's only clock read, so freezegun (or a test) controls every default ``now``."""

import time


def unix_now() -> int:
    """Current time as whole unix seconds."""
    return int(time.time())
