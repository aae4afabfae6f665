"""Bounded memory: the peak RSS growth of a put of many targets from a generator, in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sift import dcache
from sift.testing import make_job

from ..harness import BENCH_DIR, Case, Report, perf_ns
from ..sizes import OPTIONS, Sizes


def peak_rss_kb() -> int:
    """The process's peak resident set (VmHWM), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def rss_child(path: str, count: int) -> None:
    """In a fresh process: peak RSS before and after a put of ``count`` targets from a generator."""
    dcache.open_db(path)
    dcache.create_batch_job(make_job(id="big", targets_total=count))
    # One target at a time, as a caller streaming its input does: make_targets would hold them all.
    gen = (dcache.BatchTarget(idx=i, url=f"https://example.com/{i}", options=OPTIONS) for i in range(count))
    before = peak_rss_kb()
    t0 = perf_ns()
    dcache.put_batch_targets("big", gen)
    elapsed = perf_ns() - t0
    after = peak_rss_kb()
    stored = dcache.db.execute_sql("SELECT COUNT(*) FROM batch_target WHERE job_id = 'big'").fetchone()[0]
    dcache.close_db()
    print(json.dumps({"before_kb": before, "after_kb": after, "elapsed_s": elapsed / 1e9, "stored": stored}))


def bench_memory(tmp: Path, sizes: Sizes, report: Report) -> None:
    """The put in a fresh process (``--rss-child``), so that no earlier group's peak counts."""
    path = tmp / "rss.db"
    out = subprocess.run(
        [sys.executable, str(BENCH_DIR), "--rss-child", str(path), str(sizes.rss_targets)],
        check=True,
        capture_output=True,
        text=True,
    )
    m = json.loads(out.stdout)
    if m["stored"] != sizes.rss_targets:
        raise AssertionError(f"memory: stored {m['stored']} targets, expected {sizes.rss_targets}")
    grew_mb = (m["after_kb"] - m["before_kb"]) / 1024
    extra = {
        "peak_rss_growth_mb": grew_mb,
        "peak_rss_before_mb": m["before_kb"] / 1024,
        "elapsed_s": m["elapsed_s"],
    }
    report.cases.append(
        Case(
            "memory/put_from_generator",
            sizes.rss_targets,
            m["elapsed_s"] * 1e6 / sizes.rss_targets,
            None,
            [],
            extra,
        )
    )
    report.goal(
        f"bounded memory: peak RSS growth, put of {sizes.rss_targets} targets from a generator",
        grew_mb,
        100,
        "MB",
    )
