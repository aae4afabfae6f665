"""Disk space that follows the data: evict 90% of a store of results on a new file (incremental
auto-vacuum) and compare the file with its pages in use; and a backup of that store with a reader
polling."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sift import dcache

from ..fixtures import Builder, wal_bytes
from ..harness import Case, Report, log, p99, perf_ns
from ..sizes import T0, Sizes
from .locks import Reader, timed_removal


def timed_backup(copy: Path) -> dict[str, float]:
    """backup_store to ``copy`` with a reader thread polling batch_job meanwhile (the copy runs on a
    connection of its own and never takes db.lock)."""
    os.sync()
    reader = Reader("keep-0000000")
    reader.start()
    time.sleep(0.05)
    try:
        t0 = perf_ns()
        done = dcache.backup_store(copy)
        elapsed = (perf_ns() - t0) / 1e9
    finally:
        reader.stop.set()
        reader.join()
    return {
        "elapsed_s": elapsed,
        "mb": done.nbytes / 2**20,
        "mb_per_s": done.nbytes / 2**20 / elapsed,
        "reader_p99_ms": p99(reader.latencies) / 1e6,
        "reader_max_ms": max(reader.latencies, default=0) / 1e6,
    }


def bench_disk(tmp: Path, sizes: Sizes, report: Report) -> None:
    """Evict 90% of a store of results, then compare the file with the pages still in use."""
    path = tmp / "disk.db"
    dcache.open_db(path)  # a new store: incremental auto-vacuum, as every store sift creates
    dcache.close_db()
    t0 = time.perf_counter()
    b = Builder(path)
    b.jobs("evict-", sizes.disk_jobs, targets=sizes.sweep_targets, result_bytes=sizes.sweep_result, lease0=T0)
    b.jobs("keep-", 100, targets=10, result_bytes=None, lease0=T0 + 10**6, statuses=("queued",))
    b.close()
    log(
        f"disk: built {sizes.disk_jobs} jobs x {sizes.sweep_targets} targets "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    dcache.open_db(path)
    before = os.path.getsize(path)
    copy = tmp / "disk-backup.db"
    b_m = timed_backup(copy)
    copy.unlink()
    log(f"disk: backed up {before / 2**20:.0f} MiB in {b_m['elapsed_s']:.1f} s")
    total = dcache.batch_nbytes()
    evicted = sizes.disk_jobs - sizes.disk_jobs // 10
    m = timed_removal("disk", lambda: dcache.evict_batch_oldest(total // 10), evicted)
    space = dcache.store_space()
    after = os.path.getsize(path)
    m.update(
        results_mb=total / 2**20,
        file_mb_before=before / 2**20,
        file_mb_after=after / 2**20,
        live_mb=space.live_bytes / 2**20,
        free_pages=float(space.free_pages),
        file_over_live=after / space.live_bytes,
        wal_mb=wal_bytes(path) / 2**20,
    )
    dcache.close_db()
    log(
        f"disk: evicted {evicted} jobs in {m['elapsed_s']:.1f} s: "
        f"{before / 2**20:.0f} -> {after / 2**20:.0f} MiB"
    )
    report.cases.append(
        Case("disk/backup", int(b_m["mb"]), b_m["elapsed_s"] * 1e6 / b_m["mb"], None, [], b_m)
    )
    report.cases.append(Case("disk/evict_90", evicted, m["elapsed_s"] * 1e6 / evicted, None, [], m))
    report.goal("disk follows data: file / pages in use after evicting 90%", m["file_over_live"], 1.5, "x")
    report.goal("disk follows data: longest hold of db.lock", m["max_hold_ms"], 50, "ms")
