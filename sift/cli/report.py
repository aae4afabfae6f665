"""Output: aligned columns for people, JSON for scripts, and the small formats both share."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
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
]


@dataclass(frozen=True)
class Column:
    """One column of a table: its header, the key of each row it shows, and its alignment."""

    header: str
    key: str
    right: bool = False
    width: int | None = None  # longer cells are cut to this many characters, ending in "…"


def _cell(value: Any, width: int | None) -> str:
    text = "" if value is None else str(value)
    text = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", " ")
    if width is not None and len(text) > width:
        text = text[: max(width - 1, 0)] + "…"
    return text


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column], *, indent: str = "") -> list[str]:
    """Lines of an aligned table with a header row; numbers are right-aligned where the column says."""
    cells = [[_cell(row.get(col.key), col.width) for col in columns] for row in rows]
    widths = [max([len(col.header)] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        cells = zip(values, widths, columns, strict=True)
        parts = [v.rjust(w) if col.right else v.ljust(w) for v, w, col in cells]
        return (indent + "  ".join(parts)).rstrip()

    return [line([col.header for col in columns])] + [line(r) for r in cells]


def key_values(pairs: Sequence[tuple[str, Any]], *, indent: str = "") -> list[str]:
    """Lines of ``label  value`` with the values aligned."""
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


def format_time(unix: int) -> str:
    """A unix time as ``2025-01-01 00:00:00 UTC``."""
    moment = datetime.datetime.fromtimestamp(unix, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


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
