"""Sizes and durations typed on the command line: accepted spellings, and one clear error for the rest."""

from __future__ import annotations

from typing import Any

import pytest

from sift.cli.units import BadValue, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1048576", 1_048_576),
        ("512MiB", 512 * 1024**2),
        ("1GB", 10**9),
        ("1gb", 10**9),
        ("1.5KiB", 1536),
        ("0.5kb", 500),
        ("2 MiB", 2 * 1024**2),
        (" 7kB ", 7000),
        ("10B", 10),
        ("3TiB", 3 * 1024**4),
        ("1TB", 10**12),
        ("4GiB", 4 * 1024**3),
        ("20MB", 20 * 10**6),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text, "--max-bytes") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "MiB",
        "-1",
        "1.5",
        "12XB",
        "1.0001KB",
        "1e3",
        "0x10",
        "1,000",
        "5 MiB extra",
        "KiB5",
        "1.5.2MB",
        "inf",
    ],
)
def test_bad_sizes(text: str) -> None:
    with pytest.raises(BadValue, match=r"^--max-bytes: ") as caught:
        parse_size(text, "--max-bytes")
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("3600", 3600),
        ("90s", 90),
        ("10m", 600),
        ("24h", 86_400),
        ("7d", 604_800),
        ("2D", 172_800),
        ("1h30m", 5400),
        ("1d2h3m4s", 93_784),
        ("1.5h", 5400),
        ("0.5m", 30),
        (" 45s ", 45),
    ],
)
def test_durations(text: str, expected: int) -> None:
    assert parse_duration(text, "--ttl") == expected


@pytest.mark.parametrize(
    "text", ["", "10x", "-5", "1h30", "0.5s", "h", "1 h", "1.5", "10mm", "1w", "s10", "1h-30m", "nan", "24 h"]
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(BadValue, match=r"^--ttl: ") as caught:
        parse_duration(text, "--ttl")
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize("text", ["-1h", "-5", " -90s", "-1h30m", "-.5h", "-0"])
def test_negative_durations(text: str) -> None:
    with pytest.raises(BadValue) as caught:
        parse_duration(text, "--ttl")
    assert str(caught.value) == f"--ttl: ttl must not be negative, got {text!r}"


@pytest.mark.parametrize("text", ["-5", "-1MiB", "-0.5KB", "-0"])
def test_negative_sizes(text: str) -> None:
    with pytest.raises(BadValue) as caught:
        parse_size(text, "--max-bytes")
    assert str(caught.value) == f"--max-bytes: max-bytes must not be negative, got {text!r}"


@pytest.mark.parametrize(
    ("text", "parse"), [("-1x", parse_duration), ("--5", parse_duration), ("-lots", parse_size)]
)
def test_a_malformed_value_after_a_minus_sign_is_malformed(text: str, parse: Any) -> None:
    with pytest.raises(BadValue, match=r"is not a (duration|size)") as caught:
        parse(text, "--opt")
    assert repr(text) in str(caught.value)


def test_bad_value_is_a_value_error() -> None:
    assert issubclass(BadValue, ValueError)
