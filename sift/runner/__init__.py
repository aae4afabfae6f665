"""The runner: claims targets from the store this process opened, calls ``fetch`` for each, and writes
what it says (see docs/how-to/runners.md)."""

from .outcomes import Backoff, Fail, Retry

__all__ = ["Backoff", "Fail", "Retry"]
