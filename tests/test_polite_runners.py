"""Runner processes with the built-in fetcher against sites on loopback addresses (one host each): a
``429`` with ``Retry-After`` backs its host off for every runner, while the other site keeps being served;
and per-host pacing holds the requests each site receives apart across runner processes."""

from __future__ import annotations

import itertools
import socket
import struct
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


# -- Requests as the sites see them: kernel receive times ----------------------------------------------

#: Five sites, five hosts, paced by the default policy; the first answers its first request 429.
PACED_SITES = [f"127.0.0.{n}" for n in range(4, 9)]
PER_SITE = 20
INTERVAL = 0.5
#: Linux's SO_TIMESTAMPNS (the socket module does not name it): each read carries the time the kernel
#: received the data, which a busy test process reading it late does not move.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


class StampedSites:
    """Sites answering one request a connection; each request's arrival is the kernel's receive time of
    its first bytes (unix seconds). The first site answers its first request 429 with ``Retry-After``."""

    def __init__(self) -> None:
        self.seen: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.lock = threading.Lock()
        self.bases: dict[str, str] = {}
        self.listeners: list[socket.socket] = []

    def serve(self, host: str) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # inherited by each accepted socket
        listener.bind((host, 0))
        listener.listen(64)
        self.bases[host] = f"http://{host}:{listener.getsockname()[1]}"
        self.listeners.append(listener)
        threading.Thread(target=self._accept, args=(listener, host), daemon=True).start()

    def _accept(self, listener: socket.socket, host: str) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            threading.Thread(target=self._answer, args=(conn, host), daemon=True).start()

    def _answer(self, conn: socket.socket, host: str) -> None:
        with conn:
            data, arrived = b"", None
            while b"\r\n\r\n" not in data:
                chunk, ancillary, _, _ = conn.recvmsg(4096, socket.CMSG_SPACE(16))
                if not chunk:
                    return
                for level, kind, value in ancillary:
                    if arrived is None and level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                        seconds, nanoseconds = struct.unpack("qq", value[:16])
                        arrived = seconds + nanoseconds / 1e9
                data += chunk
            assert arrived is not None, "the kernel gave no receive time"
            with self.lock:
                status = 429 if host == PACED_SITES[0] and not self.seen[host] else 200
                self.seen[host].append((arrived, status))
            body = b"busy" if status == 429 else b"page"
            retry_after = f"Retry-After: {RETRY_AFTER}\r\n" if status == 429 else ""
            conn.sendall(
                f"HTTP/1.1 {status} X\r\n{retry_after}Content-Type: text/plain\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )

    def close(self) -> None:
        for listener in self.listeners:
            listener.close()


def test_paced_sites_never_see_two_requests_closer_than_the_interval(shared_store: str) -> None:
    sites = StampedSites()
    for host in PACED_SITES:
        sites.serve(host)
    try:
        dcache.set_host_policy("*", min_interval=INTERVAL)
        for n, host in enumerate(PACED_SITES):
            targets = [
                dcache.BatchTarget(idx=i, url=f"{sites.bases[host]}/{i}", options="{}")
                for i in range(PER_SITE)
            ]
            dcache.create_batch_job(
                make_job(f"site-{n}", caller=f"caller-{n % 2}", targets_total=PER_SITE), targets
            )
        runners = [SPAWN.Process(target=run_runner, args=(shared_store, f"paced-{n}")) for n in range(4)]
        for runner in runners:
            runner.start()
        try:
            until_final([f"site-{n}" for n in range(len(PACED_SITES))])
        finally:
            for runner in runners:
                runner.terminate()
            for runner in runners:
                runner.join(60)
    finally:
        sites.close()
    assert [runner.exitcode for runner in runners] == [0] * 4
    assert (
        sum(len(seen) for seen in sites.seen.values()) == len(PACED_SITES) * PER_SITE + 1
    )  # the 429'd again
    for host in PACED_SITES:
        arrivals = sorted(at for at, _ in sites.seen[host])
        gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
        assert min(gaps) >= INTERVAL, (host, min(gaps))
    refused = sorted(sites.seen[PACED_SITES[0]])
    assert [status for _, status in refused] == [429] + [200] * PER_SITE
    assert refused[1][0] >= refused[0][0] + RETRY_AFTER  # the site was left alone as long as it asked
    for n in range(len(PACED_SITES)):
        targets = dcache.batch_targets(f"site-{n}") or []
        assert [t.status for t in targets] == ["done"] * PER_SITE
        # each request left once: a target given back untried got its attempt back
        assert sorted(t.attempts for t in targets) == [1] * (PER_SITE - (n == 0)) + [2] * (n == 0)
    assert dcache.check_store().ok
