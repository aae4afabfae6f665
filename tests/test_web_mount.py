"""The dashboard mounted under a prefix, as the docs show it: in a Flask app (DispatcherMiddleware) and in a
FastAPI app (a2wsgi's WSGIMiddleware), on both backends. The docs' blocks run as they stand."""

from __future__ import annotations

import re
from typing import Any

import pytest
from docs_pages import block
from helpers import snapshot

from sift import dcache
from sift.dcache import JobStatus


def built(name: str, store: str) -> Any:
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(block(name), f"<{name}>", "exec"), namespace)
    return namespace["make_app"](store, "s3cret")


def check_mounted(get: Any, post: Any) -> None:
    """The app's own route and the dashboard's pages under /sift, with every link and asset under it."""
    job = dcache.submit("alice", ["https://a.example/1"]).job_id
    page = get(f"/sift/jobs/{job}")
    assert page.status_code == 200
    assert 'id="job-status">queued<' in page.text
    assert 'href="/sift/static/sift.css"' in page.text and 'src="/sift/static/sift.js"' in page.text
    assert 'data-live="/sift/jobs/' in page.text
    links = re.findall(r'href="([^"]+)"', page.text)
    assert links and all(link.startswith("/sift/") for link in links), links
    assert get("/sift/static/sift.js").status_code == 200
    assert get(f"/sift/jobs/{job}?_live=1").headers["X-Sift-Live"] == "1"
    before = snapshot()
    assert post("/sift/actions/cancel", {"subject": job}, {}).status_code == 403
    assert snapshot() == before
    done = post("/sift/actions/cancel", {"subject": job}, {"Authorization": "Bearer s3cret"})
    assert done.status_code == 200
    found = dcache.batch_job(job)
    assert found is not None and found.status == JobStatus.CANCELLED


def test_mounted_in_flask(shared_store: str) -> None:
    client = built("dashboard-flask", shared_store).test_client()
    assert client.get("/").get_data(as_text=True) == "my app"

    def get(url: str) -> Any:
        response = client.get(url)
        response.text = response.get_data(as_text=True)
        return response

    check_mounted(get, lambda url, data, headers: client.post(url, data=data, headers=headers))


def test_mounted_in_fastapi(shared_store: str) -> None:
    testclient = pytest.importorskip("fastapi.testclient")
    with testclient.TestClient(built("dashboard-fastapi", shared_store)) as client:
        assert client.get("/").json() == {"app": "mine"}
        check_mounted(client.get, lambda url, data, headers: client.post(url, data=data, headers=headers))
