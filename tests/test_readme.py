"""The README's web-app example runs as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from faults import locked_by_another_process
from helpers import make_job

from sift import dcache

README = Path(__file__).resolve().parent.parent / "README.md"


def web_app_example() -> dict[str, Any]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Using the store from a web app", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    namespace: dict[str, Any] = {}
    exec(compile(code.group(1), str(README), "exec"), namespace)
    return namespace


def test_web_app_example(tmp_path: Path) -> None:
    app = web_app_example()
    app["start"](str(tmp_path / "app.db"))
    try:
        status, body = app["submit"]("alice", "key-1", ["https://a.example/", "https://b.example/"])
        assert status == 202
        job_id = body["id"]
        assert app["submit"]("alice", "key-1", ["https://a.example/"]) == (200, {"id": job_id})
        assert app["poll"]("bob", job_id)[0] == 404
        app["run_one"](job_id, 0, '{"status": 200}')
        status, page = app["poll"]("alice", job_id)
        assert status == 200 and page["done"] == 1 and page["total"] == 2
        assert page["results"][0]["result"] == '{"status": 200}'
        status, error = app["submit"]("alice", "", ["https://a.example/", ""])
        assert status == 400 and error["error"].startswith("url:")
        assert dcache.BatchJob.select().count() == 1  # the bad submission left nothing behind
    finally:
        dcache.close_db()


def test_restart_reconciles(tmp_path: Path) -> None:
    app = web_app_example()
    path = str(tmp_path / "app.db")
    app["start"](path)
    job_id = app["submit"]("alice", "k", ["https://a.example/"])[1]["id"]
    app["start"](path)  # a new process start: the queued job died with the old one
    job = dcache.batch_job(job_id)
    assert job is not None and job.status == "failed" and job.error == "the service restarted"
    dcache.close_db()


def error_example() -> dict[str, Any]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Using the store from a web app", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "def answer(" in b]
    assert len(blocks) == 1
    namespace: dict[str, Any] = {"dcache": dcache}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    return namespace


def test_errors_as_http_answers(tmp_path: Path) -> None:
    answer = error_example()["answer"]
    path = tmp_path / "app.db"
    dcache.open_db(path, timeout=0.2)
    try:
        dcache.create_batch_job(make_job("job-1"))

        def touch(job_id: str, now: int) -> tuple[int, dict[str, Any]]:
            dcache.touch_batch_job(job_id, now=now)
            return 200, {}

        assert answer(lambda: touch("job-1", 5)) == (200, {})
        assert answer(lambda: touch("job-1", -1)) == (
            400,
            {"field": "now", "error": "now: must be a non-negative int, got -1"},
        )
        assert answer(lambda: touch("nope", 5)) == (404, {"error": "no such job"})
        with locked_by_another_process(path):
            status, _ = answer(lambda: touch("job-1", 6))
        assert status == 503
        assert answer(lambda: touch("job-1", 7)) == (200, {})
    finally:
        dcache.close_db()
