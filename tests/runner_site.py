"""A site on 127.0.0.1 for the runner's tests, recording when each path was asked for, and the fetch the
tests give their runners (urllib; ``python tests/runner_site.py STORE NAME ...`` runs a runner process)."""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sift import dcache
from sift.runner import Fail, GiveBack, Retry, Runner


class Site:
    """Paths: /ok/N answers 200; /missing/N 404; /busy/N 503 with ``Retry-After: 1`` the first time, then
    200; /slow/N 200 after 0.3 s; /hang/N 200 once ``release`` is set. ``times[path]``: when each request
    came (unix seconds)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = defaultdict(list)
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.base = ""

    def asked(self, prefix: str = "/") -> int:
        with self.lock:
            return sum(len(times) for path, times in self.times.items() if path.startswith(prefix))


def _handler(site: Site) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with site.lock:
                site.times[self.path].append(time.time())
                seen = len(site.times[self.path])
            kind = self.path.split("/")[1]
            if kind == "missing":
                self._answer(404, "no such page")
            elif kind == "busy" and seen == 1:
                self._answer(503, "busy", {"Retry-After": "1"})
            elif kind == "slow":
                time.sleep(0.3)
                self._answer(200, f"slow {self.path}")
            elif kind == "hang":
                site.release.wait(120)
                self._answer(200, f"hung {self.path}")
            else:
                self._answer(200, f"page {self.path}")

        def _answer(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
            data = body.encode()
            try:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the runner that asked was killed
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serving() -> Iterator[Site]:
    site = Site()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(site))
    server.daemon_threads = True
    site.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        site.release.set()
        server.shutdown()
        server.server_close()


def fetch(target: dcache.BatchTarget) -> str:
    """GET the target's URL: 2xx is its body (and the pid that fetched it), 404 fails, 503 retries after
    its Retry-After."""
    try:
        with urllib.request.urlopen(target.url, timeout=60) as answer:
            return f"{answer.read().decode()} by {os.getpid()}"
    except urllib.error.HTTPError as error:
        if error.code == 404:
            raise Fail(f"HTTP {error.code}", hint="the page is gone") from None
        if error.code == 503:
            raise Retry(f"HTTP {error.code}", after=float(error.headers["Retry-After"])) from None
        raise


def fetch_private(target: dcache.BatchTarget, *, allow_private: bool = False) -> str:
    """``fetch``, for a runner made with ``allow_private=True``: it refuses to run without it."""
    if not allow_private:
        raise Fail("private addresses are not allowed")
    return fetch(target)


_GIVEN_BACK: set[str] = set()
_GIVEN_BACK_LOCK = threading.Lock()


def fetch_give_back_once(target: dcache.BatchTarget) -> str:
    """``fetch``, but each URL is given back untried (``GiveBack``) the first time this process sees it."""
    with _GIVEN_BACK_LOCK:
        url = str(target.url)
        first = url not in _GIVEN_BACK
        _GIVEN_BACK.add(url)
    if first:
        raise GiveBack("not this time")
    return fetch(target)


def main(store: str, name: str, concurrency: str, stale_after: str, renew_every: str, grace: str) -> None:
    """A runner process: runs until SIGTERM (then exits 0) or SIGKILL."""
    dcache.open_db(store)
    runner = Runner(
        fetch,
        name=name,
        concurrency=int(concurrency),
        stale_after=float(stale_after),
        renew_every=float(renew_every),
    )
    runner.run(grace=float(grace))
    dcache.close_db()


if __name__ == "__main__":
    main(*sys.argv[1:])
