"""Screenshots of the dashboard for docs/how-to/dashboard.md, taken by headless Chromium (the system's
``chromium``, through Playwright) from a store seeded here, so that the pictures show what the code draws.

    python scripts/docs_screenshots.py                 # write docs/img/dashboard-*.png
    python scripts/docs_screenshots.py --out DIR       # write them elsewhere (the tests do)

The store is a new SQLite file in a temporary directory; the dashboard runs in a thread on 127.0.0.1, on a
free port. The pages are taken at 1000x560 CSS pixels.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from werkzeug.serving import make_server

from sift import dcache
from sift.dcache import TargetStatus
from sift.web import create_app

OUT = Path(__file__).resolve().parent.parent / "docs" / "img"


def seed(path: Path) -> str:
    """A store with callers (one paused), jobs in every state, runners holding claims (one of them stale),
    a target whose URL and error carry markup, host policies and a back-off; returns the id of a running
    job to show."""
    dcache.open_db(path)
    now = dcache.unix_now()
    shown = ""
    for n, caller in enumerate(["acme", "globex", "initech", "umbrella"]):
        for j in range(3 + n):
            urls = [f"https://site{(j + k) % 5}.example/page/{k}" for k in range(8 + 4 * n)]
            job = dcache.submit(caller, urls, idem_key=f"{caller}-{j}", now=now - 600 + 40 * j).job_id
            if j == 0 and n == 0:
                shown = job
            if j == 1:
                dcache.cancel_batch_job(job, now=now)
    dcache.submit("acme", ["https://evil.example/<script>alert(1)</script>"], idem_key="markup")
    for runner, at in (("runner-a", now), ("runner-b", now), ("runner-old", now - 600)):
        claimed = dcache.claim_batch_targets(6, runner=runner, per_job=3, now=at)
        for target in claimed[:3]:
            dcache.update_batch_target(
                target.job_id, target.idx, TargetStatus.DONE, result="<html>ok</html>" * 40
            )
        if claimed:
            last = claimed[3] if len(claimed) > 3 else claimed[-1]
            dcache.update_batch_target(last.job_id, last.idx, TargetStatus.FAILED, error="HTTP 404")
    # set after the claims, which would otherwise be paced by them
    dcache.set_host_policy("*", max_running=8)
    dcache.set_host_policy("site0.example", max_running=4, min_interval=1.5)
    dcache.back_off_host("site3.example", now + 300)
    dcache.pause_caller("globex")
    return shown


def shoot(out: Path) -> list[Path]:
    """Take the pictures into ``out``; returns their paths."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("docs_screenshots: no chromium on PATH (apt-get install chromium)")
    out.mkdir(parents=True, exist_ok=True)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    with tempfile.TemporaryDirectory() as tmp:
        job = seed(Path(tmp) / "store.db")
        server = make_server("127.0.0.1", 0, create_app(None, budget=256 * 1024), threaded=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{server.server_port}"
        pages = {"overview": "/", "job": f"/jobs/{job}", "runners": "/runners", "hosts": "/hosts"}
        written = []
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium)
                page = browser.new_page(viewport={"width": 1000, "height": 560})
                for name, url in pages.items():
                    page.goto(base + url)
                    path = out / f"dashboard-{name}.png"
                    page.screenshot(path=str(path))
                    written.append(path)
                browser.close()
        finally:
            server.shutdown()
            server.server_close()
            dcache.close_db()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=OUT, help="the directory to write into (default docs/img)"
    )
    args = parser.parse_args()
    for path in shoot(args.out):
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
