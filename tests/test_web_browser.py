"""The dashboard in a real browser: Playwright driving headless Chromium (the system's ``chromium``, never a
downloaded one) against ``sift web`` in its own process on 127.0.0.1, on both backends."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from web_helpers import sift_web, token_file

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, JobStatus, TargetStatus

pytestmark = pytest.mark.slow

SCRIPT = "<script>alert(1)</script>"
TOKEN = "s3cret-token"
#: Generous: the figures refresh every second; a busy machine may take longer. Never a duration asserted.
SHOWN_MS = 30_000


def chromium_missing() -> str | None:
    """Why the browser cases cannot run here, or None; under CI always None, so that they fail instead."""
    if os.environ.get("CI") == "true" or shutil.which("chromium"):
        return None
    return "no chromium on PATH (apt-get install chromium; .ci/run installs it)"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = chromium_missing()
    if missing:
        pytest.skip(missing)
    if os.environ.get("CI") == "true":
        import playwright.sync_api as sync_api  # under CI a missing Playwright fails, as chromium does
    else:
        sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=shutil.which("chromium") or "chromium")
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
    opened = context.new_page()
    opened.set_default_timeout(SHOWN_MS)
    yield opened
    context.close()


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def log_in(page: Any, base: str) -> None:
    page.goto(f"{base}/login")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def test_overview_counts_equal_the_stores(shared_store: str, tmp_path: Path, page: Any) -> None:
    jobs = [
        dcache.submit(f"caller{i % 3}", [f"https://h{i}.example/{j}" for j in range(3)]).job_id
        for i in range(7)
    ]
    dcache.cancel_batch_job(jobs[0])
    dcache.claim_batch_targets(4, runner="r1")
    dcache.update_batch_target(jobs[1], 0, TargetStatus.DONE, result="x" * 10, runner="r1")
    # an hour: runner r1's claims stay fresh however slowly this machine starts the server
    with sift_web(shared_store, "--token-file", token_file(tmp_path), "--stale-after", "1h") as (base, _):
        page.goto(base + "/")
        shown = {
            cell.get_attribute("data-count"): int(cell.inner_text())
            for cell in page.locator("[data-count]").all()
        }
    for status in JobStatus:
        assert (
            shown[f"jobs.{status.value}"] == BatchJob.select().where(BatchJob.status == status.value).count()
        )
    by_status = {
        s.value: BatchTarget.select().where(BatchTarget.status == s.value).count() for s in TargetStatus
    }
    assert shown["targets.pending"] == by_status["pending"]
    assert shown["targets.running"] == by_status["running"] == 3
    assert shown["targets.final"] == by_status["done"] + by_status["failed"]
    assert shown["live_jobs"] == dcache.live_batch_jobs_total() == 6
    assert shown["nbytes"] == dcache.batch_nbytes() == 10
    assert shown["runners"] == 1 and shown["stale_claims"] == 0


def test_cancel_on_the_job_page_cancels_and_shows_it_without_a_reload(
    shared_store: str, tmp_path: Path, page: Any
) -> None:
    job = dcache.submit("alice", ["https://a.example/1", "https://a.example/2"]).job_id
    with sift_web(shared_store, "--token-file", token_file(tmp_path)) as (base, _):
        log_in(page, base)
        page.goto(f"{base}/jobs/{job}")
        expect(page.locator("#job-status")).to_have_text("queued")
        page.evaluate("window.siftMarker = 'same page'")  # gone if the page were loaded again
        page.click("button[data-action=cancel]")
        expect(page.locator("#job-status")).to_have_text("cancelled", timeout=SHOWN_MS)
        assert page.evaluate("window.siftMarker") == "same page"
        expect(page.locator("button[data-action=cancel]")).to_have_count(0)
    found = dcache.batch_job(job)
    assert found is not None and found.status == JobStatus.CANCELLED


def test_pausing_a_caller_on_the_callers_page_stops_its_claims_and_resume_brings_them_back(
    shared_store: str, tmp_path: Path, page: Any
) -> None:
    dcache.submit("alice", ["https://a.example/1", "https://a.example/2"])
    dcache.submit("bob", ["https://b.example/1", "https://b.example/2"])
    with sift_web(shared_store, "--token-file", token_file(tmp_path)) as (base, _):
        log_in(page, base)
        page.goto(f"{base}/callers")
        alice = page.locator('tr[data-caller="alice"]')
        expect(alice.locator("td.paused")).to_have_text("no")
        page.evaluate("window.siftMarker = 'same page'")
        alice.locator("button[data-action=pause_caller]").click()
        expect(alice.locator("td.paused")).to_contain_text("since", timeout=SHOWN_MS)
        assert dcache.paused_callers() == ["alice"]
        claimed = dcache.claim_batch_targets(10, runner="r")
        assert {t.url for t in claimed} == {"https://b.example/1", "https://b.example/2"}  # none of alice's
        alice.locator("button[data-action=resume_caller]").click()
        expect(alice.locator("td.paused")).to_have_text("no", timeout=SHOWN_MS)
        assert page.evaluate("window.siftMarker") == "same page"
    assert dcache.paused_callers() == []
    claimed = dcache.claim_batch_targets(10, runner="r")
    assert {t.url for t in claimed} == {"https://a.example/1", "https://a.example/2"}


def test_a_script_in_a_url_and_an_error_renders_as_text(shared_store: str, tmp_path: Path, page: Any) -> None:
    job = dcache.submit(
        "alice", [f"https://x.example/{SCRIPT}", "https://y.example/"], idem_key=SCRIPT
    ).job_id
    dcache.update_batch_target(job, 0, TargetStatus.FAILED, error=SCRIPT)
    dialogs: list[str] = []

    def opened(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", opened)
    with sift_web(shared_store, "--token-file", token_file(tmp_path)) as (base, _):
        page.goto(f"{base}/jobs/{job}")
        row = page.locator('tr[data-idx="0"]')
        expect(row.locator("td.url")).to_have_text(f"https://x.example/{SCRIPT}")
        expect(row.locator("td.error")).to_have_text(SCRIPT)
        page.goto(f"{base}/jobs?search={SCRIPT}")
        expect(page.locator("input[name=search]")).to_have_value(SCRIPT)
        page.goto(f"{base}/jobs/{SCRIPT}")
        expect(page.locator("h1")).to_contain_text("No such job")
        expect(page.locator("main code")).to_have_text(SCRIPT)
        page.goto(f"{base}/jobs/{job}")
        with page.expect_response(lambda response: "_live=1" in response.url):
            pass  # a live refresh came back: the fragment it put in place is text too
        expect(row.locator("td.error")).to_have_text(SCRIPT)
    assert dialogs == []
    assert page.locator("script:not([src])").count() == 0


def test_a_change_by_another_process_appears_on_an_open_page(
    shared_store: str, tmp_path: Path, page: Any
) -> None:
    job = dcache.submit("alice", ["https://a.example/1", "https://a.example/2"]).job_id
    with sift_web(shared_store, "--read-only") as (base, _):
        page.goto(f"{base}/jobs/{job}")
        status_of_0 = page.locator('tr[data-idx="0"] td.status')
        expect(status_of_0).to_have_text("pending")
        page.evaluate("window.siftMarker = 'same page'")
        # this test's process is not the server's: its writes reach the page only through the store
        dcache.claim_batch_targets(1, runner="elsewhere")
        expect(status_of_0).to_have_text("running", timeout=SHOWN_MS)
        dcache.update_batch_target(job, 0, TargetStatus.DONE, result="hello", runner="elsewhere")
        expect(status_of_0).to_have_text("done", timeout=SHOWN_MS)
        expect(page.locator("#job")).to_contain_text("1/2")
        page.goto(f"{base}/")
        jobs_cancelled = page.locator('[data-count="jobs.cancelled"]')
        expect(jobs_cancelled).to_have_text("0")
        dcache.cancel_batch_job(job)
        expect(jobs_cancelled).to_have_text("1", timeout=SHOWN_MS)
    assert page.evaluate("window.siftMarker") is None  # the overview was a new page; the job page was not


def test_read_only_shows_no_forms(shared_store: str, tmp_path: Path, page: Any) -> None:
    job = dcache.submit("alice", ["https://a.example/1"]).job_id
    dcache.claim_batch_targets(1, runner="gone", now=1_000)
    with sift_web(shared_store, "--read-only") as (base, _):
        for url in ("/", "/jobs", f"/jobs/{job}", "/callers", "/hosts", "/runners"):
            page.goto(base + url)
            expect(page.locator("nav")).to_contain_text("read-only")
            assert page.locator("form[method=post]").count() == 0, url
            assert page.locator("button[data-action]").count() == 0, url


def test_without_logging_in_the_buttons_are_absent_and_a_forged_post_is_refused(
    shared_store: str, tmp_path: Path, page: Any
) -> None:
    job = dcache.submit("alice", ["https://a.example/1"]).job_id
    with sift_web(shared_store, "--token-file", token_file(tmp_path)) as (base, _):
        page.goto(f"{base}/jobs/{job}")
        expect(page.locator("nav")).to_contain_text("Log in to act")
        assert page.locator("button[data-action]").count() == 0
        status = page.evaluate(
            """async ([url, job]) => (await fetch(url, {method: 'POST',
                body: new URLSearchParams({subject: job})})).status""",
            [f"{base}/actions/cancel", job],
        )
        assert status == 403
    found = dcache.batch_job(job)
    assert found is not None and found.status == JobStatus.QUEUED
    assert re.fullmatch(r"[0-9a-f]{32}", job)


def test_the_docs_screenshots_script_writes_its_pictures(tmp_path: Path) -> None:
    if chromium_missing():
        pytest.skip(str(chromium_missing()))
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "scripts" / "docs_screenshots.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"dashboard-{n}.png" for n in ("hosts", "job", "overview", "runners")]
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) < 200_000, (path, len(data))
