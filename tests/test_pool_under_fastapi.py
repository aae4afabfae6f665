"""PostgreSQL's pool under a real uvicorn serving FastAPI's plain ``def`` endpoints: anyio runs them on 40
threads, and a store opened with ``max_connections=5`` serves 20 concurrent clients without an error,
never holding more than 5 server connections (each thread holds one for one call or one transaction)."""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from conftest import POSTGRES_URL, drop_schema, postgres_target
from test_metrics_gunicorn import TESTS, free_port, served

pytestmark = pytest.mark.postgres

CONNECTIONS = 5
CLIENTS = 20
#: How long the clients run, seconds: short by default, ``SIFT_LOAD_S=20`` for the figures in the docs.
LOAD_S = float(os.environ.get("SIFT_LOAD_S", "5"))


@pytest.fixture
def server(postgres_schema: str) -> Iterator[tuple[str, str]]:
    """uvicorn serving tests/server_apps.py's FastAPI app on a schema of its own; its URL and the
    application_name its connections carry."""
    pytest.importorskip("uvicorn")
    schema = f"{postgres_schema}_srv"
    name = f"sift-pool-{secrets.token_hex(4)}"
    port = free_port()
    env = {
        **os.environ,
        "SIFT_DB": postgres_target(schema),
        "SIFT_MAX_CONNECTIONS": str(CONNECTIONS),
        "PGAPPNAME": name,  # libpq's: every connection of the server shows it in pg_stat_activity
    }
    command = [
        sys.executable, "-m", "uvicorn", "--factory", "server_apps:fastapi_app", "--app-dir", str(TESTS),
        "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        with served(command, env, f"{url}/jobs/none"):
            yield url, name
    finally:
        drop_schema(schema)


def client(url: str, number: int, until: float, latencies: list[float], errors: list[str]) -> None:
    """Submit a job of 3 targets and poll it twice, again until ``until``; every answer must be a success."""
    with httpx.Client(base_url=url, timeout=60) as http:
        n = 0
        while time.monotonic() < until:
            n += 1
            body = {"key": f"c{number}-{n}", "urls": [f"https://h{i}.example/{n}" for i in range(3)]}
            job_id = ""
            for poll in (False, True, True):
                started = time.monotonic()
                try:
                    answer = http.get(f"/jobs/{job_id}") if poll else http.post("/jobs", json=body)
                except httpx.HTTPError as exc:
                    errors.append(repr(exc))
                    return
                latencies.append(time.monotonic() - started)
                if answer.status_code != (200 if poll else 202):
                    errors.append(f"{answer.status_code}: {answer.text[:300]}")
                    return
                job_id = job_id or answer.json()["id"]


@pytest.mark.slow
def test_forty_threads_share_five_connections(server: tuple[str, str]) -> None:
    url, name = server
    latencies: list[float] = []
    errors: list[str] = []
    most = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal most
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            while not stop.is_set():
                row = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
                ).fetchone()
                most = max(most, int(row[0]) if row else 0)
                time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    until = time.monotonic() + LOAD_S
    clients = [
        threading.Thread(target=client, args=(url, n, until, latencies, errors)) for n in range(CLIENTS)
    ]
    try:
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
    finally:
        stop.set()
        watcher.join()
    assert errors == []
    assert 1 <= most <= CONNECTIONS, f"{most} server connections were open at once"
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99)]
    print(  # measured, never asserted: pytest -s shows it
        f"\n{len(latencies)} requests by {CLIENTS} clients in {LOAD_S:g} s, 0 errors; "
        f"p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {latencies[-1] * 1000:.1f} ms; at most {most} server connections"
    )
