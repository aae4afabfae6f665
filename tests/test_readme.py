"""The docs' web-app, deployment, testing and runner examples run as written (their blocks are found by the
``<!-- block: NAME -->`` comment before them: see docs_pages.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from docs_pages import block, block_path
from faults import locked_by_another_process
from helpers import make_job

from sift import dcache


def web_app_example() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(block("web-app"), block_path("web-app"), "exec"), namespace)
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
        assert status == 400 and error["field"] == "url" and error["error"].startswith("url:")
        assert dcache.BatchJob.select().count() == 1  # the bad submission left nothing behind
    finally:
        dcache.close_db()


def test_only_the_runner_reconciles(tmp_path: Path) -> None:
    app = web_app_example()
    path = str(tmp_path / "app.db")
    app["start"](path)
    job_id = app["submit"]("alice", "k", ["https://a.example/"])[1]["id"]
    app["start"](path)  # a web worker (re)starting: leaves its siblings' jobs alone
    job = dcache.batch_job(job_id)
    assert job is not None and job.status == "queued"
    app["start_runner"](path)  # the runner's start: the jobs in flight died with its previous run
    job = dcache.batch_job(job_id)
    assert job is not None and job.status == "failed" and job.error == "the runner restarted"
    dcache.close_db()


def error_example() -> dict[str, Any]:
    namespace: dict[str, Any] = {"dcache": dcache}
    exec(compile(block("web-app-errors"), block_path("web-app-errors"), "exec"), namespace)
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


def test_testing_your_app_examples(pytester: pytest.Pytester) -> None:
    """The web-app example's tests in "Testing your app", run as a user's project: the example as app.py,
    the opt-in as conftest.py, the tests as test_app.py."""
    conftest, tests = block("testing-conftest"), block("testing-tests")
    assert conftest.strip() == 'pytest_plugins = ["sift.testing"]'
    pytester.makepyfile(app=block("web-app"), test_app=tests)
    pytester.makeconftest(conftest)
    result = pytester.runpytest("--strict-markers", "-W", "error", "-p", "no:cacheprovider")
    count = len(re.findall(r"^def test_", tests, re.M))
    assert count >= 4
    result.assert_outcomes(passed=count)
    assert dcache.db.is_closed()


def test_the_deployments_flask_hooks_from_8_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deployment's Flask app, as written (only its store path changed), with Peewee's request hooks,
    serving polls and submissions from 8 threads: every request answers, the totals are exact."""
    import sys
    import threading
    import types

    import flask

    web_app = web_app_example()
    store = types.ModuleType("myapp.store")
    store.start = web_app["start"]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "myapp", types.ModuleType("myapp"))
    monkeypatch.setitem(sys.modules, "myapp.store", store)
    web = types.ModuleType("myapp.web")
    web.__file__ = str(tmp_path / "web.py")  # Flask finds its root path by the module's file
    monkeypatch.setitem(sys.modules, "myapp.web", web)
    code = block("deploy-flask").replace("/var/lib/sift/sift.db", str(tmp_path / "web.db"))
    exec(compile(code, block_path("deploy-flask"), "exec"), web.__dict__)
    app = web.create_app()

    def submit(caller: str, key: str) -> Any:
        status, body = web_app["submit"](caller, key, ["https://a.example/", "https://b.example/"])
        return flask.jsonify(body), status

    def poll(caller: str, job_id: str) -> Any:
        status, body = web_app["poll"](caller, job_id)
        return flask.jsonify(body), status

    app.add_url_rule("/v1/batch/<caller>/<key>", view_func=submit, methods=["POST"])
    app.add_url_rule("/v1/batch/<caller>/<job_id>", view_func=poll, methods=["GET"])

    answers: list[int] = []
    errors: list[str] = []

    def client(t: int) -> None:
        try:
            with app.test_client() as http:
                for i in range(50):
                    reply = http.post(f"/v1/batch/caller-{t}/key-{i % 10}")
                    answers.append(reply.status_code)
                    answers.append(http.get(f"/v1/batch/caller-{t}/{reply.get_json()['id']}").status_code)
        except BaseException as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=client, args=(t,)) for t in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert sorted(set(answers)) == [200, 202]
        assert answers.count(202) == 8 * 10  # one job per caller and key, the repeats answered 200
        assert dcache.BatchJob.select().count() == 80
        assert dcache.check_store().ok
        assert not dcache.db.in_transaction() and not dcache.db.is_closed()
    finally:
        dcache.close_db()


def runner_example() -> dict[str, Any]:
    """The web-app example's namespace, with the "Many runners" example run in it."""
    namespace = web_app_example()
    exec(compile(block("runners"), block_path("runners"), "exec"), namespace)
    return namespace


def test_many_runners_example(tmp_path: Path) -> None:
    app = runner_example()
    app["start"](str(tmp_path / "app.db"))
    try:
        urls = [f"https://example.com/{i}" for i in range(7)]
        job_id = app["submit"]("alice", "k", urls)[1]["id"]
        other = app["submit"]("bob", "k", urls[:2])[1]["id"]
        beats: list[str] = []

        def fetch(url: str, options: str, heartbeat: Any) -> str:
            heartbeat()
            beats.append(url)
            if url.endswith("/3"):
                raise TimeoutError("slow host")
            return f"<body of {url}>"

        assert app["runner_step"](fetch) == 7  # 5 of alice's job, then bob's 2: per_job=5
        job, done = dcache.batch_job(job_id), dcache.batch_job(other)
        assert job is not None and (job.status, job.targets_done) == ("running", 5)
        assert done is not None and (done.status, done.targets_done) == ("done", 2)
        assert app["runner_step"](fetch) == 2
        job = dcache.batch_job(job_id)
        assert job is not None and (job.status, job.targets_done) == ("done", 7)
        targets = dcache.batch_targets(job_id) or []
        assert [t.status for t in targets].count("failed") == 1 and targets[3].error == "slow host"
        assert app["runner_step"](fetch) == 0
        assert len(beats) == 9
    finally:
        dcache.close_db()


class OneTurn:
    """A stop event for one turn of run_runner's loop, whose wait returns at once."""

    def __init__(self) -> None:
        self.asked = 0

    def is_set(self) -> bool:
        self.asked += 1
        return self.asked > 1

    def wait(self, timeout: float) -> bool:
        return True


def test_many_runners_example_rescues_a_dead_runners_job(tmp_path: Path) -> None:
    app = runner_example()
    app["start"](str(tmp_path / "app.db"))
    try:
        job_id = app["submit"]("alice", "k", ["https://a.example/", "https://b.example/"])[1]["id"]
        dcache.claim_batch_targets(2, now=1_000)  # a runner that claimed it all, then died long ago
        fresh = app["submit"]("bob", "k", ["https://c.example/"])[1]["id"]
        dcache.claim_batch_targets(1)  # a live runner's claim, just now
        stop = OneTurn()
        app["run_runner"](lambda url, options, heartbeat: "body", stop)  # nothing to claim: it rescues
        assert stop.asked == 2
        job, live = dcache.batch_job(job_id), dcache.batch_job(fresh)
        assert job is not None and (job.status, job.error) == (
            "failed",
            "its runner stopped sending heartbeats",
        )
        assert [t.status for t in dcache.batch_targets(job_id) or []] == ["running", "running"]
        assert live is not None and live.status == "running"
    finally:
        dcache.close_db()
