"""Operations on a large store: open_db against a small store's, and check_store against one plain GROUP BY
pass computing the same sums."""

from __future__ import annotations

import time
from pathlib import Path

from sift import dcache

from ..fixtures import Builder, raw_connect
from ..harness import Report, alternate, log, perf_ns
from ..sizes import T0, Sizes

#: The same sums check_store makes, in one plain GROUP BY pass over the file: its speed limit.
GROUP_BY_PASS = (
    "SELECT j.id, j.targets_done, j.nbytes, t.done, t.nbytes FROM batch_job AS j LEFT JOIN ("
    "SELECT job_id, SUM(status IN ('done', 'failed')) AS done, "
    "SUM(COALESCE(length(CAST(result AS BLOB)), 0)) AS nbytes FROM batch_target GROUP BY job_id"
    ") AS t ON t.job_id = j.id"
)


def bench_ops(tmp: Path, sizes: Sizes, report: Report) -> None:
    """open_db on a small and a large store (alternating), and check_store on the large one against one
    plain-sqlite3 GROUP BY pass computing the same sums."""
    stores = (sizes.ops_small, sizes.ops_large)
    paths = {n: tmp / f"ops-{n}.db" for n in stores}
    for n in stores:
        t0 = time.perf_counter()
        b = Builder(paths[n])
        b.jobs("job-", n, targets=3, result_bytes=sizes.ops_result, lease0=T0)
        b.close()
        dcache.open_db(paths[n])  # the speed schema and the total, as for any file written elsewhere
        dcache.close_db()
        log(f"ops: built {n} jobs x 3 targets in {time.perf_counter() - t0:.1f} s")
    opens: dict[int, list[float]] = {n: [] for n in stores}
    for rnd in range(sizes.ops_opens):
        for n in alternate(rnd, stores):
            t0 = perf_ns()
            dcache.open_db(paths[n])
            opens[n].append((perf_ns() - t0) / 1000)
            dcache.close_db()
    small = report.case("ops/open_db", sizes.ops_small, opens[sizes.ops_small])
    large = report.case("ops/open_db", sizes.ops_large, opens[sizes.ops_large])
    ratio = report.pair(large, small)
    report.goal(f"O(1) open: open_db at N={sizes.ops_large} / N={sizes.ops_small} jobs", ratio, 1.3, "x")

    checks: list[float] = []
    passes: list[float] = []
    dcache.open_db(paths[sizes.ops_large])
    plain = raw_connect(paths[sizes.ops_large])
    for rnd in range(sizes.ops_checks):
        for side in alternate(rnd, ("check", "pass")):
            t0 = perf_ns()
            if side == "check":
                assert dcache.check_store().ok
                checks.append((perf_ns() - t0) / 1000)
            else:
                rows = plain.execute(GROUP_BY_PASS).fetchall()
                assert all(r[1] == r[3] and r[2] == r[4] for r in rows)
                passes.append((perf_ns() - t0) / 1000)
    plain.close()
    dcache.close_db()
    check = report.case("ops/check_store", sizes.ops_large, checks)
    baseline = report.case("ops/group_by_pass", sizes.ops_large, passes)
    report.goal(
        f"fast check: check_store / one GROUP BY pass, N={sizes.ops_large} jobs (2 x = 50% of its speed)",
        report.pair(check, baseline),
        2.0,
        "x",
    )
