"""Peewee's documented request hooks around the store's calls, from several threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from sift import dcache
from sift.testing import make_job

from ..harness import Report, alternate
from ..sizes import T0, Sizes


def bench_hooks(tmp: Path, sizes: Sizes, report: Report) -> None:
    """Peewee's documented request hooks (``db.connect()`` before a request, ``db.close()`` after it) around
    a poll request (a read and a touch), from several threads at once, against the same requests
    without them: the time per request of each side, alternating which side goes first."""
    path = tmp / "hooks.db"
    dcache.open_db(path)
    ids = [f"job-{t}" for t in range(sizes.hooks_threads)]
    for job_id in ids:
        dcache.create_batch_job(make_job(id=job_id, created_at=T0, lease=T0))

    def poll(job_id: str, now: int) -> None:
        job = dcache.batch_job(job_id)
        assert job is not None
        dcache.touch_batch_job(job_id, now=now)

    def with_hooks(job_id: str, now: int) -> None:
        dcache.db.connect()
        try:
            poll(job_id, now)
        finally:
            if not dcache.db.is_closed():
                dcache.db.close()

    def batch(request: Callable[[str, int], None]) -> float:
        def work(job_id: str) -> None:
            for i in range(sizes.hooks_requests):
                request(job_id, T0 + i)

        threads = [threading.Thread(target=work, args=(job_id,)) for job_id in ids]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return (time.perf_counter() - start) * 1e6 / (len(ids) * sizes.hooks_requests)

    batch(poll)  # warm-up
    plain: list[float] = []
    hooked: list[float] = []
    for rnd in range(sizes.hooks_rounds):
        sides = ((poll, plain), (with_hooks, hooked))
        for request, out in alternate(rnd, sides):
            out.append(batch(request))
    dcache.close_db()
    n = sizes.hooks_threads
    base = report.case("hooks/without_hooks", n, plain)
    hooks = report.case("hooks/peewee_flask_hooks", n, hooked)
    report.goal(
        f"free hooks: time per poll request with Peewee's connect/close hooks / without, {n} threads "
        "(1.11 x = 90% of the throughput)",
        report.pair(hooks, base),
        round(1 / 0.9, 2),
        "x",
    )
