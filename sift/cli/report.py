"""Output: aligned columns for people, JSON for scripts, and the small formats both share."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = [
    "Column",
    "emit_json",
    "format_age",
    "format_count",
    "format_size",
    "format_span",
    "format_time",
    "key_values",
    "plural",
    "table",
    "table_lines",
    "terminal_safe",
    "utc_text",
]

#: Characters text from the store may not send to a terminal as they are: the C0 controls (ESC among them),
#: DEL and the C1 controls, which steer the terminal, and Unicode's bidi controls and line and paragraph
#: separators, which reorder or hide the text around them.
_UNSAFE = [
    *range(0x20),
    *range(0x7F, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    0x2028,
    0x2029,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_ESCAPES = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _UNSAFE} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): " ",
}

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_SECOND = datetime.timedelta(seconds=1)
#: The unix times a datetime can show: 0001-01-01 to 9999-12-31 23:59:59 UTC.
_FIRST_TIME = (datetime.datetime.min.replace(tzinfo=datetime.UTC) - _EPOCH) // _SECOND
_LAST_TIME = (datetime.datetime.max.replace(tzinfo=datetime.UTC) - _EPOCH) // _SECOND


def terminal_safe(text: str) -> str:
    """``text`` made safe to print: each character that could steer or hide text on a terminal is written
    as an escape (``\\x1b``, ``\\u202e``); a newline as ``\\n``, a carriage return as ``\\r``, a tab as a
    space."""
    return text.translate(_ESCAPES)


@dataclass(frozen=True)
class Column:
    """One column of a table: its header, the key of each row it shows, and its alignment."""

    header: str
    key: str
    right: bool = False
    # Longer cells are cut to this many characters, ending in "…"; a cell depends only on the first
    # width + 1 characters of its text, so a reader may fetch no more than those.
    width: int | None = None


def _cell(value: Any, width: int | None) -> str:
    text = "" if value is None else terminal_safe(str(value))
    if width is not None and len(text) > width:
        text = text[: max(width - 1, 0)] + "…"
    return text


def _line(values: Sequence[str], widths: Sequence[int], columns: Sequence[Column], indent: str) -> str:
    cells = zip(values, widths, columns, strict=True)
    parts = [v.rjust(w) if col.right else v.ljust(w) for v, w, col in cells]
    return (indent + "  ".join(parts)).rstrip()


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column], *, indent: str = "") -> list[str]:
    """Lines of an aligned table with a header row; numbers are right-aligned where the column says; every
    cell is :func:`terminal_safe`."""
    cells = [[_cell(row.get(col.key), col.width) for col in columns] for row in rows]
    widths = [max([len(col.header)] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]
    return [_line([col.header for col in columns], widths, columns, indent)] + [
        _line(r, widths, columns, indent) for r in cells
    ]


def table_lines(
    read: Callable[[], Iterable[Mapping[str, Any]]], columns: Sequence[Column], *, indent: str = ""
) -> Iterator[str]:
    """The lines of :func:`table` for more rows than memory should hold: ``read()`` is called twice, to
    measure the columns and then to print them, and only one row's cells are held at a time."""
    widths = [len(col.header) for col in columns]
    for row in read():
        widths = [
            max(w, len(_cell(row.get(col.key), col.width))) for w, col in zip(widths, columns, strict=True)
        ]
    yield _line([col.header for col in columns], widths, columns, indent)
    for row in read():
        yield _line([_cell(row.get(col.key), col.width) for col in columns], widths, columns, indent)


def key_values(pairs: Sequence[tuple[str, Any]], *, indent: str = "") -> list[str]:
    """Lines of ``label  value`` with the values aligned and :func:`terminal_safe`."""
    width = max((len(label) for label, _ in pairs), default=0)
    return [f"{indent}{label.ljust(width)}  {_cell(value, None)}".rstrip() for label, value in pairs]


def emit_json(value: Any, out: TextIO | None = None) -> None:
    """Write ``value`` as indented JSON and a newline."""
    out = out or sys.stdout
    out.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def format_count(n: int) -> str:
    return f"{n:,}"


def plural(n: int, word: str) -> str:
    """``1 job``, ``2 jobs`` (with thousands separators)."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def format_size(n: int) -> str:
    """Bytes for people: ``812 B``, ``3.4 KiB``, ``1.2 MiB``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def utc_text(unix: int) -> str | None:
    """A unix time as ``2025-01-01 00:00:00 UTC``; None for one outside years 1 to 9999."""
    if not _FIRST_TIME <= unix <= _LAST_TIME:
        return None
    return datetime.datetime.fromtimestamp(unix, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_time(unix: int) -> str:
    """A unix time as ``2025-01-01 00:00:00 UTC``, or as its number when no date can show it (a time in
    milliseconds stored as seconds is in the year 55,000)."""
    text = utc_text(unix)
    return str(unix) if text is None else text


def format_span(seconds: int) -> str:
    """A length of time in its two largest units: ``45s``, ``12m 5s``, ``3h 4m``, ``2d 1h``."""
    seconds = abs(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    shown = parts[:2]
    if len(shown) == 2 and shown[1][0] == 0:
        shown = shown[:1]
    return " ".join(f"{amount}{unit}" for amount, unit in shown)


def format_age(unix: int, now: int) -> str:
    """How long ago ``unix`` was, seen from ``now``: ``12m 5s ago``, or ``in 3s`` for a future time."""
    delta = now - unix
    return f"{format_span(delta)} ago" if delta >= 0 else f"in {format_span(delta)}"
