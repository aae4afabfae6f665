"""Argument checks shared by the manager functions. Each raises ``InvalidBatchInput`` naming the field."""

from __future__ import annotations

import datetime
import math
from typing import Any, NoReturn

from .clock import unix_now
from .counters import counters
from .errors import InvalidBatchInput
from .jsontext import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from .jsontext import json_too_deep as json_too_deep
from .jsontext import options_text as options_text
from .models import CallerClass, JobStatus, TargetStatus

MAX_INT = 2**63 - 1  # SQLite INTEGER

JOB_STATUS_VALUES = {s.value: s.value for s in JobStatus}
TARGET_STATUS_VALUES = {s.value: s.value for s in TargetStatus}
CALLER_CLASS_VALUES = {c.value: c.value for c in CallerClass}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def invalid(field: str, problem: str) -> NoReturn:
    counters.add("invalid_input")
    raise InvalidBatchInput(field, problem)


def count(field: str, value: Any) -> int:
    """A non-negative int that fits SQLite's INTEGER (bool is not an int here)."""
    if type(value) is not int or not 0 <= value <= MAX_INT:
        invalid(field, f"must be a non-negative int, got {_show(value)}")
    return value


def positive(field: str, value: Any) -> int:
    """An int of at least 1 that fits SQLite's INTEGER (bool is not an int here)."""
    if type(value) is not int or not 1 <= value <= MAX_INT:
        invalid(field, f"must be a positive int, got {_show(value)}")
    return value


def text(field: str, value: Any, *, allow_empty: bool = True) -> str:
    """A str that encodes as UTF-8 (no lone surrogates) and holds no NUL; returned as a plain str."""
    if not isinstance(value, str):
        invalid(field, f"must be a str, got {type(value).__name__}")
    if not allow_empty and not value:
        invalid(field, "must not be empty")
    if not value.isascii():
        utf8_size(field, value)  # which refuses a NUL too
    elif "\x00" in value:
        invalid(field, NUL_PROBLEM)
    return str(value)


#: Why a NUL is refused: one rule on both backends, and PostgreSQL's text cannot hold one.
NUL_PROBLEM = "must not contain NUL characters (\\x00): no store text may, so data moves between backends"


def utf8_size(field: str, value: Any) -> int:
    """The UTF-8 byte length of a str, which must encode (no lone surrogates) and hold no NUL."""
    if not isinstance(value, str):
        invalid(field, f"must be a str, got {type(value).__name__}")
    if "\x00" in value:
        invalid(field, NUL_PROBLEM)
    if value.isascii():
        return len(value)
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        invalid(field, "is not valid UTF-8 text (it contains a lone surrogate)")


def optional_text(field: str, value: Any) -> str | None:
    return None if value is None else text(field, value)


def choice(field: str, value: Any, allowed: dict[str, str]) -> str:
    if isinstance(value, str) and value in allowed:
        return allowed[value]
    invalid(field, f"must be one of {', '.join(allowed)}, got {_show(value)}")


def job_status(value: Any) -> str:
    return choice("status", value, JOB_STATUS_VALUES)


def target_status(value: Any) -> str:
    return choice("status", value, TARGET_STATUS_VALUES)


def caller_class(value: Any) -> str:
    return choice("caller_class", value, CALLER_CLASS_VALUES)


def job_id(value: Any) -> str:
    return text("job_id", value, allow_empty=False)


def now(value: Any) -> int:
    return unix_now() if value is None else count("now", value)


#: A time to live or a staleness bound: seconds (int or float), or a timedelta.
Duration = float | datetime.timedelta


def cutoff(now: int, ttl: Duration, field: str = "ttl") -> int:
    """The largest lease with ``lease + ttl <= now``; a job is expired iff ``lease <= cutoff``.

    Comparing the bare column lets SQLite use the lease index; ``lease + ttl <= now`` could not.
    ``field`` names ``ttl`` in the error (``stale_after`` for ``rescue_stale_jobs``).
    """
    if isinstance(ttl, datetime.timedelta):
        micros = ttl // datetime.timedelta(microseconds=1)
        if micros < 0:
            invalid(field, f"must not be negative, got {_show(ttl)}")
        return max(-1, (now * 1_000_000 - micros) // 1_000_000)
    if type(ttl) is int or type(ttl) is float:
        if not (ttl >= 0 and math.isfinite(ttl)):
            invalid(field, f"must be a finite non-negative number of seconds, got {_show(ttl)}")
        return max(-1, math.floor(now - ttl))
    invalid(field, f"must be a timedelta or a number of seconds, got {type(ttl).__name__}")
