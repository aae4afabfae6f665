"""The output formats the commands share: aligned columns, sizes, spans, ages and times."""

from __future__ import annotations

import pytest

from sift.cli.report import (
    Column,
    format_age,
    format_size,
    format_span,
    format_time,
    key_values,
    plural,
    table,
)


def test_table_aligns_columns() -> None:
    rows = [{"name": "a", "n": 5}, {"name": "longer name", "n": 12345}]
    lines = table(rows, [Column("name", "name"), Column("count", "n", right=True)])
    assert lines == [
        "name         count",
        "a                5",
        "longer name  12345",
    ]


def test_table_cuts_long_cells_and_escapes_newlines() -> None:
    rows = [{"text": "x" * 50, "other": "a\nb"}]
    lines = table(rows, [Column("text", "text", width=10), Column("other", "other")])
    assert lines[1] == "xxxxxxxxx…  a\\nb"
    assert len(lines) == 2


def test_table_shows_none_as_empty() -> None:
    assert table([{"a": None, "b": 1}], [Column("a", "a"), Column("b", "b")]) == ["a  b", "   1"]


def test_key_values_align() -> None:
    assert key_values([("a", 1), ("longer", "x")], indent="  ") == ["  a       1", "  longer  x"]


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (5 * 1024**2, "5.0 MiB"),
        (3 * 1024**4, "3.0 TiB"),
    ],
)
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (45, "45s"),
        (60, "1m"),
        (725, "12m 5s"),
        (3600, "1h"),
        (11_040, "3h 4m"),
        (90_000, "1d 1h"),
        (-30, "30s"),
    ],
)
def test_format_span(seconds: int, text: str) -> None:
    assert format_span(seconds) == text


def test_format_age_past_and_future() -> None:
    assert format_age(1000, 1090) == "1m 30s ago"
    assert format_age(1090, 1000) == "in 1m 30s"


def test_format_time_is_utc() -> None:
    assert format_time(1_735_689_600) == "2025-01-01 00:00:00 UTC"


def test_plural() -> None:
    assert [plural(n, "job") for n in (0, 1, 2, 1500)] == ["0 jobs", "1 job", "2 jobs", "1,500 jobs"]
