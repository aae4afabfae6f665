"""Argument checks shared by the manager functions. Each raises ``InvalidBatchInput`` naming the field."""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from typing import Any, NoReturn

from .clock import unix_now
from .counters import counters
from .errors import InvalidBatchInput
from .jsontext import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from .jsontext import MAX_OPTIONS_BYTES as MAX_OPTIONS_BYTES
from .jsontext import json_too_deep as json_too_deep
from .jsontext import options_text as options_text
from .models import CallerClass, JobStatus, TargetStatus

MAX_INT = 2**63 - 1  # SQLite INTEGER

#: The longest key or id (a job id, caller, idem_key), in UTF-8 bytes, on both backends: PostgreSQL's
#: btree index entry holds at most about 2,700 bytes, and (caller, idem_key) share one.
MAX_KEY_BYTES = 1024

#: The longest URL a target holds, in UTF-8 bytes: twice what HTTP asks every server to take (RFC 9110
#: recommends at least 8,000 octets), far past what sites serve.
MAX_URL_BYTES = 16_384
#: The longest error, hint or reason: a message, not a payload.
MAX_MESSAGE_BYTES = 65_536
#: The largest result one target holds (results also count against the store's byte budget).
MAX_RESULT_BYTES = 64 * 2**20
#: The most claims one target's ``attempts`` records: a restored count past it is refused, so the claims'
#: ``attempts + 1`` never leaves a 64-bit integer on either backend.
MAX_ATTEMPTS = 2**31 - 1

JOB_STATUS_VALUES = {s.value: s.value for s in JobStatus}
TARGET_STATUS_VALUES = {s.value: s.value for s in TargetStatus}
CALLER_CLASS_VALUES = {c.value: c.value for c in CallerClass}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def invalid(field: str, problem: str) -> NoReturn:
    counters.add("invalid_input")
    raise InvalidBatchInput(field, problem)


def entry(where: str, value: Any, fields: tuple[str, ...], required: tuple[str, ...], kind: str) -> None:
    """``value``, entry ``where`` of a call's list (``results[3]``), is a mapping of ``fields`` alone, with
    each of ``required``; a refusal names the entry, or its field. ``kind`` names an entry: a target's
    write."""
    if not isinstance(value, Mapping):
        invalid(where, f"must be a mapping of {', '.join(fields)}; got {type(value).__name__}")
    # the mapping's own iteration, not keys(): a Mapping may return a list, which has no set difference
    if unknown := sorted([str(key) for key in value if key not in fields]):
        invalid(f"{where}.{unknown[0]}", f"is not a field of {kind}")
    for key in required:
        if key not in value:
            invalid(f"{where}.{key}", "is required")


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


def flag(field: str, value: Any) -> bool:
    """True or False, nothing else (not 0 or 1)."""
    if type(value) is not bool:
        invalid(field, f"must be True or False, got {_show(value)}")
    return value


def plain(value: str) -> str:
    """The text a ``str`` (or an instance of a subclass of it) holds, as a plain ``str``: a subclass's own
    ``__str__``, ``__contains__`` or ``isascii`` never decides what is checked or stored."""
    return value if type(value) is str else str.__str__(value)


def text(field: str, value: Any, *, allow_empty: bool = True) -> str:
    """A str that encodes as UTF-8 (no lone surrogates) and holds no NUL; returned as a plain str."""
    if not isinstance(value, str):
        invalid(field, f"must be a str, got {type(value).__name__}")
    checked = plain(value)
    if not allow_empty and not checked:
        invalid(field, "must not be empty")
    if not checked.isascii():
        utf8_size(field, checked)  # which refuses a NUL too
    elif "\x00" in checked:
        invalid(field, NUL_PROBLEM)
    return checked


def key(field: str, value: Any, *, allow_empty: bool = False) -> str:
    """:func:`text` of at most :data:`MAX_KEY_BYTES` UTF-8 bytes: a key or id, the same on both backends."""
    return at_most(field, text(field, value, allow_empty=allow_empty), MAX_KEY_BYTES)


def at_most(field: str, checked: str, most: int) -> str:
    """``checked`` (a str :func:`text` took) if it holds at most ``most`` bytes of UTF-8."""
    if len(checked) > most // 4 and len(checked.encode("utf-8", "surrogatepass")) > most:
        size = len(checked.encode("utf-8", "surrogatepass"))
        invalid(field, f"must be at most {most} bytes of UTF-8, got {size}")
    return checked


def message(field: str, value: Any) -> str:
    """:func:`text` of at most :data:`MAX_MESSAGE_BYTES`: an error, hint or reason."""
    return at_most(field, text(field, value), MAX_MESSAGE_BYTES)


def optional_message(field: str, value: Any) -> str | None:
    return None if value is None else message(field, value)


#: Why a NUL is refused: one rule on both backends, and PostgreSQL's text cannot hold one.
NUL_PROBLEM = "must not contain NUL characters (\\x00): no store text may, so data moves between backends"


def utf8_size(field: str, value: Any) -> int:
    """The UTF-8 byte length of a str, which must encode (no lone surrogates) and hold no NUL."""
    if not isinstance(value, str):
        invalid(field, f"must be a str, got {type(value).__name__}")
    value = plain(value)
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


def optional_key(field: str, value: Any) -> str | None:
    """None, or :func:`key` (the empty str allowed: it names no holder)."""
    return None if value is None else key(field, value, allow_empty=True)


def choice(field: str, value: Any, allowed: dict[str, str]) -> str:
    if isinstance(value, str) and plain(value) in allowed:
        return allowed[plain(value)]
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
        # floor(now - ttl) is now - ceil(ttl), in exact integers: float arithmetic near 2**63 rounds up.
        return max(-1, now - math.ceil(ttl))
    invalid(field, f"must be a timedelta or a number of seconds, got {type(ttl).__name__}")
