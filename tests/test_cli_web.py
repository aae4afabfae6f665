"""``sift web``: a real server on 127.0.0.1 in its own process, on both backends; the bind rule, the token,
read-only mode, and SIGTERM."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers import snapshot
from web_helpers import sift_web, token_file

from sift import dcache
from sift.dcache import JobStatus

pytestmark = pytest.mark.slow


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return str(response.read().decode("utf-8"))


def post(url: str, fields: dict[str, str], token: str | None = None) -> tuple[int, str]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, urllib.parse.urlencode(fields).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8")


def test_serves_pages_and_acts_with_the_token(shared_store: str, tmp_path: Path) -> None:
    job = dcache.submit("alice", ["https://a.example/1", "https://a.example/2"]).job_id
    with sift_web(shared_store, "--token-file", token_file(tmp_path)) as (base, _):
        assert 'id="job-status">queued<' in get(f"{base}/jobs/{job}")
        for page in ("/", "/jobs", "/callers", "/hosts", "/runners"):
            assert "<nav>" in get(base + page)
        before = snapshot()
        assert post(f"{base}/actions/cancel", {"subject": job})[0] == 403
        assert post(f"{base}/actions/cancel", {"subject": job}, token="wrong")[0] == 403
        assert snapshot() == before
        status, body = post(f"{base}/actions/cancel", {"subject": job}, token="s3cret-token")
        assert status == 200 and json.loads(body)["result"] is True
    found = dcache.batch_job(job)
    assert found is not None and found.status == JobStatus.CANCELLED


def test_read_only_refuses_every_action(shared_store: str, tmp_path: Path) -> None:
    job = dcache.submit("alice", ["https://a.example/1"]).job_id
    with sift_web(shared_store, "--read-only", "--token-file", token_file(tmp_path)) as (base, _):
        assert 'method="post"' not in get(f"{base}/jobs/{job}")
        before = snapshot()
        assert post(f"{base}/actions/cancel", {"subject": job}, token="s3cret-token")[0] == 403
        assert post(f"{base}/actions/requeue_stale", {}, token="s3cret-token")[0] == 403
        assert snapshot() == before


def run_sift(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sift", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("bind", ["0.0.0.0:8765", "example.com:80", "[::]:0", "10.0.0.1:8000"])
def test_refuses_a_non_loopback_bind_without_a_token(file_store: Path, bind: str) -> None:
    done = run_sift("web", "--db", str(file_store), "--bind", bind)
    assert done.returncode == 1
    assert "is not a loopback address: give --token-file" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bind", "nowhere"], "--bind: must be HOST:PORT"),
        (["--token-file", "/nonexistent/token"], "--token-file: cannot read"),
        (["--budget", "0"], "budget"),
    ],
)
def test_bad_arguments_exit_1_naming_the_option(file_store: Path, args: list[str], message: str) -> None:
    done = run_sift("web", "--db", str(file_store), *args)
    assert done.returncode == 1 and message in done.stderr, done.stderr


def test_a_missing_store_is_refused(tmp_path: Path) -> None:
    done = run_sift("web", "--db", str(tmp_path / "missing.db"))
    assert done.returncode == 1 and "no store" in done.stderr
    assert not (tmp_path / "missing.db").exists()


def test_without_a_token_file_a_token_is_made_and_printed(file_store: Path) -> None:
    command = [sys.executable, "-m", "sift", "web", "--db", str(file_store), "--bind", "127.0.0.1:0"]
    process: Any = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = process.stderr.readline()
        assert "actions need this run's token: " in said
        token = said.rsplit(" ", 1)[1].strip()
        base = process.stdout.readline().split(" on ")[1].strip().rstrip("/")
        job = dcache.submit("alice", ["https://a.example/1"]).job_id
        assert post(f"{base}/actions/cancel", {"subject": job})[0] == 403
        assert post(f"{base}/actions/cancel", {"subject": job}, token=token)[0] == 200
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0
        process.stdout.close()
        process.stderr.close()
