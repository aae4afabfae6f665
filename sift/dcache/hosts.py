"""What counts as one host: the host a target's URL names, as politeness limits count it."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["url_host"]


def url_host(url: str) -> str:
    """The host of ``url``: its authority's host name, lower-cased, without userinfo, port, IPv6 brackets
    or a trailing dot (``https://User@Example.COM.:8443/x`` is ``example.com``). A URL without an authority
    (no ``//``), or one Python cannot split, has the host ``""``: all such URLs count as one host."""
    try:
        host = urlsplit(url).hostname
    except ValueError:  # an unbalanced IPv6 bracket
        return ""
    return (host or "").rstrip(".")
