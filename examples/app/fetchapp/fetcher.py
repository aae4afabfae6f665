"""A stub fetcher: no network. It sleeps a little, as a fetch would, and returns a result envelope; a URL
whose host ends in ``.invalid`` (a name that never resolves, RFC 6761) fails, every time."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlsplit

#: A URL whose host ends so fails to fetch: how a test (or a demo) gets failed targets on purpose.
FAILING_HOST_SUFFIX = ".invalid"


class FetchFailed(Exception):
    """The URL could not be fetched; the message says why (it becomes the target's error)."""


def envelope(url: str) -> str:
    """The result the stub stores for ``url``: a JSON envelope of a fetched page."""
    page = {"url": url, "status": 200, "content_type": "text/plain", "body": f"stub page of {url}"}
    return json.dumps(page, sort_keys=True, separators=(",", ":"))


class StubFetcher:
    """``fetch(url, options)``: sleeps ``delay`` seconds, then returns :func:`envelope` of ``url``, or raises
    :class:`FetchFailed` for a host ending in ``.invalid``."""

    def __init__(self, delay: float = 0.02) -> None:
        self.delay = delay

    def __call__(self, url: str, options: Any = None) -> str:
        time.sleep(self.delay)
        host = urlsplit(url).hostname or ""
        if host.endswith(FAILING_HOST_SUFFIX):
            raise FetchFailed(f"{host}: no such host")
        return envelope(url)
