"""The dashboard through Flask's test client, on both backends: every page, paging, escaping, the token,
CSRF, read-only mode, and the actions' effect on the store."""

from __future__ import annotations

import re
from typing import Any

import pytest
from helpers import snapshot

from sift import dcache
from sift.dcache import JobStatus, TargetStatus
from sift.web import create_app, queries

SCRIPT = "<script>alert(1)</script>"
NOW = 1_000_000


def submit(caller: str = "alice", n: int = 3, *, key: str = "", urls: list[str] | None = None) -> str:
    urls = urls if urls is not None else [f"https://h{i % 2}.example/{i}" for i in range(n)]
    return dcache.submit(caller, urls, idem_key=key, now=NOW).job_id


def client(app: Any) -> Any:
    return app.test_client()


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page
    return found.group(1)


def text(response: Any) -> str:
    return str(response.get_data(as_text=True))


def test_overview_shows_the_stores_counts(store: Any) -> None:
    a = submit(n=4)
    b = submit("bob", n=2)
    submit("carol", n=1)
    dcache.cancel_batch_job(b, now=NOW)
    dcache.claim_batch_targets(3, runner="r1", now=NOW)
    dcache.update_batch_target(a, 0, TargetStatus.DONE, result="hello", runner="r1", now=NOW)
    page = text(client(create_app(None, budget=1000)).get("/"))
    counts = dict(re.findall(r'data-count="([^"]+)">(\d+)<', page))
    jobs = {
        s.value: dcache.BatchJob.select().where(dcache.BatchJob.status == s.value).count() for s in JobStatus
    }
    assert {k.removeprefix("jobs."): int(v) for k, v in counts.items() if k.startswith("jobs.")} == jobs
    targets = {
        s.value: dcache.BatchTarget.select().where(dcache.BatchTarget.status == s.value).count()
        for s in TargetStatus
    }
    assert int(counts["targets.running"]) == targets["running"] == 2
    # pending targets are those of live jobs; the cancelled job's failed its own
    assert int(counts["targets.pending"]) == targets["pending"] == 2
    assert int(counts["targets.final"]) == targets["done"] + targets["failed"] == 3
    assert int(counts["nbytes"]) == dcache.batch_nbytes() == 5
    assert int(counts["live_jobs"]) == dcache.live_batch_jobs_total() == 2
    assert int(counts["runners"]) == 0  # r1's heartbeat (NOW) is long past stale_after
    assert int(counts["stale_claims"]) == 2
    assert "0.5% of 1000" in page


def test_jobs_page_pages_through_every_job_once(store: Any) -> None:
    ids = sorted(submit(f"caller{i % 3}", n=1) for i in range(120))
    app = client(create_app(None))
    seen: list[str] = []
    url = "/jobs"
    pages = 0
    while url:
        page = text(app.get(url))
        seen += re.findall(r'<tr data-job="([0-9a-f]+)">', page)
        found = re.search(r'class="next" href="([^"]+)"', page)
        url = found.group(1).replace("&amp;", "&") if found else ""
        pages += 1
    assert seen == ids
    assert pages == 3  # 50 a page


def test_jobs_page_filters_and_search(store: Any) -> None:
    a = submit("alice", key="key-a")
    b = submit("bob", key="key-b")
    dcache.cancel_batch_job(b, now=NOW)
    app = client(create_app(None))

    def listed(query: str) -> set[str]:
        return set(re.findall(r'<tr data-job="([0-9a-f]+)">', text(app.get("/jobs" + query))))

    assert listed("") == {a, b}
    assert listed("?status=cancelled") == {b}
    assert listed("?status=queued&caller=bob") == set()
    assert listed("?caller=alice") == {a}
    assert listed(f"?search={b}") == {b}
    assert listed("?search=key-a") == {a}
    assert listed("?search=nothing") == set()


def test_job_page_lists_targets_paged_with_their_claims(store: Any) -> None:
    job = submit(n=60)
    dcache.claim_batch_targets(1, runner="runner-7", now=NOW)
    dcache.update_batch_target(job, 1, TargetStatus.FAILED, error="boom", now=NOW)
    dcache.update_batch_target(job, 2, TargetStatus.DONE, result="é" * 3, now=NOW)
    app = client(create_app(None))
    first = text(app.get(f"/jobs/{job}"))
    assert re.findall(r'<tr data-idx="(\d+)">', first) == [str(i) for i in range(50)]
    row0 = first.split('<tr data-idx="0">')[1].split("</tr>")[0]
    assert "running" in row0 and "runner-7" in row0 and "<td>1</td>" in row0  # attempts
    assert "boom" in first.split('<tr data-idx="1">')[1].split("</tr>")[0]
    assert "<td>6</td></tr>" in first.split('<tr data-idx="2">')[1]  # result size in UTF-8 bytes
    after = re.search(r'class="next" href="([^"]+)"', first)
    assert after
    second = text(app.get(after.group(1).replace("&amp;", "&")))
    assert re.findall(r'<tr data-idx="(\d+)">', second) == [str(i) for i in range(50, 60)]
    assert 'class="next"' not in second


def test_callers_hosts_and_runners_pages(store: Any) -> None:
    submit("alice", n=4)
    submit("bob", n=1)
    dcache.claim_batch_targets(2, runner="fresh", fair=False, now=NOW)
    dcache.claim_batch_targets(1, runner="old", fair=False, now=NOW - 3600)
    app = client(create_app(None, stale_after=60))
    callers = text(app.get("/callers"))
    assert re.search(r">alice</a></td><td>1</td><td>3</td>", callers)
    assert re.search(r">bob</a></td><td>1</td><td>0</td>", callers)
    hosts = text(app.get("/hosts"))
    assert hosts.index("h0.example") < hosts.index("h1.example")  # busiest first: 2 running, then 1
    runners = text(app.get("/runners"))
    assert re.search(r"<td>fresh</td><td>2</td>.*<td class=\"stale\">(alive|stale)</td>", runners)
    assert re.search(r"<td>old</td><td>1</td>.*<td class=\"stale\">stale</td>", runners)


def test_missing_job_is_404(store: Any) -> None:
    assert client(create_app(None)).get("/jobs/nope").status_code == 404


def test_live_fragment_is_the_pages_figures_alone(store: Any) -> None:
    job = submit()
    response = client(create_app(None)).get(f"/jobs/{job}?_live=1")
    assert response.headers["X-Sift-Live"] == "1"
    body = text(response)
    assert 'id="job-status">queued<' in body and "<html" not in body


def test_callers_values_render_as_text(store: Any) -> None:
    job = submit(SCRIPT, urls=[f"https://x.example/{SCRIPT}", "https://y.example/"], key=SCRIPT)
    dcache.update_batch_target(job, 0, TargetStatus.FAILED, error=SCRIPT, now=NOW)
    app = client(create_app(None))
    pages = [
        f"/jobs/{job}",
        "/jobs",
        f"/jobs?search={SCRIPT}",
        "/callers",
        f"/jobs/{SCRIPT}",
        f"/?x={SCRIPT}",
    ]
    for url in pages:
        body = text(app.get(url))
        assert "<script>alert" not in body, url
    assert text(app.get(f"/jobs/{job}")).count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3
    assert "&lt;script&gt;" in text(app.get(f"/jobs/{SCRIPT}"))
    assert "script-src 'self'" in app.get("/").headers["Content-Security-Policy"]


def cancel_form(app: Any, job: str) -> dict[str, str]:
    page = text(app.get(f"/jobs/{job}"))
    assert 'data-action="cancel"' in page
    return {"csrf": csrf_of(page), "subject": job, "next": f"/jobs/{job}"}


def test_actions_without_the_token_are_refused_and_change_nothing(store: Any) -> None:
    job = submit()
    dcache.claim_batch_targets(1, runner="r", now=NOW)
    app = client(create_app(None, token="s3cret"))
    page = text(app.get(f"/jobs/{job}"))
    assert 'data-action="cancel"' not in page and "Log in to act" in page
    before = snapshot()
    refused = [
        app.post("/actions/cancel", data={"subject": job}),
        app.post("/actions/cancel", data={"subject": job}, headers={"Authorization": "Bearer wrong"}),
        app.post("/actions/requeue_stale", data={}),
        app.post("/actions/requeue_stale", data={}, headers={"Authorization": "s3cret"}),
    ]
    assert [r.status_code for r in refused] == [403] * 4
    assert app.get("/actions/cancel").status_code == 405
    # the login form needs the token; a wrong one logs nobody in
    login = text(app.get("/login"))
    assert app.post("/login", data={"csrf": csrf_of(login), "token": "nope"}).status_code == 403
    assert app.post("/login", data={"token": "s3cret"}).status_code == 403  # no CSRF token
    assert app.post("/actions/cancel", data={"subject": job}).status_code == 403
    assert snapshot() == before


def test_login_then_the_form_cancels(store: Any) -> None:
    job = submit()
    app = client(create_app(None, token="s3cret"))
    login = text(app.get("/login"))
    response = app.post("/login", data={"csrf": csrf_of(login), "token": "s3cret", "next": f"/jobs/{job}"})
    assert response.status_code == 303 and response.headers["Location"].endswith(f"/jobs/{job}")
    form = cancel_form(app, job)
    before = snapshot()
    assert app.post("/actions/cancel", data={**form, "csrf": "forged"}).status_code == 403
    assert snapshot() == before
    response = app.post("/actions/cancel", data=form)
    assert response.status_code == 303 and response.headers["Location"].endswith(f"/jobs/{job}")
    found = dcache.batch_job(job)
    assert found is not None and found.status == JobStatus.CANCELLED
    assert 'id="job-status">cancelled<' in text(app.get(f"/jobs/{job}"))
    assert 'data-action="cancel"' not in text(app.get(f"/jobs/{job}"))  # a finished job has none


def test_retry_failed_reopens_a_jobs_failed_targets(store: Any) -> None:
    job = submit(n=2)
    dcache.update_batch_target(job, 0, TargetStatus.DONE, result="ok", now=NOW)
    dcache.update_batch_target(job, 1, TargetStatus.FAILED, error="boom", now=NOW)
    assert dcache.finish_batch_job(job, now=NOW) == JobStatus.PARTIAL
    app = client(create_app(None, token="s3cret"))
    before = snapshot()
    assert app.post("/actions/retry_failed", data={"subject": job}).status_code == 403
    assert snapshot() == before
    bearer = {"Authorization": "Bearer s3cret"}
    assert 'data-action="retry_failed"' not in text(app.get(f"/jobs/{job}"))  # not logged in: no forms
    assert app.post("/actions/retry_failed", data={"subject": job}, headers=bearer).status_code == 200
    found, targets = dcache.batch_job(job), dcache.batch_targets(job) or []
    assert found is not None and (found.status, found.targets_done) == ("running", 1)
    assert [(t.status, t.error) for t in targets] == [("done", None), ("pending", None)]
    cancelled = submit(n=1)
    dcache.cancel_batch_job(cancelled, now=NOW)
    before = snapshot()
    refused = app.post("/actions/retry_failed", data={"subject": cancelled}, headers=bearer)
    assert refused.status_code == 400 and snapshot() == before


def test_bearer_token_acts_without_a_form(store: Any) -> None:
    job = submit()
    app = client(create_app(None, token="s3cret"))
    bearer = {"Authorization": "Bearer s3cret"}
    response = app.post("/actions/cancel", data={"subject": job}, headers=bearer)
    assert response.status_code == 200 and response.get_json() == {
        "action": "cancel",
        "subject": job,
        "result": True,
    }
    assert app.post("/actions/cancel", data={"subject": "nope"}, headers=bearer).status_code == 404
    assert app.post("/actions/nothing", data={}, headers=bearer).status_code == 404


def test_a_scripts_refusals_are_json_naming_the_error(store: Any) -> None:
    """A call with a token in its header, right or wrong, gets its refusal as JSON, as it gets its result;
    the store is left as it was."""
    cancelled = submit(n=1)
    dcache.cancel_batch_job(cancelled, now=NOW)
    app = client(create_app(None, token="s3cret"))
    bearer, wrong = {"Authorization": "Bearer s3cret"}, {"Authorization": "Bearer wrong"}
    before = snapshot()
    calls = [
        (app.post("/actions/cancel", data={"subject": cancelled}, headers=wrong), 403, "the token is"),
        (app.post("/actions/cancel", data={"subject": "nope"}, headers=bearer), 404, "job_id: no job 'nope'"),
        (app.post("/actions/nothing", data={"subject": "x"}, headers=bearer), 404, "no action 'nothing'"),
        (app.post("/actions/retry_failed", data={"subject": cancelled}, headers=bearer), 400, "job_id: "),
    ]
    read_only = client(create_app(None, token="s3cret", read_only=True))
    refused = read_only.post("/actions/cancel", data={"subject": cancelled}, headers=bearer)
    calls.append((refused, 403, "this dashboard is read-only"))
    for response, status, error in calls:
        assert response.status_code == status and response.mimetype == "application/json"
        body = response.get_json()
        assert body["error"].startswith(error), body
        assert body["action"] in ("cancel", "nothing", "retry_failed") and "result" not in body
    assert snapshot() == before
    # a browser's refusal stays a page, behind a proxy that sends its own credentials too
    for headers in ({}, {"Authorization": "Basic dXNlcjpwYXNz"}):
        page = app.post("/actions/cancel", data={"subject": cancelled}, headers=headers)
        assert page.status_code == 403 and page.mimetype == "text/html"


def test_requeue_stale_action(store: Any) -> None:
    job = submit(n=2)
    dcache.claim_batch_targets(2, runner="gone", now=NOW)
    app = client(create_app(None, stale_after=60))
    page = text(app.get("/runners"))
    assert 'data-action="requeue_stale"' in page
    response = app.post("/actions/requeue_stale", data={"csrf": csrf_of(page), "next": "//evil.example/"})
    assert response.status_code == 303 and response.headers["Location"] == "/"  # never another site
    targets = dcache.batch_targets(job)
    assert targets is not None and [t.status for t in targets] == ["pending", "pending"]


def test_read_only_shows_no_forms_and_refuses_actions(store: Any) -> None:
    job = submit()
    dcache.claim_batch_targets(1, runner="gone", now=NOW)
    app = client(create_app(None, token="s3cret", read_only=True))
    for url in ["/", "/jobs", f"/jobs/{job}", "/callers", "/hosts", "/runners"]:
        body = text(app.get(url))
        assert 'method="post"' not in body, url
        assert "read-only" in body
    before = snapshot()
    bearer = {"Authorization": "Bearer s3cret"}
    assert app.post("/actions/cancel", data={"subject": job}, headers=bearer).status_code == 403
    assert app.post("/actions/requeue_stale", headers=bearer).status_code == 403
    assert snapshot() == before


def test_read_only_opens_the_store_read_only(shared_store: str) -> None:
    job = submit()
    app = client(create_app(shared_store, read_only=True))
    assert 'id="job-status">queued<' in text(app.get(f"/jobs/{job}"))
    with pytest.raises(dcache.StoreReadOnly):
        dcache.cancel_batch_job(job)


def test_bad_settings_raise_naming_the_field(store: Any) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"token": ""}, "token"),
        ({"budget": 0}, "budget"),
        ({"stale_after": True}, "stale_after"),
    ]
    for kwargs, field in bad:
        with pytest.raises(dcache.InvalidBatchInput) as raised:
            create_app(None, **kwargs)
        assert raised.value.field == field


def test_a_page_of_jobs_reads_one_range_of_the_key(store: Any) -> None:
    """The jobs page's query is LIMITed: at most a page and one more row, whatever the store holds."""
    for i in range(130):
        submit(f"c{i}", n=1)
    page = queries.jobs_page(limit=50)
    assert len(page.jobs) == 50 and page.next_after == page.jobs[-1].id


def test_the_paged_queries_read_one_range_of_a_primary_key(file_store: Any) -> None:
    """On a store of 2,000 jobs (ANALYZEd, as a long-lived store is), the jobs page, filtered by status or
    not, and a job's targets page walk a primary key in its order: no scan without an index, no sort of
    what a filter found."""
    with dcache.db.atomic():
        dcache.db.executemany(
            "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, error, targets_total, "
            "targets_done, created_at, lease, nbytes) VALUES (?, ?, 'fleet', ?, ?, '', 1, 1, 1, 1, 0)",
            [(f"job-{i:05d}", f"c{i % 7}", f"k{i}", ("done", "failed")[i % 2]) for i in range(2_000)],
        )
        dcache.db.executemany(
            "INSERT INTO batch_target (job_id, idx, url, options, status) "
            "VALUES (?, ?, 'https://x/', '{}', 'done')",
            [(f"job-{i:05d}", j) for i in range(2_000) for j in range(3)],
        )
    dcache.db.execute_sql("ANALYZE")
    pages = [
        queries.jobs_query(status="", caller="", search="", after="", limit=51),
        queries.jobs_query(status="", caller="", search="", after="job-01000", limit=51),
        queries.jobs_query(status="failed", caller="", search="", after="job-00500", limit=51),
        queries.targets_query("job-00003", after=0, limit=51),
    ]
    for query in pages:
        sql, params = query.sql()
        plan = " | ".join(row[-1] for row in dcache.db.execute_sql(f"EXPLAIN QUERY PLAN {sql}", params))
        assert re.search(
            r"(SCAN|SEARCH) \w+ USING (COVERING )?INDEX sqlite_autoindex_batch_(job|target)_1\b", plan
        ), plan
        assert "TEMP B-TREE" not in plan, plan
        assert "LIMIT" in sql.upper() and params[-1] == 51


def test_only_the_live_pages_ask_for_refreshes(store: Any) -> None:
    app = client(create_app(None, token="s3cret"))
    assert 'data-live="/callers"' in text(app.get("/callers"))
    assert 'data-live="/jobs?status=queued"' in text(app.get("/jobs?status=queued"))
    for url in ("/login", "/jobs/nope"):
        assert "data-live" not in text(app.get(url)), url


def test_text_no_store_could_hold_is_a_400_naming_its_field(store: Any) -> None:
    job = submit()
    app = client(create_app(None))
    for url, field in [
        ("/jobs?caller=%00", "caller"),
        ("/jobs?search=a%00b", "search"),
        ("/jobs?status=%00", "status"),
        ("/jobs?after=%00", "after"),
        ("/jobs/a%00b", "job_id"),
        ("/jobs/%ED%A0%80", "job_id"),  # a lone surrogate, as UTF-8 would spell one
    ]:
        response = app.get(url)
        assert response.status_code in (400, 404), url
        if response.status_code == 400:
            assert f"{field}: " in text(response), url
    assert app.get("/jobs?caller=%00").status_code == 400
    assert app.get(f"/jobs/{job}?after=99999999999999999999999").status_code == 200
    assert app.get(f"/jobs/{job}?after=%C2%B2").status_code == 200  # a digit, but not 0-9


def test_a_fragments_forms_lead_back_to_the_page_not_the_fragment(store: Any) -> None:
    job = submit()
    fragment = text(client(create_app(None)).get(f"/jobs/{job}?_live=1"))
    assert f'name="next" value="/jobs/{job}"' in fragment
    assert "_live" not in fragment
