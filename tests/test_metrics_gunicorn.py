"""Metrics under a real gunicorn with several workers, recycled by ``--max-requests``: with
``PROMETHEUS_MULTIPROC_DIR`` every scrape, whichever worker answers it, reports every worker's counts. The
app is the multiprocess recipe of docs/how-to/operating.md, as written, with a create route added."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from docs_pages import block
from prometheus_client.parser import text_string_to_metric_families

TESTS = Path(__file__).resolve().parent
WORKERS = 3
#: Each worker is replaced after this many requests (scrapes included), so counts outlive their worker.
MAX_REQUESTS = 7
CREATES = 40
SCRAPES = 8
#: How long the server may take to answer its first request, seconds (a liveness bound, not a speed one).
START_S = 60


#: Added to the recipe's app: a route that creates a job of one target and says which worker served it.
CREATE_ROUTE = """

def app_with_a_create_route() -> Flask:
    from server_apps import create_one

    app = create_app()
    app.post("/jobs")(create_one)
    return app
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def served(command: list[str], env: dict[str, str], probe: str) -> Iterator[None]:
    """A server process started with ``command``, once ``probe`` (a URL) answers; stopped with SIGTERM
    afterwards (killed if it does not stop within ``START_S``). Fails the test with the server's stderr if
    it dies or does not answer within ``START_S``."""
    server = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                httpx.get(probe, timeout=5)
                break
            except httpx.TransportError:
                if server.poll() is not None or time.monotonic() > deadline:
                    server.kill()
                    pytest.fail(f"{command[2]} did not serve: {server.communicate()[1][-2000:]}")
                time.sleep(0.1)
        yield
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.communicate(timeout=START_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()


@pytest.fixture
def gunicorn(shared_store: str, tmp_path: Path) -> Iterator[str]:
    """A gunicorn of 3 sync workers serving the docs' multiprocess app on the store; its URL."""
    pytest.importorskip("gunicorn")
    counts = tmp_path / "prometheus"
    counts.mkdir()  # empty before the server starts, as prometheus_client's multiprocess mode asks
    app = tmp_path / "app"
    app.mkdir()
    (app / "recipe_app.py").write_text(block("metrics-multiprocess") + CREATE_ROUTE)
    port = free_port()
    env = {
        **os.environ,
        "SIFT_DB": shared_store,
        "PROMETHEUS_MULTIPROC_DIR": str(counts),
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable, "-m", "gunicorn", "--workers", str(WORKERS), "--bind", f"127.0.0.1:{port}",
        "--max-requests", str(MAX_REQUESTS), "--chdir", str(app), "recipe_app:app_with_a_create_route()",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with served(command, env, f"{url}/metrics"):
        yield url


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.slow
def test_every_scrape_reports_the_creates_of_every_worker(gunicorn: str) -> None:
    pids = set()
    with httpx.Client(timeout=30) as client:
        for _ in range(CREATES):
            answer = client.post(f"{gunicorn}/jobs")
            assert answer.status_code == 201, answer.text
            pids.add(answer.json()["pid"])
    assert len(pids) > WORKERS, f"the workers were not recycled: {sorted(pids)}"
    for _ in range(SCRAPES):  # each scrape reaches one worker, some of them new
        found = scrape(gunicorn)
        assert found["sift_jobs_created_total"] == CREATES
        assert found["sift_targets_put_total"] == CREATES
        assert found["sift_live_batch_jobs"] == CREATES  # a gauge: read from the store
