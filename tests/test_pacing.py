"""Host policies and back-off: what ``set_host_policy``, ``host_policies`` and ``back_off_host`` store, one
transaction each; how claims follow them is below."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from helpers import snapshot

from sift import dcache
from sift.dcache import HostPolicy
from sift.dcache.politeness import MAX_BACK_OFF


def test_a_policy_is_stored_under_the_site_name(store: Any) -> None:
    assert dcache.set_host_policy("Exämple.COM.:8443", max_running=2, min_interval=0.25) == HostPolicy(
        "xn--exmple-cua.com", 2, 0.25, None, None
    )
    assert dcache.set_host_policy("*", min_interval=datetime.timedelta(milliseconds=1500)).min_interval == 1.5
    for spelling in ("2130706433", "0x7f000001", "127.1", "[::ffff:127.0.0.1]", "::ffff:127.0.0.1"):
        assert dcache.set_host_policy(spelling, max_running=1).host == "127.0.0.1"
    assert dcache.host_policies() == [
        HostPolicy("*", None, 1.5, None, None),
        HostPolicy("127.0.0.1", 1, None, None, None),
        HostPolicy("xn--exmple-cua.com", 2, 0.25, None, None),
    ]


def test_none_clears_a_setting(store: Any) -> None:
    dcache.set_host_policy("example.com", max_running=3, min_interval=2)
    assert dcache.set_host_policy("example.com", min_interval=2) == HostPolicy(
        "example.com", None, 2.0, None, None
    )
    assert dcache.set_host_policy("example.com") == HostPolicy("example.com", None, None, None, None)


def test_a_back_off_never_shortens_and_is_capped(store: Any) -> None:
    assert dcache.back_off_host("example.com", 1_030.5, now=1_000) == 1_030.5
    assert dcache.back_off_host("EXAMPLE.com", 1_010, now=1_000) == 1_030.5  # a shorter one changes nothing
    assert dcache.back_off_host("example.com", 1e12, now=1_000) == 1_000 + MAX_BACK_OFF
    (policy,) = dcache.host_policies()
    assert policy == HostPolicy("example.com", None, None, None, 1_000 + MAX_BACK_OFF)
    dcache.set_host_policy("example.com", max_running=1)  # a policy keeps the back-off
    assert dcache.host_policies()[0].backed_off_until == 1_000 + MAX_BACK_OFF


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: dcache.set_host_policy("", max_running=1), "host"),
        (lambda: dcache.set_host_policy("https://example.com/x", max_running=1), "host"),
        (lambda: dcache.set_host_policy(" example.com", max_running=1), "host"),
        (lambda: dcache.set_host_policy(7, max_running=1), "host"),  # type: ignore[arg-type]
        (lambda: dcache.set_host_policy("a.com", max_running=0), "max_running"),
        (lambda: dcache.set_host_policy("a.com", max_running=True), "max_running"),
        (lambda: dcache.set_host_policy("a.com", min_interval=-1), "min_interval"),
        (lambda: dcache.set_host_policy("a.com", min_interval=float("nan")), "min_interval"),
        (lambda: dcache.set_host_policy("a.com", min_interval=10**9), "min_interval"),
        (lambda: dcache.set_host_policy("a.com", min_interval="1"), "min_interval"),
        (lambda: dcache.back_off_host("*", 2_000, now=1_000), "host"),
        (lambda: dcache.back_off_host("a.com", float("inf"), now=1_000), "until"),
        (lambda: dcache.back_off_host("a.com", "2000", now=1_000), "until"),  # type: ignore[arg-type]
        (lambda: dcache.back_off_host("a.com", 2_000, now=-1), "now"),
    ],
)
def test_bad_input_names_its_field_and_changes_nothing(store: Any, call: Any, field: str) -> None:
    dcache.set_host_policy("a.com", max_running=2, min_interval=1)
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as caught:
        call()
    assert caught.value.field == field
    assert snapshot() == before
