"""What counts as one host: url_host, as the per-host claim limit counts it."""

from __future__ import annotations

import pytest

from sift import dcache


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://example.com/a", "example.com"),
        ("https://Example.COM/a", "example.com"),  # lower-cased
        ("https://user:secret@example.com:8443/a", "example.com"),  # no userinfo, no port
        ("http://example.com./a", "example.com"),  # the root's trailing dot names the same host
        ("HTTP://a.example.com", "a.example.com"),  # a subdomain is a host of its own
        ("http://[2001:DB8::1]:8080/", "2001:db8::1"),  # IPv6 without its brackets
        ("http://127.0.0.1:80/", "127.0.0.1"),
        ("//example.com/a", "example.com"),  # an authority without a scheme
        ("http://münchen.DE/", "münchen.de"),  # as written, lower-cased: no IDNA encoding
        ("example.com/a", ""),  # no authority: the "no host" host
        ("mailto:someone@example.com", ""),
        ("http://[::1/", ""),  # Python cannot split it
        ("file:///etc/hosts", ""),
    ],
)
def test_the_host_of_a_url(url: str, host: str) -> None:
    assert dcache.url_host(url) == host
