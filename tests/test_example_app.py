"""The example app (examples/app) as its README deploys it: `sift init`, a real gunicorn of several
workers on 127.0.0.1, two runner processes (one stopped by SIGTERM mid-load), and client threads that
submit (every idempotency key sent twice), cancel a job each, and poll until every job is final; then every
job's results, `check_store`, no 5xx, and every process exiting 0 on SIGTERM. On a SQLite WAL file and in
a PostgreSQL schema of its own. The example's own tests (sift.testing) run here too, on both backends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import POSTGRES_URL
from fetchapp.fetcher import FAILING_HOST_SUFFIX, envelope

from sift import dcache

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "app"
WORKERS, THREADS = 3, 4
RUNNERS = 2
CLIENTS, JOBS_PER_CLIENT = 6, 5
CANCELLED_JOB = 3  # each client cancels its job 3 right after submitting it
FAILING_JOB = 4  # each client's job 4 fails whole (urls_of)
#: Hang guards, seconds: how long a server may take to start, and the whole load to end. Never reached
#: when the app works; no test here measures speed.
START_S, LOAD_S = 60, 300


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop(process: subprocess.Popen[str], log: Path | None = None) -> tuple[int, str]:
    """SIGTERM, then its exit code and its stderr, or the ``log`` it wrote it to (killed after the hang
    guard)."""
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=START_S)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    return process.returncode, err if log is None else log.read_text()


def runner_log(tmp_path: Path, n: int) -> Path:
    """Where runner ``n`` writes its log (standard error)."""
    return tmp_path / f"runner-{n}.log"


def serve(target: str, tmp_path: Path) -> tuple[str, list[subprocess.Popen[str]]]:
    """The README's deployment: gunicorn (WORKERS x THREADS) and RUNNERS runners; the URL and processes."""
    port = free_port()
    counts = tmp_path / "prometheus"
    counts.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(counts)}
    gunicorn = [
        sys.executable, "-m", "gunicorn", "--workers", str(WORKERS), "--threads", str(THREADS),
        "--bind", f"127.0.0.1:{port}", "--chdir", str(EXAMPLE), f"fetchapp.web:create_app({target!r})",
    ]  # fmt: skip
    processes = [subprocess.Popen(gunicorn, env=env, stderr=subprocess.PIPE, text=True)]
    for n in range(RUNNERS):
        runner = [
            sys.executable,
            "-m",
            "fetchapp.runner",
            "--db",
            target,
            "--name",
            f"runner-{n}",
            "--renew-every",
            "1",
        ]
        with runner_log(tmp_path, n).open("w") as log:  # read while it runs: it says when it has started
            processes.append(subprocess.Popen(runner, cwd=EXAMPLE, env=env, stderr=log, text=True))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_S
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=5).raise_for_status()
            return url, processes
        except httpx.TransportError:
            if processes[0].poll() is not None or time.monotonic() > deadline:
                for process in processes:
                    process.kill()
                pytest.fail(f"gunicorn did not serve: {processes[0].communicate()[1][-2000:]}")
            time.sleep(0.1)


def urls_of(client: int, job: int) -> list[str]:
    """Each job's URLs: most fetch, some fail (FAILING_HOST_SUFFIX); every fifth job fails whole."""
    if job == FAILING_JOB:
        return [f"https://c{client}-{i}{FAILING_HOST_SUFFIX}/" for i in range(2)]
    failing = [f"https://down-{client}-{job}{FAILING_HOST_SUFFIX}/"] if job % 2 else []
    return [f"https://c{client}.example/{job}/{i}" for i in range(2 + job * 3)] + failing


class Load:
    """CLIENTS threads, each submitting JOBS_PER_CLIENT jobs (each key sent twice) and polling each job
    until it is final; every answer's status is recorded."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[int] = []
        self.jobs: dict[tuple[int, int], tuple[str, dict[str, Any]]] = {}
        self.errors: list[str] = []
        self.cancels: dict[tuple[int, int], int] = {}
        self.remade = 0  # keys sent again after their job had failed: each made a new job
        self.lock = threading.Lock()

    def request(self, http: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
        answer = http.request(method, f"{self.url}{path}", **kwargs)
        with self.lock:
            self.answers.append(answer.status_code)
        return answer

    def finished_page(self, http: httpx.Client, caller: dict[str, str], job_id: str, deadline: float) -> Any:
        """The job's page once it has finished, polled until ``deadline``."""
        while True:
            page = self.request(http, "GET", f"/v1/jobs/{job_id}", headers=caller).json()
            if page["status"] not in ("queued", "running"):
                return page
            assert time.monotonic() < deadline, f"job {job_id} never finished: {page}"
            time.sleep(0.05)

    def client(self, n: int) -> None:
        caller = {"X-Caller": f"client-{n}"}
        try:
            with httpx.Client(timeout=30) as http:
                ids: list[str] = []
                remade: list[str] = []
                for job in range(JOBS_PER_CLIENT):
                    headers = {**caller, "Idempotency-Key": f"job-{job}"}
                    body = {"urls": urls_of(n, job)}
                    first = self.request(http, "POST", "/v1/jobs", json=body, headers=headers)
                    retry = self.request(http, "POST", "/v1/jobs", json=body, headers=headers)
                    if job == FAILING_JOB and retry.status_code == 202:
                        # its job failed before the key came again: a failed job is not a key's (the
                        # idempotency rule), so the second request made a new job
                        was = self.request(http, "GET", f"/v1/jobs/{first.json()['id']}", headers=caller)
                        assert (first.status_code, was.json()["status"]) == (202, "failed"), was.text
                        assert retry.json()["id"] != first.json()["id"]
                        remade.append(retry.json()["id"])
                    else:
                        assert (first.status_code, retry.status_code) == (202, 200), (first.text, retry.text)
                        assert retry.json()["id"] == first.json()["id"]
                    ids.append(first.json()["id"])
                    if job == CANCELLED_JOB:  # cancelled at once: it may finish first (409)
                        cancel = self.request(http, "POST", f"/v1/jobs/{ids[-1]}/cancel", headers=caller)
                        assert cancel.status_code in (200, 409), cancel.text
                        with self.lock:
                            self.cancels[(n, job)] = cancel.status_code
                deadline = time.monotonic() + LOAD_S
                for job, job_id in enumerate(ids):
                    page = self.finished_page(http, caller, job_id, deadline)
                    with self.lock:
                        self.jobs[(n, job)] = (job_id, page)
                for job_id in remade:  # fails whole too, as the first did
                    page = self.finished_page(http, caller, job_id, deadline)
                    assert page["status"] == "failed", page
                    with self.lock:
                        self.remade += 1
        except Exception as exc:
            with self.lock:
                self.errors.append(f"client {n}: {exc!r}")

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.client, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        return threads

    def finished(self) -> int:
        with self.lock:
            return len(self.jobs) + len(self.errors)


def expected(urls: list[str]) -> tuple[str, list[tuple[str, str | None, str | None]]]:
    """The job's final status and each target's (status, result, error), by the stub fetcher's rule."""
    targets: list[tuple[str, str | None, str | None]] = []
    for url in urls:
        host = url.split("/")[2]
        failed = host.endswith(FAILING_HOST_SUFFIX)
        targets.append(("failed", None, f"{host}: no such host") if failed else ("done", envelope(url), None))
    failures = sum(t[0] == "failed" for t in targets)
    return ("done" if not failures else "failed" if failures == len(urls) else "partial"), targets


@pytest.mark.slow
def test_the_example_app_under_gunicorn_with_two_runners_one_stopped_mid_load(
    new_store: str, tmp_path: Path
) -> None:
    pytest.importorskip("gunicorn")
    init = subprocess.run(
        [sys.executable, "-m", "sift", "init", "--db", new_store], capture_output=True, text=True, check=False
    )
    assert init.returncode == 0 and "created a new store" in init.stdout, init.stderr
    url, processes = serve(new_store, tmp_path)
    try:
        load = Load(url)
        clients = load.start()
        deadline = time.monotonic() + LOAD_S
        while not load.finished():  # the first job is final: runner-0 stops mid-load, as on a deploy
            assert time.monotonic() < deadline, "no job ever finished"
            time.sleep(0.05)
        # as on a deploy, a runner that has started: one still starting (a busy machine) dies of the SIGTERM
        while "runner-0 started" not in runner_log(tmp_path, 0).read_text():
            assert processes[1].poll() is None and time.monotonic() < deadline, "runner-0 never started"
            time.sleep(0.05)
        code, err = stop(processes[1], runner_log(tmp_path, 0))
        assert code == 0 and "runner-0 stopped; released" in err, err[-2000:]
        for thread in clients:  # runner-1 finishes the rest, runner-0's released claims included
            thread.join()
        assert load.errors == []
        cancel = httpx.post(f"{url}/v1/jobs/{load.jobs[(0, 0)][0]}/cancel", headers={"X-Caller": "client-0"})
        assert cancel.status_code == 409  # finished already
        scrape = httpx.get(f"{url}/metrics", timeout=30).text
    finally:
        logs = [None, *(runner_log(tmp_path, n) for n in range(RUNNERS))]
        stopped = [
            stop(process, log)
            for process, log in reversed(list(zip(processes, logs, strict=True)))
            if process.returncode is None
        ]
    assert load.errors == []
    assert [code for code in load.answers if code >= 500] == []
    for code, err in stopped:  # the runners and gunicorn exit cleanly on SIGTERM
        assert code == 0, err[-2000:]
    made = CLIENTS * JOBS_PER_CLIENT + load.remade
    assert f"sift_jobs_created_total {float(made)}" in scrape  # every worker's creates
    assert len(load.jobs) == CLIENTS * JOBS_PER_CLIENT
    for (client, job), (_, page) in load.jobs.items():
        status, targets = expected(urls_of(client, job))
        found = [(r["status"], r["result"], r["error"]) for r in page["results"]]
        if load.cancels.get((client, job)) == 200:  # each target fetched, or failed by the cancel
            assert page["status"] == "cancelled"
            assert page["done"] == page["total"]
            by_cancel = ("failed", None, f"cancelled by client-{client}")
            assert all(got in [want, by_cancel] for got, want in zip(found, targets, strict=True))
        else:
            assert page["status"] == status
            assert found == targets
    assert len(load.cancels) == CLIENTS
    dcache.open_db(new_store, create=False)
    assert dcache.BatchJob.select().count() == made  # a retried key made no job but after its job failed
    left = dcache.BatchTarget.select(dcache.BatchTarget.job_id, dcache.BatchTarget.status).where(
        dcache.BatchTarget.status.not_in(["done", "failed"])
    )
    # every claim was written or released, and a cancel failed its job's unfinished targets: none is left
    assert [(target.job_id, target.status) for target in left] == []
    report = dcache.check_store()
    assert report.ok, report.violations


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_example_apps_own_tests_pass(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = {key: value for key, value in os.environ.items() if key != "SIFT_TEST_DB"}
    if backend == "postgres":
        request.getfixturevalue("postgres_schema")  # skips (or fails under CI) with no server
        env["SIFT_TEST_DB"] = POSTGRES_URL
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--basetemp={tmp_path / 'pt'}",
    ]
    run = subprocess.run(command, cwd=EXAMPLE, env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout
