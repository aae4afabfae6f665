"""What a runner's ``fetch`` says besides a result: try again later (:class:`Retry`), fail now
(:class:`Fail`) or not tried at all (:class:`GiveBack`), and how long a retry waits (:class:`Backoff`).
Their texts are kept as a store text may hold them (:func:`storable_text`)."""

from __future__ import annotations

import math
import random
import re
import threading
from dataclasses import dataclass

from ..dcache.errors import InvalidBatchInput
from ..dcache.validation import MAX_MESSAGE_BYTES, plain

__all__ = ["MAX_SECONDS", "Backoff", "Fail", "GiveBack", "Retry", "storable_message", "storable_text"]

#: The most seconds a runner waits for anything (a retry's ``after``, a grace, ``stale_after``): the
#: longest wait a thread can make here (``threading.TIMEOUT_MAX``, about 292 years on 64-bit Linux).
MAX_SECONDS = threading.TIMEOUT_MAX

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` as a store text may hold it: each NUL and each lone surrogate (which no store text may hold)
    becomes U+FFFD."""
    text = plain(text)
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    return text if text.isascii() else _LONE_SURROGATE.sub("\ufffd", text)


def storable_message(text: str) -> str:
    """``text`` as the store keeps an error or hint (:func:`storable_text`), within its bound on messages:
    a longer one (an exception's text may be) is cut, and ends in "..."."""
    text = storable_text(text)
    if text.isascii() and len(text) <= MAX_MESSAGE_BYTES:
        return text
    data = text.encode("utf-8")
    if len(data) <= MAX_MESSAGE_BYTES:
        return text
    return data[: MAX_MESSAGE_BYTES - 3].decode("utf-8", "ignore") + "..."


def _message(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidBatchInput(field, f"must be text, got {type(value).__name__}")
    value = storable_text(value)
    if len(value.encode("utf-8")) > MAX_MESSAGE_BYTES:
        raise InvalidBatchInput(field, f"longer than {MAX_MESSAGE_BYTES} bytes")
    return value


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _seconds(field: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_SECONDS
    ):
        problem = f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}, got {value!r}"
        raise InvalidBatchInput(field, problem)
    return float(value)


class Retry(Exception):
    """Try the target again: it goes back to pending and is not claimed before ``after`` seconds from now
    (None: the runner's backoff for its attempt). At the runner's ``max_attempts`` it fails with ``error``.
    ``host_wide``: the site asked every request to wait (a 429 or 503 with ``Retry-After``), not this one."""

    def __init__(self, error: str, after: float | None = None, *, host_wide: bool = False) -> None:
        self.error = _message("error", error)
        self.after = _seconds("after", after, allow_none=True)
        if type(host_wide) is not bool:
            raise InvalidBatchInput("host_wide", f"must be True or False, got {host_wide!r}")
        self.host_wide = host_wide
        super().__init__(error)


class Fail(Exception):
    """The target is failed now with ``error`` (and ``hint``, shown to its caller), whatever its attempts."""

    def __init__(self, error: str, hint: str | None = None) -> None:
        self.error = _message("error", error)
        self.hint = None if hint is None else _message("hint", hint)
        super().__init__(error)


class GiveBack(Exception):
    """The target was not tried (no request left): it goes back to pending at once, and its attempt is given
    back. The built-in fetcher says so for a paced target it could not send by its ``send_by``."""

    def __init__(self, reason: str) -> None:
        self.reason = _message("reason", reason)
        super().__init__(reason)


@dataclass(frozen=True)
class Backoff:
    """The wait before attempt ``n + 1`` after ``n`` failed ones: ``first * factor**(n - 1)``, at most
    ``most`` seconds, then moved by up to ``jitter`` of itself either way, so retries of one outage spread."""

    first: float = 1.0
    factor: float = 2.0
    most: float = 300.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        for field in ("first", "most"):
            _seconds(field, getattr(self, field))
        if isinstance(self.factor, bool) or not isinstance(self.factor, int | float) or not self.factor >= 1:
            raise InvalidBatchInput("factor", f"must be a number >= 1, got {self.factor!r}")
        if (
            isinstance(self.jitter, bool)
            or not isinstance(self.jitter, int | float)
            or not 0 <= self.jitter <= 1
        ):
            raise InvalidBatchInput("jitter", f"must be a number from 0 to 1, got {self.jitter!r}")

    def delay(self, attempts: int, rand: random.Random | None = None) -> float:
        """Seconds to wait after ``attempts`` (>= 1) failed attempts."""
        exponent = max(attempts, 1) - 1
        # factor**exponent overflows a float long before it matters: past ``most`` is ``most``.
        try:
            base = min(self.first * self.factor**exponent, self.most)
        except OverflowError:
            base = self.most
        spread = base * self.jitter * (2 * (rand or random).random() - 1)
        return max(0.0, base + spread)
