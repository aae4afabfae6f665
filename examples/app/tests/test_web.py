"""The web app's routes on a fresh store per test (sift.testing's sift_store): in memory, or on PostgreSQL
with SIFT_TEST_DB set."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from sift import dcache
from sift.testing import check_store_invariants

from fetchapp import web

ALICE = {"X-Caller": "alice"}


def submit(client: FlaskClient, urls: Any, key: str = "", caller: str = "alice", **body: Any) -> Any:
    return client.post(
        "/v1/jobs", json={"urls": urls, **body}, headers={"X-Caller": caller, "Idempotency-Key": key}
    )


def rows() -> tuple[list[Any], list[Any]]:
    """Every job and target row, to compare before and after a refused request."""
    jobs = list(dcache.BatchJob.select().order_by(dcache.BatchJob.id).tuples())
    targets = list(
        dcache.BatchTarget.select().order_by(dcache.BatchTarget.job_id, dcache.BatchTarget.idx).tuples()
    )
    return jobs, targets


@pytest.mark.sift_store(check=True)
def test_submit_makes_a_queued_job_and_a_retry_with_the_key_finds_it(client: FlaskClient) -> None:
    first = submit(client, ["https://a.example/", "https://b.example/"], key="k1")
    assert first.status_code == 202 and first.json["created"] is True
    assert first.headers["Location"] == f"/v1/jobs/{first.json['id']}"
    again = submit(client, ["https://a.example/", "https://b.example/"], key="k1")
    assert (again.status_code, again.json) == (200, {"id": first.json["id"], "created": False})
    before = rows()
    other_urls = submit(client, ["https://a.example/"], key="k1")  # the key's job is another request's
    assert other_urls.status_code == 409 and other_urls.json["field"] == "idem_key"
    assert first.json["id"] in other_urls.json["error"]
    assert rows() == before
    other = submit(client, ["https://a.example/"], key="k1", caller="bob")  # keys are per caller
    assert other.status_code == 202 and other.json["id"] != first.json["id"]
    page = client.get(f"/v1/jobs/{first.json['id']}", headers=ALICE).json
    assert (page["status"], page["done"], page["total"]) == ("queued", 0, 2)
    assert [(r["url"], r["status"]) for r in page["results"]] == [
        ("https://a.example/", "pending"),
        ("https://b.example/", "pending"),
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"urls": ["https://a.example/", ""]}, "urls[1]"),
        ({"urls": ["file:///etc/passwd"]}, "urls[0]"),
        ({"urls": ["https://a.example/", "javascript:alert(1)"]}, "urls[1]"),
        ({"urls": ["gopher://a.example:70/_x"]}, "urls[0]"),
        ({"urls": ["http://169.254.169.254/latest/meta-data/"]}, "urls[0]"),
        ({"urls": ["http://10.0.0.1/"]}, "urls[0]"),
        ({"urls": ["http://127.0.0.1:6379/"]}, "urls[0]"),
        ({"urls": ["http://[::1]/"]}, "urls[0]"),
        ({"urls": ["http://[::ffff:10.0.0.1]/"]}, "urls[0]"),
        ({"urls": ["http://167772161/"]}, "urls[0]"),
        ({"urls": ["http://0x7f000001/"]}, "urls[0]"),
        ({"urls": ["http://127.1/"]}, "urls[0]"),
        ({"urls": ["http:///no-host"]}, "urls[0]"),
        ({"urls": ["http://[::1/"]}, "urls[0]"),
        ({"urls": ["https://a.example/" + "a" * web.MAX_URL_BYTES]}, "urls[0]"),
        ({"urls": [7]}, "urls[0]"),
        ({"urls": "https://a.example/"}, "urls"),
        ({"urls": []}, "urls"),
        ({"urls": ["https://a.example/"] * (web.MAX_URLS + 1)}, "urls"),
        ({"urls": ["https://a.example/"], "options": 3}, "options"),
        ({}, "urls"),
        ([], "body"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_writes_nothing(
    client: FlaskClient, body: Any, field: str
) -> None:
    submit(client, ["https://kept.example/"])
    before = rows()
    answer = client.post("/v1/jobs", json=body, headers=ALICE)
    assert answer.status_code == 400 and answer.json["field"] == field
    assert answer.json["error"].startswith(f"{field}:")
    assert rows() == before


def test_a_body_over_the_cap_is_413_and_writes_nothing(client: FlaskClient) -> None:
    submit(client, ["https://kept.example/"])
    before = rows()
    urls = ["https://a.example/" + "a" * 2000] * (web.MAX_BODY_BYTES // 2000 + 1)
    answer = client.post("/v1/jobs", json={"urls": urls}, headers=ALICE)
    assert answer.status_code == 413
    assert rows() == before


def test_the_longest_url_taken_is_stored_whole(client: FlaskClient) -> None:
    url = "https://a.example/" + "a" * (web.MAX_URL_BYTES - len("https://a.example/"))
    answer = submit(client, [url, "http://93.184.215.14/"])
    assert answer.status_code == 202
    assert [t.url for t in dcache.batch_targets(answer.json["id"]) or []] == [url, "http://93.184.215.14/"]


def test_a_key_too_long_is_400_naming_it(client: FlaskClient) -> None:
    answer = submit(client, ["https://a.example/"], key="k" * (dcache.MAX_KEY_BYTES + 1))
    assert answer.status_code == 400 and answer.json["field"] == "idem_key"
    assert dcache.BatchJob.select().count() == 0


def test_a_request_without_a_caller_is_401_and_unknown_routes_are_json(client: FlaskClient) -> None:
    assert client.post("/v1/jobs", json={"urls": ["https://a.example/"]}).status_code == 401
    assert dcache.BatchJob.select().count() == 0
    missing = client.get("/v1/nothing")
    assert missing.status_code == 404 and "error" in missing.json
    assert client.delete("/v1/jobs", headers=ALICE).status_code == 405


def test_poll_shows_only_the_callers_own_jobs_and_keeps_the_job_alive(
    client: FlaskClient, sift_clock: Any
) -> None:
    job_id = submit(client, ["https://a.example/"]).json["id"]
    assert client.get(f"/v1/jobs/{job_id}", headers={"X-Caller": "bob"}).status_code == 404
    assert client.get("/v1/jobs/no-such-job", headers=ALICE).json == {"error": "no such job"}
    sift_clock.advance(web.TTL - 1)
    assert client.get(f"/v1/jobs/{job_id}", headers=ALICE).status_code == 200
    sift_clock.advance(web.TTL - 1)
    assert dcache.sweep_batch(web.TTL) == 0  # polled TTL - 1 s ago: kept
    sift_clock.advance(1)
    assert dcache.sweep_batch(web.TTL) == 1
    assert client.get(f"/v1/jobs/{job_id}", headers=ALICE).status_code == 404


@pytest.mark.sift_store(check=True)
def test_cancel_stops_a_live_job_and_refuses_a_finished_one(client: FlaskClient) -> None:
    job_id = submit(client, ["https://a.example/", "https://b.example/"]).json["id"]
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers={"X-Caller": "bob"}).status_code == 404
    answer = client.post(f"/v1/jobs/{job_id}/cancel", headers=ALICE)
    assert (answer.status_code, answer.json["status"]) == (200, "cancelled")
    assert dcache.claim_batch_targets(10, runner="r") == []  # a cancelled job's targets are never fetched
    again = client.post(f"/v1/jobs/{job_id}/cancel", headers=ALICE)
    assert again.status_code == 409 and again.json["status"] == "cancelled"
    page = client.get(f"/v1/jobs/{job_id}", headers=ALICE).json
    assert (page["status"], page["error"]) == ("cancelled", "cancelled by alice")
    assert (page["done"], page["total"]) == (2, 2)  # its unfinished targets failed, each counted once
    assert [(r["status"], r["error"]) for r in page["results"]] == [("failed", "cancelled by alice")] * 2
    assert client.post("/v1/jobs/no-such-job/cancel", headers=ALICE).status_code == 404


@pytest.mark.sift_store(check=True)
def test_poll_pages_the_results(client: FlaskClient) -> None:
    urls = [f"https://a.example/{n}" for n in range(5)]
    job_id = submit(client, urls).json["id"]
    first = client.get(f"/v1/jobs/{job_id}?limit=2", headers=ALICE).json
    assert [r["idx"] for r in first["results"]] == [0, 1] and first["next"] == "?after=1&limit=2"
    second = client.get(f"/v1/jobs/{job_id}{first['next']}", headers=ALICE).json
    assert [r["idx"] for r in second["results"]] == [2, 3] and second["total"] == 5
    last = client.get(f"/v1/jobs/{job_id}?after=3&limit=2", headers=ALICE).json
    assert [r["url"] for r in last["results"]] == [urls[4]] and "next" not in last
    rest = client.get(f"/v1/jobs/{job_id}?after=2", headers=ALICE).json
    assert [r["idx"] for r in rest["results"]] == [3, 4] and "next" not in rest
    for query, field in [
        ("?after=x", "after"),
        ("?after=-1", "after"),
        ("?limit=0", "limit"),
        ("?limit=", "limit"),
    ]:
        answer = client.get(f"/v1/jobs/{job_id}{query}", headers=ALICE)
        assert answer.status_code == 400 and answer.json["field"] == field, query


@pytest.mark.sift_store(check=True)
def test_a_long_poll_answers_when_the_job_moves(client: FlaskClient) -> None:
    job_id = submit(client, ["https://a.example/", "https://b.example/"]).json["id"]

    [target] = dcache.claim_batch_targets(1, runner="r")  # the job is running before the poll reads it

    def run_one() -> None:  # a runner's result, once the request waits: the one change it sees
        while job_id not in dcache.db.backend.job_waiters().job_ids():
            time.sleep(0.01)
        dcache.update_batch_target(job_id, target.idx, "done", result="<html>", runner="r")

    runner = threading.Thread(target=run_one)
    runner.start()
    answer = client.get(f"/v1/jobs/{job_id}?wait=30", headers=ALICE)
    runner.join()
    assert answer.status_code == 200 and (answer.json["status"], answer.json["done"]) == ("running", 1)
    dcache.cancel_batch_job(job_id)
    final = client.get(f"/v1/jobs/{job_id}?wait=30", headers=ALICE).json  # finished: answered at once
    assert (final["status"], final["done"]) == ("cancelled", 2)
    for query in ("?wait=x", "?wait=-1", "?wait=31", "?wait=nan"):
        refused = client.get(f"/v1/jobs/{job_id}{query}", headers=ALICE)
        assert refused.status_code == 400 and refused.json["field"] == "wait", query


def test_a_store_that_cannot_be_used_is_503_with_retry_after(
    client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise dcache.StoreUnavailable("disk I/O error")

    monkeypatch.setattr(dcache, "submit", unavailable)
    answer = submit(client, ["https://a.example/"])
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
    assert "unavailable" in answer.json["error"]


@pytest.mark.sift_store(file=True)
def test_create_app_twice_in_one_process(sift_store: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "sift.db")  # the file sift_store made: `sift init` in production
    first = web.create_app(path).test_client()
    second = web.create_app(path).test_client()  # reopens the store; metrics registered once
    job_id = submit(first, ["https://a.example/"]).json["id"]
    assert second.get(f"/v1/jobs/{job_id}", headers=ALICE).status_code == 200
    scrape = second.get("/metrics").text
    assert "sift_jobs_created_total 1.0" in scrape
    assert first.get("/healthz").json == {"live_jobs": 1}
    check_store_invariants()


def test_create_app_refuses_a_missing_store_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(dcache.StoreMissing):
        web.create_app(str(tmp_path / "typo.db"))
    assert list(tmp_path.iterdir()) == []
