"""The dashboard's pause, resume, back-off and release through Flask's test client, on both backends: what
the callers, job and hosts pages show of them, their forms, their effect on the store, the token and
read-only mode, and the reads that stay bounded by their keys."""

from __future__ import annotations

import re
from typing import Any

import pytest
from helpers import snapshot

from sift import dcache
from sift.web import create_app, queries

SCRIPT = "<script>alert(1)</script>"
BEARER = {"Authorization": "Bearer s3cret"}


def submit(caller: str, urls: list[str]) -> str:
    return dcache.submit(caller, urls).job_id


def text(response: Any) -> str:
    return str(response.get_data(as_text=True))


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page
    return found.group(1)


def row_of(page: str, attribute: str, name: str) -> str:
    """The table row ``<tr data-ATTRIBUTE="name">`` of the page, up to its end."""
    start = page.index(f'<tr data-{attribute}="{name}">')
    return page[start : page.index("</tr>", start)]


def post(app: Any, page_url: str, action: str, subject: str, **extra: str) -> Any:
    """Post the form the page shows for ``action`` on ``subject``, as a browser would."""
    page = text(app.get(page_url))
    assert f'data-action="{action}"' in page, page
    data = {"csrf": csrf_of(page), "subject": subject, "next": page_url, **extra}
    return app.post(f"/actions/{action}", data=data)


def claimed_callers() -> set[str]:
    jobs = {t.job_id for t in dcache.claim_batch_targets(100, runner="r")}
    found = {dcache.batch_job(job) for job in jobs}
    return {job.caller for job in found if job is not None}


def test_pausing_a_caller_from_its_page_stops_its_claims_and_resume_brings_them_back(store: Any) -> None:
    submit("alice", ["https://a.example/1", "https://a.example/2"])
    submit("bob", ["https://b.example/1"])
    app = create_app(None).test_client()
    page = text(app.get("/callers"))
    assert "no" in row_of(page, "caller", "alice") and 'data-action="resume_caller"' not in page
    response = post(app, "/callers", "pause_caller", "alice")
    assert response.status_code == 303 and response.headers["Location"].endswith("/callers")
    assert dcache.paused_callers() == ["alice"]
    row = row_of(text(app.get("/callers")), "caller", "alice")
    assert "since <time" in row and 'data-action="resume_caller"' in row and "pause_caller" not in row
    assert claimed_callers() == {"bob"}
    assert post(app, "/callers", "resume_caller", "alice").status_code == 303
    assert dcache.paused_callers() == []
    assert claimed_callers() == {"alice"}


def test_a_paused_caller_with_nothing_pending_is_listed_so_that_it_can_be_resumed(store: Any) -> None:
    dcache.pause_caller(SCRIPT)
    app = create_app(None).test_client()
    page = text(app.get("/callers"))
    assert "<script>alert" not in page
    row = row_of(page, "caller", "&lt;script&gt;alert(1)&lt;/script&gt;")
    assert "<td>0</td><td>0</td>" in row and 'data-action="resume_caller"' in row
    assert post(app, "/callers", "resume_caller", SCRIPT).status_code == 303
    assert dcache.paused_callers() == []


def test_a_job_page_shows_its_pause_and_the_buttons(store: Any) -> None:
    job = submit("alice", ["https://a.example/1", "https://a.example/2"])
    app = create_app(None).test_client()
    page = text(app.get(f"/jobs/{job}"))
    assert 'id="job-paused">no<' in page and 'data-action="resume_job"' not in page
    assert post(app, f"/jobs/{job}", "pause_job", job).status_code == 303
    assert dcache.paused_jobs() == [job]
    assert dcache.claim_batch_targets(10, runner="r") == []
    page = text(app.get(f"/jobs/{job}"))
    assert re.search(r'id="job-paused">since <time data-unix="\d+">', page)
    assert 'data-action="pause_job"' not in page
    assert post(app, f"/jobs/{job}", "resume_job", job).status_code == 303
    assert dcache.paused_jobs() == []
    assert len(dcache.claim_batch_targets(10, runner="r")) == 2
    dcache.cancel_batch_job(job)
    page = text(app.get(f"/jobs/{job}"))  # a finished job has nothing to pause
    assert 'data-action="pause_job"' not in page and 'data-action="resume_job"' not in page


def test_the_hosts_page_shows_policy_due_time_and_back_off(store: Any) -> None:
    submit("alice", ["https://a.example/1", "https://a.example/2", "https://b.example/1"])
    dcache.set_host_policy("a.example", max_running=2, min_interval=0.5)
    dcache.set_host_policy("*", max_running=7)
    dcache.set_host_policy("quiet.example", min_interval=3)
    dcache.back_off_host("held.example", dcache.unix_now() + 600)
    dcache.back_off_host("over.example", 1_000, now=999)  # ended long ago: not listed
    dcache.claim_batch_targets(10, runner="r")
    page = text(create_app(None).test_client().get("/hosts"))
    assert re.findall(r'<tr data-host="([^"]+)">', page) == [
        "a.example",  # one running (paced: one a claim), busiest first by name
        "b.example",
        "held.example",  # then the hosts with a setting or a back-off in force, by name
        "quiet.example",
    ]
    a = row_of(page, "host", "a.example")
    assert '<td class="max-running">2</td><td class="min-interval">0.5 s</td>' in a
    assert re.search(r'class="next-due"><time data-unix="[\d.]+">', a)
    assert '<td class="backed-off">-</td>' in a and 'data-action="release_host"' not in a
    held = row_of(page, "host", "held.example")
    assert re.search(r'class="backed-off"><time data-unix="[\d.]+">', held)
    assert 'data-action="release_host"' in held and 'data-action="back_off_host"' in held
    assert '<td class="max-running">-</td>' in row_of(page, "host", "b.example")
    assert "max running 7, min interval -." in page


def test_back_off_then_release_from_the_hosts_page(store: Any) -> None:
    submit("alice", ["https://a.example/1", "https://b.example/1"])
    dcache.claim_batch_targets(1, runner="r", fair=False)  # a.example runs: it is on the page
    app = create_app(None).test_client()
    before = dcache.unix_now_ms() / 1000
    assert post(app, "/hosts", "back_off_host", "a.example", value="120").status_code == 303
    (policy,) = dcache.host_policies()
    assert policy.host == "a.example" and policy.backed_off_until is not None
    assert before + 120 <= policy.backed_off_until <= dcache.unix_now_ms() / 1000 + 120
    row = row_of(text(app.get("/hosts")), "host", "a.example")
    assert 'data-action="release_host"' in row
    assert post(app, "/hosts", "release_host", "a.example").status_code == 303
    assert dcache.backed_off_hosts() == []
    assert 'data-action="release_host"' not in row_of(text(app.get("/hosts")), "host", "a.example")


@pytest.mark.parametrize("value", ["", "0", "-5", "abc", "nan", "inf", "86401"])
def test_a_bad_back_off_is_a_400_naming_seconds_and_changes_nothing(store: Any, value: str) -> None:
    submit("alice", ["https://a.example/1"])
    dcache.claim_batch_targets(1, runner="r")
    app = create_app(None).test_client()
    before = snapshot()
    response = post(app, "/hosts", "back_off_host", "a.example", value=value)
    assert response.status_code == 400 and "seconds: must be a number of seconds" in text(response)
    assert snapshot() == before
    assert dcache.host_policies() == []


def test_bad_subjects_are_400_naming_the_field_or_404_and_change_nothing(store: Any) -> None:
    submit("alice", ["https://a.example/1"])
    app = create_app(None, token="s3cret").test_client()
    before = snapshot()
    for action, data, status, field in [
        ("release_host", {"subject": "*"}, 400, "host"),
        ("back_off_host", {"subject": "https://a.example/x", "value": "5"}, 400, "host"),
        ("pause_caller", {"subject": ""}, 400, "caller"),
        ("resume_caller", {"subject": "a\x00b"}, 400, "caller"),
        ("pause_job", {"subject": "nope"}, 404, ""),
        ("resume_job", {"subject": "nope"}, 404, ""),
    ]:
        response = app.post(f"/actions/{action}", data=data, headers=BEARER)
        assert response.status_code == status, action
        if field:
            assert f"{field}: " in text(response), action
    assert snapshot() == before


def test_the_actions_answer_a_script_with_json(store: Any) -> None:
    job = submit("alice", ["https://a.example/1"])
    app = create_app(None, token="s3cret").test_client()

    def act(action: str, **data: str) -> Any:
        response = app.post(f"/actions/{action}", data=data, headers=BEARER)
        assert response.status_code == 200, text(response)
        return response.get_json()["result"]

    assert act("pause_job", subject=job) is True
    assert act("pause_job", subject=job) is False
    assert act("resume_job", subject=job) is True
    assert act("pause_caller", subject="alice") is True
    assert act("resume_caller", subject="alice") is True
    assert act("resume_caller", subject="alice") is False
    until = act("back_off_host", subject="A.example", value="2.5")
    assert dcache.host_policies()[0].backed_off_until == until
    assert act("release_host", subject="a.example") is True
    assert act("release_host", subject="a.example") is False


def test_without_the_token_every_new_action_is_refused_and_changes_nothing(store: Any) -> None:
    job = submit("alice", ["https://a.example/1"])
    dcache.claim_batch_targets(1, runner="r")
    dcache.pause_caller("bob")
    dcache.back_off_host("held.example", dcache.unix_now() + 600)
    app = create_app(None, token="s3cret").test_client()
    for url in ("/callers", "/hosts", f"/jobs/{job}"):
        assert "data-action=" not in text(app.get(url)), url
    before = snapshot()
    for action, data in [
        ("pause_job", {"subject": job}),
        ("resume_job", {"subject": job}),
        ("pause_caller", {"subject": "alice"}),
        ("resume_caller", {"subject": "bob"}),
        ("back_off_host", {"subject": "a.example", "value": "60"}),
        ("release_host", {"subject": "held.example"}),
    ]:
        assert app.post(f"/actions/{action}", data=data).status_code == 403, action
        wrong = {"Authorization": "Bearer wrong"}
        assert app.post(f"/actions/{action}", data=data, headers=wrong).status_code == 403, action
        assert app.get(f"/actions/{action}").status_code == 405, action
    assert snapshot() == before


def test_read_only_shows_no_new_forms_and_refuses_them(store: Any) -> None:
    job = submit("alice", ["https://a.example/1"])
    dcache.claim_batch_targets(1, runner="r")
    dcache.pause_caller("alice")
    dcache.pause_batch_job(job)
    dcache.back_off_host("a.example", dcache.unix_now() + 600)
    app = create_app(None, token="s3cret", read_only=True).test_client()
    for url in ("/callers", "/hosts", f"/jobs/{job}"):
        body = text(app.get(url))
        assert 'method="post"' not in body and "data-action=" not in body, url
    assert "since <time" in row_of(text(app.get("/callers")), "caller", "alice")
    before = snapshot()
    for action, data in [
        ("resume_job", {"subject": job}),
        ("resume_caller", {"subject": "alice"}),
        ("release_host", {"subject": "a.example"}),
        ("back_off_host", {"subject": "a.example", "value": "60"}),
    ]:
        assert app.post(f"/actions/{action}", data=data, headers=BEARER).status_code == 403, action
    assert snapshot() == before


def test_the_pages_read_pause_and_policy_by_their_keys(store: Any) -> None:
    """Only the rows a page shows are looked up, by the tables' keys."""
    for i in range(30):
        dcache.pause_caller(f"idle-{i:02d}")
        dcache.set_host_policy(f"h{i:02d}.example", max_running=1)
    assert set(queries.caller_pause_state(["idle-03", "nobody", "idle-29"])) == {"idle-03", "idle-29"}
    assert set(queries.host_policy_state(["h01.example", "x.example"])) == {"h01.example"}
    assert queries.caller_pause_state([]) == {} and queries.host_policy_state([]) == {}


def test_the_pause_and_policy_reads_search_the_keys(file_store: Any) -> None:
    """On SQLite (PostgreSQL reads tables this small whole, whatever the indexes): a search of each key,
    and the listing of held hosts walks the key in its order, with no sort."""
    for i in range(300):
        dcache.pause_caller(f"idle-{i:03d}")
        dcache.set_host_policy(f"h{i:03d}.example", max_running=1)
    dcache.db.execute_sql("ANALYZE")
    for query, index in [
        (queries.caller_pause_query(["idle-003", "nobody"]), "sqlite_autoindex_batch_paused_caller_1"),
        (queries.host_policy_query(["h001.example", "x.example"]), "sqlite_autoindex_batch_host_policy_1"),
        (queries.held_hosts_query(1_000, 201), "sqlite_autoindex_batch_host_policy_1"),
    ]:
        sql, params = query.sql()
        plan = " | ".join(row[-1] for row in dcache.db.execute_sql(f"EXPLAIN QUERY PLAN {sql}", params))
        assert re.search(rf"(SEARCH|SCAN) \w+ USING (COVERING )?INDEX {index}\b", plan), plan
        assert "TEMP B-TREE" not in plan, plan
