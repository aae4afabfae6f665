"""Parsing the sizes and durations typed on the command line.

Sizes: ``512MiB``, ``1GB``, ``1.5KiB`` or plain bytes. Durations: ``90s``, ``10m``, ``24h``, ``7d``,
compounds such as ``1h30m``, or plain seconds. A bad value raises :class:`BadValue` naming the option,
which the command line reports as one line with exit status 1. Neither may be negative: a value written
with a leading minus sign is refused as such (``--ttl: ttl must not be negative``), even ``-0``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

__all__ = ["BadValue", "parse_duration", "parse_size"]

SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}

DURATION_UNITS: dict[str, int] = {"s": 1, "m": 60, "h": 3600, "d": 86400}

_NUMBER = r"(\d+(?:\.\d+)?|\.\d+)"
_SIZE = re.compile(rf"{_NUMBER}\s*([a-z]*)")
_DURATION_PART = re.compile(rf"{_NUMBER}([a-z]?)")


class BadValue(ValueError):
    """A value typed for an option is malformed; the message names the option."""


def _whole(amount: Decimal, option: str, text: str, what: str) -> int:
    if amount != amount.to_integral_value():
        raise BadValue(f"{option}: {text!r} is not a whole number of {what}")
    return int(amount)


def _refuse_negative(text: str, option: str, parse: Callable[[str, str], int]) -> None:
    """A value with a leading minus sign: refused as negative if the rest is well formed."""
    cleaned = text.strip()
    if cleaned.startswith("-"):
        try:
            parse(cleaned[1:], option)
        except BadValue:
            parse(text, option)  # malformed after the sign: the usual message, naming the whole text
            raise
        raise BadValue(f"{option}: {option.lstrip('-')} must not be negative, got {text!r}")


def parse_size(text: str, option: str = "size") -> int:
    """Bytes from ``512MiB``, ``1GB``, ``1.5KiB`` or a plain number of bytes (case-insensitive)."""
    _refuse_negative(text, option, _parse_size)
    return _parse_size(text, option)


def _parse_size(text: str, option: str) -> int:
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None or match.group(2) not in ("", *SIZE_UNITS):
        raise BadValue(
            f"{option}: {text!r} is not a size (use e.g. 512MiB, 1GB, or plain bytes; "
            f"units: {', '.join(('B', 'KB', 'MB', 'GB', 'TB', 'KiB', 'MiB', 'GiB', 'TiB'))})"
        )
    number, unit = match.groups()
    return _whole(Decimal(number) * SIZE_UNITS[unit or "b"], option, text, "bytes")


def parse_duration(text: str, option: str = "duration") -> int:
    """Whole seconds from ``90s``, ``10m``, ``24h``, ``7d``, ``1h30m`` or plain seconds."""
    _refuse_negative(text, option, _parse_duration)
    return _parse_duration(text, option)


def _parse_duration(text: str, option: str) -> int:
    cleaned = text.strip().lower()
    parts = _DURATION_PART.findall(cleaned) if cleaned else []
    rebuilt = "".join(number + unit for number, unit in parts)
    bare_number_only = len(parts) == 1 or all(unit for _, unit in parts)
    if (
        not parts
        or rebuilt != cleaned
        or not bare_number_only
        or any(u and u not in DURATION_UNITS for _, u in parts)
    ):
        raise BadValue(f"{option}: {text!r} is not a duration (use e.g. 90s, 10m, 24h, 7d, or plain seconds)")
    try:
        total = sum((Decimal(number) * DURATION_UNITS[unit or "s"] for number, unit in parts), Decimal(0))
    except InvalidOperation as exc:  # pragma: no cover - the regex only admits decimal numbers
        raise BadValue(f"{option}: {text!r} is not a duration") from exc
    return _whole(total, option, text, "seconds")
