"""The runner: claims targets from the store this process opened, calls ``fetch`` for each, and writes
what it says (see docs/how-to/runners.md)."""

from .outcomes import Backoff, Fail, GiveBack, Retry
from .runner import Progress, Runner

__all__ = ["Backoff", "Fail", "GiveBack", "Progress", "Retry", "Runner"]
