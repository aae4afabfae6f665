"""Runner processes with the built-in fetcher against sites on loopback addresses (one host each): a
``429`` with ``Retry-After`` backs its host off for every runner, while the other site keeps being served;
and per-host pacing holds the claims of one host apart across runner processes."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from helpers import SPAWN, make_job

from sift import dcache

pytestmark = pytest.mark.slow

#: Two sites, two hosts: url_host tells 127.0.0.2 and 127.0.0.3 apart (the ports do not count).
STEADY, LIMITED = "127.0.0.2", "127.0.0.3"
RETRY_AFTER = 3
ENDED = 180.0


class Sites:
    """Each request's arrival (unix seconds) and answer, by host; the limited host answers its first
    request 429 with ``Retry-After``, then 200; the steady one answers after 0.1 s."""

    def __init__(self) -> None:
        self.seen: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.lock = threading.Lock()
        self.bases: dict[str, str] = {}


def _handler(sites: Sites, host: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with sites.lock:
                first = not sites.seen[host]
                status = 429 if host == LIMITED and first else 200
                sites.seen[host].append((time.time(), status))
            if host == STEADY:
                time.sleep(0.1)
            body = b"busy" if status == 429 else f"page {self.path}".encode()
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", str(RETRY_AFTER))
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serving() -> Iterator[Sites]:
    sites = Sites()
    servers = []
    for host in (STEADY, LIMITED):
        server = ThreadingHTTPServer((host, 0), _handler(sites, host))
        server.daemon_threads = True
        sites.bases[host] = f"http://{host}:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    try:
        yield sites
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def run_runner(target: str, name: str) -> None:
    """A runner process with the built-in fetcher, allowed onto loopback; runs until SIGTERM."""
    from sift.runner import Runner
    from sift.runner.http import fetch

    dcache.open_db(target)
    Runner(fetch, name=name, concurrency=4, allow_private=True, stale_after=30, renew_every=2).run(grace=10)
    dcache.close_db()


def until_final(job_ids: list[str]) -> None:
    deadline = time.monotonic() + ENDED
    while time.monotonic() < deadline:
        jobs = [dcache.batch_job(job_id) for job_id in job_ids]
        if all(job is not None and job.targets_done == job.targets_total for job in jobs):
            return
        time.sleep(0.1)
    raise AssertionError("the runners did not finish the jobs")


def test_a_429_holds_its_host_back_for_every_runner(shared_store: str) -> None:
    with serving() as sites:
        # one target of the limited host at a time: the next is claimed only after the 429's retry was
        # written, which comes after the runner backed the host off
        dcache.set_host_policy(LIMITED, max_running=1)
        dcache.set_host_policy(STEADY, max_running=1)
        jobs = {"steady": (STEADY, 40), "limited": (LIMITED, 4)}
        for job_id, (host, count) in jobs.items():
            targets = [
                dcache.BatchTarget(idx=i, url=f"{sites.bases[host]}/{i}", options="{}") for i in range(count)
            ]
            dcache.create_batch_job(make_job(job_id, targets_total=count), targets)
        runners = [SPAWN.Process(target=run_runner, args=(shared_store, f"polite-{n}")) for n in range(2)]
        for runner in runners:
            runner.start()
        try:
            until_final(list(jobs))
        finally:
            for runner in runners:
                runner.terminate()  # SIGTERM: a graceful stop
            for runner in runners:
                runner.join(60)
        assert [runner.exitcode for runner in runners] == [0, 0]
        limited = sorted(sites.seen[LIMITED])
        steady = [at for at, _ in sites.seen[STEADY]]
    assert [status for _, status in limited] == [429] + [200] * 4
    refused_at = limited[0][0]
    assert limited[1][0] >= refused_at + RETRY_AFTER  # no runner asked the site again before its time
    assert any(refused_at < at < refused_at + RETRY_AFTER for at in steady)  # the other site went on
    for job_id, (_, count) in jobs.items():
        targets = dcache.batch_targets(job_id) or []
        assert [t.status for t in targets] == ["done"] * count
        job = dcache.batch_job(job_id)
        assert job is not None and job.targets_done == count and job.status == "done"
    assert [t.attempts for t in dcache.batch_targets("limited") or []].count(2) == 1  # the 429'd one, again
    assert dcache.check_store().ok
