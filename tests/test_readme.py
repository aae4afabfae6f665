"""The docs' web-app, deployment, testing and runner examples run as written (their blocks are found by the
``<!-- block: NAME -->`` comment before them: see docs_pages.py)."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from docs_pages import block, block_path
from faults import locked_by_another_process
from helpers import make_job

from sift import dcache


def made(path: Path | str) -> str:
    """``path`` with an empty store in it, as ``sift init`` leaves it: the web app's ``start`` only opens."""
    dcache.open_db(path)
    dcache.close_db()
    return str(path)


def web_app_example() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(block("web-app"), block_path("web-app"), "exec"), namespace)
    return namespace


def test_web_app_example(tmp_path: Path) -> None:
    app = web_app_example()
    app["start"](made(tmp_path / "app.db"))
    try:
        status, body = app["submit"]("alice", "key-1", ["https://a.example/", "https://b.example/"])
        assert status == 202
        job_id = body["id"]
        again = app["submit"]("alice", "key-1", ["https://a.example/", "https://b.example/"])
        assert again == (200, {"id": job_id})
        status, conflict = app["submit"]("alice", "key-1", ["https://a.example/"])  # another request
        assert status == 409 and conflict["field"] == "idem_key" and conflict["id"] == job_id
        assert app["poll"]("bob", job_id)[0] == 404
        app["run_one"](job_id, 0, '{"status": 200}')
        status, page = app["poll"]("alice", job_id)
        assert status == 200 and page["done"] == 1 and page["total"] == 2
        assert page["results"][0]["result"] == '{"status": 200}'
        app["run_arrived"](job_id, {1: '{"status": 201}', 0: '{"status": 200}'})  # 0 again: counted once
        status, page = app["poll"]("alice", job_id)
        assert status == 200 and page["done"] == 2 and page["results"][1]["result"] == '{"status": 201}'
        status, error = app["submit"]("alice", "", ["https://a.example/", ""])
        assert status == 400 and error["field"] == "url" and error["error"].startswith("url:")
        assert dcache.BatchJob.select().count() == 1  # the bad submission left nothing behind
    finally:
        dcache.close_db()


def test_only_the_runner_reconciles(tmp_path: Path) -> None:
    app = web_app_example()
    path = made(tmp_path / "app.db")
    app["start"](path)
    started = app["submit"]("alice", "k2", ["https://a.example/", "https://b.example/"])[1]["id"]
    dcache.claim_batch_targets(1, runner="previous run")  # the runner died holding one target
    job_id = app["submit"]("alice", "k", ["https://a.example/"])[1]["id"]
    app["start"](path)  # a web worker (re)starting: leaves its siblings' jobs alone
    assert [t.status for t in dcache.batch_targets(started) or []] == ["running", "pending"]
    app["start_runner"](path)  # the runner's start: what its previous run held goes back to the queue
    job = dcache.batch_job(job_id)
    assert job is not None and job.status == "queued"  # never started: left alone
    targets = dcache.batch_targets(started) or []
    assert [(t.status, t.attempts) for t in targets] == [("pending", 1), ("pending", 0)]
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


@pytest.mark.slow
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
    code = block("deploy-flask").replace("/var/lib/sift/sift.db", made(tmp_path / "web.db"))
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
    app["start"](made(tmp_path / "app.db"))
    try:
        urls = [f"https://example.com/{i}" for i in range(7)]
        job_id = app["submit"]("alice", "k", urls)[1]["id"]
        other = app["submit"]("bob", "k", urls[:2])[1]["id"]
        fetched: list[str] = []

        def fetch(url: str, options: str) -> str:
            fetched.append(url)
            if url.endswith("/3"):
                raise TimeoutError("slow host")
            return f"<body of {url}>"

        assert app["runner_step"](fetch, "r1") == 7  # 5 of alice's job, then bob's 2: per_job=5
        job, done = dcache.batch_job(job_id), dcache.batch_job(other)
        assert job is not None and (job.status, job.targets_done) == ("running", 5)
        assert done is not None and (done.status, done.targets_done) == ("done", 2)
        assert app["runner_step"](fetch, "r1") == 2
        job = dcache.batch_job(job_id)
        assert job is not None and (job.status, job.targets_done) == ("partial", 7)
        targets = dcache.batch_targets(job_id) or []
        assert [t.status for t in targets].count("failed") == 1 and targets[3].error == "slow host"
        assert {t.runner for t in targets if t.status == "done"} == {"r1"}
        assert targets[3].runner is None  # a failed target's claim ended with its write
        assert app["runner_step"](fetch, "r1") == 0
        assert len(fetched) == 9
    finally:
        dcache.close_db()


def test_a_late_write_is_dropped_by_runner_step(tmp_path: Path) -> None:
    app = runner_example()
    app["start"](made(tmp_path / "app.db"))
    try:
        job_id = app["submit"]("alice", "k", ["https://a.example/"])[1]["id"]

        def slow_fetch(url: str, options: str) -> str:  # taken for dead while it fetched
            dcache.requeue_stale_claims(0)
            dcache.claim_batch_targets(1, runner="other")
            return "late"

        assert app["runner_step"](slow_fetch, "slow") == 1
        target = (dcache.batch_targets(job_id) or [])[0]
        assert (target.status, target.runner, target.result, target.attempts) == ("running", "other", None, 2)
        assert dcache.stats()["late_writes_refused"] == 1
    finally:
        dcache.close_db()


class Turns:
    """A stop event for keep_claims's timer: ``wait`` returns at once, and False for ``turns`` calls."""

    def __init__(self, turns: int) -> None:
        self.turns = turns

    def wait(self, timeout: float) -> bool:
        self.turns -= 1
        return self.turns < 0


def test_keep_claims_renews_this_runners_claims_and_requeues_the_stale(tmp_path: Path) -> None:
    app = runner_example()
    app["start"](made(tmp_path / "app.db"))
    try:
        job_id = app["submit"]("alice", "k", ["https://a.example/", "https://b.example/"])[1]["id"]
        now = dcache.unix_now()
        dcache.claim_batch_targets(1, runner="dead", now=now - app["STALE_AFTER"])  # died long ago
        dcache.claim_batch_targets(1, runner="me", now=now - app["STALE_AFTER"])  # alive, due to renew
        app["keep_claims"]("me", Turns(1))  # one turn of the timer, with no work to claim
        targets = dcache.batch_targets(job_id) or []
        assert [(t.status, t.runner) for t in targets] == [("pending", None), ("running", "me")]
        assert targets[1].heartbeat is not None and targets[1].heartbeat >= now
    finally:
        dcache.close_db()


def test_run_runner_works_and_releases_its_claims_when_stopped(tmp_path: Path) -> None:
    app = runner_example()
    app["start"](made(tmp_path / "app.db"))
    try:
        job_id = app["submit"]("alice", "k", [f"https://a.example/{i}" for i in range(12)])[1]["id"]
        held: list[int] = []

        def fetch(url: str, options: str) -> str:
            held.append(1)
            if len(held) == 3:
                stop.set()  # a stop asked for mid-claim: this claim's last 2 targets are still fetched
            return "body"

        stop = threading.Event()
        app["run_runner"](fetch, stop)
        targets = dcache.batch_targets(job_id) or []
        assert [t.status for t in targets] == ["done"] * 5 + ["pending"] * 7
        assert all(t.runner is None for t in targets[5:])
        dcache.claim_batch_targets(2, runner="stopping", now=10)
        assert dcache.release_claims("stopping") == 2  # what run_runner's finally does with its own
        assert [t.status for t in dcache.batch_targets(job_id) or []][5:7] == ["pending", "pending"]
    finally:
        dcache.close_db()


def _finish_once_waited(job_id: str, count: int) -> threading.Thread:
    """A runner's write of the job's one target, once ``count`` waits for it have started."""

    def run() -> None:
        waiters = dcache.db.backend.job_waiters()
        while waiters.job_ids().count(job_id) < 1 or len(waiters._wakers[job_id]) < count:
            threading.Event().wait(0.01)
        dcache.update_batch_target(job_id, 0, "done", result="<html>")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("face", ["flask", "fastapi"])
def test_web_app_wait_example(tmp_path: Path, face: str) -> None:
    from fastapi.testclient import TestClient

    namespace: dict[str, Any] = {"__name__": "app"}  # Flask finds the app's folder by its module's name
    exec(compile(block("web-app-wait"), block_path("web-app-wait"), "exec"), namespace)
    dcache.open_db(tmp_path / "app.db")
    try:
        job_id = dcache.submit("alice", ["https://a.example/"]).job_id
        client: Any = (
            namespace["flask_app"].test_client() if face == "flask" else TestClient(namespace["api"])
        )
        writer = _finish_once_waited(job_id, 1)
        answer = client.get(f"/v1/batch/{job_id}/progress?wait=30")
        writer.join()
        assert answer.status_code == 200
        body = answer.json() if face == "fastapi" else answer.json
        assert body == {"status": "queued", "done": 1, "total": 1}
        assert client.get("/v1/batch/nope/progress?wait=30").status_code == 404
    finally:
        dcache.close_db()
