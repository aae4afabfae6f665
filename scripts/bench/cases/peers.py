"""Peers: a batch of targets on sift against huey's ``SqliteStorage``, at the same ``synchronous`` setting,
side by side in one run (rounds alternate the order of the sides).

One batch: submit N targets, write N results of 1 KB, read every result once. sift: ``create_batch_job``
with the targets; ``update_batch_target`` per target followed by the byte-budget check
(``evict_batch_oldest``, a no-op), or ``update_batch_targets`` of 10 results then the check; one
``batch_targets``. huey, as its API offers it: ``enqueue`` per target (one commit each), ``put_data`` per
result, ``peek_data`` per result. At NORMAL sift runs as it opens by default and huey's connections are
set to ``synchronous=NORMAL``; at FULL sift is opened with ``durable=True`` and huey runs at its default
(SQLite's FULL). huey is a bench-only dependency (``pip install -e '.[bench]'``); without it the group
says so and is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sift import dcache
from sift.testing import make_job, make_targets

from ..harness import Report, alternate, log
from ..sizes import BUDGET, OPTIONS, RESULT_1K, T0, Sizes

#: Results per update_batch_targets call on the bulk side.
BULK = 10
#: synchronous setting: (sift's open_db durable=, huey's pragma value or None for its default).
SETTINGS: dict[str, tuple[bool, int | None]] = {"normal": (False, 1), "full": (True, None)}
#: (setting, side): the most the side's batch may take, as a fraction of huey's. At NORMAL sift writing
#: one result a call is faster; at FULL (durable=True) writing 10 a call is at least 5 times faster.
GOALS: dict[tuple[str, str], float] = {("normal", "sift"): 1.0, ("full", f"sift_bulk{BULK}"): 0.2}


def huey_storage(path: Path, synchronous: int | None) -> Any:
    """huey's SqliteStorage on ``path``; ``synchronous`` set on its connection, or left at huey's default."""
    from huey.storage import SqliteStorage

    class Storage(SqliteStorage):  # type: ignore[misc]
        def _create_connection(self) -> Any:
            conn = super()._create_connection()
            if synchronous is not None:
                conn.execute(f"PRAGMA synchronous = {synchronous}")
            return conn

    return Storage(name="bench", filename=str(path))


def sift_batch(job_id: str, targets: int, bulk: int | None) -> Callable[[], None]:
    """One batch on the open store: per-target writes (``bulk`` None) or writes of ``bulk`` results."""
    job = make_job(id=job_id, caller="peers", targets_total=targets, created_at=T0, lease=T0)
    rows = make_targets(targets, options=OPTIONS)
    now = T0 + 1

    def run() -> None:
        dcache.create_batch_job(job, rows)
        if bulk is None:
            for i in range(targets):
                dcache.update_batch_target(job_id, i, "done", result=RESULT_1K, now=now)
                dcache.evict_batch_oldest(BUDGET)
        else:
            for start in range(0, targets, bulk):
                results = [
                    {"idx": i, "status": "done", "result": RESULT_1K}
                    for i in range(start, min(start + bulk, targets))
                ]
                dcache.update_batch_targets(job_id, results, now=now)
                dcache.evict_batch_oldest(BUDGET)
        got = dcache.batch_targets(job_id)
        if got is None or len(got) != targets or got[-1].result != RESULT_1K:
            raise AssertionError("sift: the batch's results are not all there")

    return run


def huey_batch(storage: Any, prefix: str, targets: int) -> Callable[[], None]:
    """One batch on huey's storage: an enqueue per target, a put_data per result, a peek_data per result."""
    payloads = [f"https://example.com/{i} {OPTIONS}".encode() for i in range(targets)]
    keys = [f"{prefix}:{i}" for i in range(targets)]
    result = RESULT_1K.encode()

    def run() -> None:
        for payload in payloads:
            storage.enqueue(payload)
        for key in keys:
            storage.put_data(key, result)
        if any(storage.peek_data(key) is None for key in keys):
            raise AssertionError("huey: the batch's results are not all there")

    return run


def bench_peers(tmp: Path, sizes: Sizes, report: Report) -> None:
    """sift per-target, sift bulk and huey, at NORMAL and at FULL, one batch of each side per round."""
    try:
        import huey  # noqa: F401
    except ImportError:
        log("peers: huey is not installed (pip install -e '.[bench]'): its comparison is skipped")
        return
    targets = sizes.submit_targets
    for name, (durable, synchronous) in SETTINGS.items():
        dcache.open_db(tmp / f"peers-sift-{name}.db", durable=durable)
        storage = huey_storage(tmp / f"peers-huey-{name}.db", synchronous)
        samples: dict[str, list[float]] = {"sift": [], f"sift_bulk{BULK}": [], "huey": []}
        rounds = sizes.raw_rounds if name == "normal" else max(1, sizes.raw_rounds // 3)
        for rnd in range(rounds + 1):  # round 0 warms up, untimed
            sides = {
                "sift": sift_batch(f"{name}-{rnd}", targets, None),
                f"sift_bulk{BULK}": sift_batch(f"{name}-{rnd}-bulk", targets, BULK),
                "huey": huey_batch(storage, f"{name}-{rnd}", targets),
            }
            for side in alternate(rnd, tuple(sides)):
                t0 = time.perf_counter()
                sides[side]()
                if rnd:  # µs per target of the batch
                    samples[side].append((time.perf_counter() - t0) * 1e6 / targets)
        storage.close()
        dcache.close_db()
        huey_case = report.case(f"peers/{name}/huey", targets, samples["huey"])
        for side in ("sift", f"sift_bulk{BULK}"):
            ratio = report.pair(report.case(f"peers/{name}/{side}", targets, samples[side]), huey_case)
            report.goal(
                f"peers: a {targets}-target batch at synchronous={name.upper()}, {side}/huey",
                ratio,
                GOALS.get((name, side)),
                "x",
            )
