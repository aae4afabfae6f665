#!/usr/bin/env python3
"""Benchmark of the batch store's hot paths (issue 4): flat in history, close to raw SQLite, short lock
holds, bounded memory and disk.

    python scripts/bench.py                # full run, under 3 minutes on 2 cores
    python scripts/bench.py --quick        # small sizes, under 20 s: keeps the script working in CI
    python scripts/bench.py --json out.json

Every fixture is a real SQLite file in WAL mode, built in a temporary directory. Fixture building is
not timed. Each timed case runs in batches of calls; a batch gives one figure, µs per call, and the
table shows the median over all batches. The two sides of a ratio (N=1k and N=100k, or the package and
its plain ``sqlite3`` baseline) run interleaved, batch by batch, so that drift in the machine hits both.

Lock holds are measured by wrapping ``db.lock`` in a timing proxy for the sweep and eviction cases only
(the package is not changed); the reader thread's latencies are measured around each ``batch_job`` call.
The disk group (issue 11) evicts 90% of a store of results on a new (incremental auto-vacuum) file and
compares the file's size with its pages in use, timing db.lock the same way; it also times a backup_store
of that store with the reader polling. Peak RSS is measured in a fresh subprocess (VmHWM). Goals are
printed as PASS/FAIL lines. The exit status is 0 whatever the figures (``--check`` makes a failed goal
exit 1): the suite never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from sift import dcache
from sift.dcache import manager, statements
from sift.dcache.sqlite import BASE_SCHEMA, PRAGMAS, TOTAL_NBYTES_SQL

perf_ns = time.perf_counter_ns

#: The start of the fixtures' clock: leases and created_at count up from here.
T0 = 1_700_000_000
#: A byte budget no fixture reaches: evict_batch_oldest(BUDGET) is a no-op.
BUDGET = 10**15
OPTIONS = '{"render":false}'
#: The runner's result: 1 KB of ASCII.
RESULT_1K = "r" * 1024
#: Statuses of the retained finished jobs, in turn.
FINISHED = ("done", "partial", "failed", "cancelled")


@dataclass(frozen=True)
class Sizes:
    """Every size and repeat count of one run."""

    flat_small: int  # retained finished jobs, small store
    flat_large: int  # retained finished jobs, large store
    targets_per_job: int  # targets of each retained job
    retained_result: int  # bytes of each retained target's result
    flat_rounds: int  # rounds; each opens each store once
    flat_batches: int  # timed batches per case, round and store
    flat_ops: int  # calls per batch
    warmup: int  # untimed calls per case after each open
    raw_rounds: int  # rounds of the runner-step and submit comparisons
    raw_ops: int  # runner steps per batch (submit: a tenth of it)
    submit_targets: int  # targets of each submitted job
    put_targets: int  # targets of one put_batch_targets
    put_rounds: int  # puts per side
    read_targets: int  # targets of the job that batch_targets reads
    read_result: int  # bytes of each of its results
    read_rounds: int
    read_ops: int
    sweep_jobs: int  # expired jobs to sweep, and again jobs to evict
    sweep_targets: int  # targets of each of them
    sweep_result: int  # bytes of each of their results
    rss_targets: int  # targets put from a generator in the memory case
    plugin_tests: int  # tests of each pytest run in the testing case
    plugin_rounds: int  # pytest runs of each side
    hooks_threads: int  # request threads of the hooks case
    ops_small: int  # jobs of the small store in the ops case (3 targets each)
    ops_large: int  # jobs of the large store
    ops_result: int  # bytes of each target's result there
    ops_opens: int  # timed open_db calls per store
    ops_checks: int  # timed check_store runs and GROUP BY passes
    hooks_requests: int  # requests per thread in each batch
    hooks_rounds: int  # batches of each side
    disk_jobs: int  # finished jobs of the disk case, 90% of them evicted


FULL = Sizes(
    flat_small=1_000,
    flat_large=100_000,
    targets_per_job=10,
    retained_result=1024,
    flat_rounds=5,
    flat_batches=4,
    flat_ops=200,
    warmup=100,
    raw_rounds=10,
    raw_ops=200,
    submit_targets=100,
    put_targets=100_000,
    put_rounds=5,
    read_targets=10_000,
    read_result=64,
    read_rounds=7,
    read_ops=3,
    sweep_jobs=10_000,
    sweep_targets=100,
    sweep_result=1024,
    rss_targets=1_000_000,
    plugin_tests=1_000,
    plugin_rounds=7,
    hooks_threads=8,
    hooks_requests=250,
    hooks_rounds=9,
    ops_small=1_000,
    ops_large=1_000_000,
    ops_result=300,
    ops_opens=41,
    ops_checks=3,
    disk_jobs=10_000,
)

QUICK = Sizes(
    flat_small=100,
    flat_large=2_000,
    targets_per_job=10,
    retained_result=64,
    flat_rounds=2,
    flat_batches=2,
    flat_ops=50,
    warmup=10,
    raw_rounds=3,
    raw_ops=50,
    submit_targets=100,
    put_targets=5_000,
    put_rounds=2,
    read_targets=1_000,
    read_result=64,
    read_rounds=2,
    read_ops=2,
    sweep_jobs=200,
    sweep_targets=20,
    sweep_result=64,
    rss_targets=20_000,
    plugin_tests=100,
    plugin_rounds=2,
    hooks_threads=8,
    hooks_requests=20,
    hooks_rounds=2,
    ops_small=100,
    ops_large=2_000,
    ops_result=64,
    ops_opens=5,
    ops_checks=1,
    disk_jobs=200,
)

FLAT_CASES = (
    "runner_step",
    "batch_job_by_idem",
    "live_batch_jobs",
    "live_batch_jobs_total",
    "batch_nbytes",
    "sweep_batch_noop",
    "batch_job",
)
RAW_CASES = ("runner_step", "submit_100", "put_batch_targets", "batch_targets_read")
#: Every case name the JSON holds (tests/test_bench_script.py checks the same list independently).
CASE_NAMES = (
    *(f"flat/{c}" for c in FLAT_CASES),
    *(f"raw/{c}/{side}" for c in RAW_CASES for side in ("package", "sqlite3")),
    "locks/sweep",
    "locks/evict",
    "memory/put_from_generator",
    "testing/empty_tests",
    "testing/sift_store_tests",
    "hooks/without_hooks",
    "hooks/peewee_flask_hooks",
    "ops/open_db",
    "ops/check_store",
    "ops/group_by_pass",
    "disk/backup",
    "disk/evict_90",
    *(f"tail/{w}/{side}" for w in ("update_batch_target", "mix") for side in ("busy_handler", "queue")),
)


@dataclass
class Case:
    name: str
    n: int
    median_us: float
    ratio: float | None = None  # flat: median at this N / at the small N; raw: package / sqlite3
    samples_us: list[float] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Goal:
    name: str
    value: float
    limit: float | None  # None: reported, no goal
    unit: str

    @property
    def verdict(self) -> str:
        if self.limit is None:
            return "INFO"
        return "PASS" if self.value <= self.limit else "FAIL"


@dataclass
class Report:
    cases: list[Case] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)

    def case(self, name: str, n: int, samples: list[float], **extra: float) -> Case:
        c = Case(name, n, statistics.median(samples), None, [round(s, 3) for s in samples], extra)
        self.cases.append(c)
        return c


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- Fixtures -------------------------------------------------------------------------------------------


def raw_connect(path: Path, *, bulk: bool = False) -> sqlite3.Connection:
    """A plain sqlite3 connection in autocommit mode. ``bulk``: no journal, for building fixtures fast
    (the file is switched to WAL when the builder closes); otherwise the package's pragmas."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
    pragmas: dict[str, object] = {"journal_mode": "off", "synchronous": "off"} if bulk else PRAGMAS
    for name, value in pragmas.items():
        conn.execute(f"PRAGMA {name} = {value}")
    return conn


class Builder:
    """Bulk-inserts fixture rows with plain SQL (recursive CTEs) into a file the package will open.

    The package is closed while it runs. On a new file, ``open_db`` then adds the speed schema and
    computes the byte total, as for a file written by another program; on a store file, the store's
    triggers keep the total while the rows go in.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = raw_connect(path, bulk=True)
        for statement in BASE_SCHEMA:
            self.conn.execute(statement)
        self.conn.execute("BEGIN")

    def jobs(
        self,
        prefix: str,
        count: int,
        *,
        targets: int,
        result_bytes: int | None,
        lease0: int,
        statuses: tuple[str, ...] = FINISHED,
        callers: int = 100,
    ) -> None:
        """``count`` jobs ``{prefix}{i:07d}`` with ``targets`` targets each; result_bytes None: pending
        targets without results, else finished targets holding that many bytes each."""
        done = 0 if result_bytes is None else targets
        nbytes = 0 if result_bytes is None else targets * result_bytes
        status_sql = "CASE i % {} {} END".format(
            len(statuses), " ".join(f"WHEN {k} THEN '{s}'" for k, s in enumerate(statuses))
        )
        self.conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
            "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, error, targets_total, "
            "targets_done, created_at, lease, nbytes) "
            f"SELECT ? || printf('%07d', i), 'caller-' || (i % ?), 'fleet', ? || 'idem-' || i, {status_sql}, "
            "'', ?, ?, ? + i, ? + i, ? FROM n",
            (count, prefix, callers, prefix, targets, done, lease0, lease0, nbytes),
        )
        if targets:
            self.targets_of("b.id LIKE ?", prefix + "%", targets, result_bytes)

    def one_job(
        self, job_id: str, *, caller: str, status: str, targets: int, result_bytes: int | None, lease: int
    ) -> None:
        done, nbytes = (0, 0) if result_bytes is None else (targets, targets * result_bytes)
        self.conn.execute(
            "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, error, targets_total, "
            "targets_done, created_at, lease, nbytes) VALUES (?, ?, 'fleet', '', ?, '', ?, ?, ?, ?, ?)",
            (job_id, caller, status, targets, done, lease, lease, nbytes),
        )
        if targets:
            self.targets_of("b.id = ?", job_id, targets, result_bytes)

    def targets_of(self, where: str, param: str, targets: int, result_bytes: int | None) -> None:
        """``targets`` targets for each job matching ``where``: pending, or done with a result."""
        params: tuple[object, ...]
        if result_bytes is None:
            status, result, params = "'pending'", "NULL", (targets, param)
        else:
            status, result, params = "'done'", "printf('%.*c', ?, 'r')", (targets, result_bytes, param)
        self.conn.execute(
            "WITH RECURSIVE n(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM n WHERE j + 1 < ?) "
            "INSERT INTO batch_target (job_id, idx, url, options, status, result, error, hint) "
            f"SELECT b.id, n.j, 'https://example.com/' || b.id || '/' || n.j, '{OPTIONS}', {status}, "
            f"{result}, NULL, NULL FROM batch_job AS b, n WHERE {where} ORDER BY b.id, n.j",
            params,
        )

    def close(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.execute("PRAGMA journal_mode = wal")
        self.conn.close()
        # The bulk insert ran with synchronous=off: flush its pages to disk now, or the store's first
        # checkpoint fsync would pay for the whole fixture inside a timed lock hold.
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def wal_bytes(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


# -- Timing ---------------------------------------------------------------------------------------------


Op = Callable[[int], object]


def time_batch(op: Op, start: int, count: int) -> float:
    """Run ``op(start) .. op(start + count - 1)``; µs per call."""
    t0 = perf_ns()
    for i in range(start, start + count):
        op(i)
    return (perf_ns() - t0) / count / 1000


# -- (a) Flat in history --------------------------------------------------------------------------------


def build_flat(path: Path, n: int, sizes: Sizes, runner_targets: int) -> None:
    b = Builder(path)
    b.jobs("job-", n, targets=sizes.targets_per_job, result_bytes=sizes.retained_result, lease0=T0)
    for k in range(10):  # a few live jobs, so the live counts count something
        b.one_job(
            f"live-{k}", caller=f"caller-{k}", status="queued", targets=0, result_bytes=None, lease=T0 + n
        )
    b.one_job(
        "runner", caller="caller-0", status="running", targets=runner_targets, result_bytes=None, lease=T0 + n
    )
    b.close()


def hot_paths(n: int) -> dict[str, Op]:
    """The hot paths on the open store of ``n`` retained jobs; ``op(i)`` is the i-th call."""
    rng = random.Random(n)
    now = T0 + n + 1000
    # Hits of the idempotency lookup: jobs in done or partial, spread over the whole store.
    idem = [(f"caller-{i % 100}", f"job-idem-{i}") for i in (rng.randrange(n // 4) * 4 for _ in range(4096))]
    ids = [f"job-{rng.randrange(n):07d}" for _ in range(4096)]
    sweep_ttl = now - T0 + 1  # cutoff just below the oldest lease: nothing is due

    def runner_step(i: int) -> None:
        dcache.update_batch_target("runner", i, "done", result=RESULT_1K, now=now)
        dcache.evict_batch_oldest(BUDGET)

    def by_idem(i: int) -> None:
        caller, key = idem[i % 4096]
        if dcache.batch_job_by_idem(caller, key, 10**6, now=now) is None:
            raise AssertionError(f"idem miss for {key}")

    def get_job(i: int) -> None:
        if dcache.batch_job(ids[i % 4096]) is None:
            raise AssertionError("batch_job miss")

    def sweep_noop(i: int) -> None:
        if dcache.sweep_batch(sweep_ttl, now=now):
            raise AssertionError("sweep removed jobs")

    return {
        "runner_step": runner_step,
        "batch_job_by_idem": by_idem,
        "live_batch_jobs": lambda i: dcache.live_batch_jobs("caller-3"),
        "live_batch_jobs_total": lambda i: dcache.live_batch_jobs_total(),
        "batch_nbytes": lambda i: dcache.batch_nbytes(),
        "sweep_batch_noop": sweep_noop,
        "batch_job": get_job,
    }


def bench_flat(tmp: Path, sizes: Sizes, report: Report) -> None:
    stores = (sizes.flat_small, sizes.flat_large)
    runner_targets = sizes.flat_rounds * (sizes.warmup + sizes.flat_batches * sizes.flat_ops) + 10
    paths = {n: tmp / f"flat-{n}.db" for n in stores}
    for n in stores:
        t0 = time.perf_counter()
        build_flat(paths[n], n, sizes, runner_targets)
        log(f"flat: built {n} jobs x {sizes.targets_per_job} targets in {time.perf_counter() - t0:.1f} s")
    samples: dict[tuple[int, str], list[float]] = {(n, c): [] for n in stores for c in FLAT_CASES}
    step = dict.fromkeys(stores, 0)  # next runner target of each store
    for rnd in range(sizes.flat_rounds):
        for n in stores if rnd % 2 == 0 else stores[::-1]:
            dcache.open_db(paths[n])
            ops = hot_paths(n)
            for case in FLAT_CASES:  # warm the page cache after the open
                start = step[n] if case == "runner_step" else 0
                time_batch(ops[case], start, sizes.warmup)
            step[n] += sizes.warmup
            for _ in range(sizes.flat_batches):
                for case in FLAT_CASES:
                    start = step[n] if case == "runner_step" else rng_start(rnd)
                    samples[n, case].append(time_batch(ops[case], start, sizes.flat_ops))
                step[n] += sizes.flat_ops
            dcache.close_db()
    for case in FLAT_CASES:
        small = report.case(f"flat/{case}", sizes.flat_small, samples[sizes.flat_small, case])
        large = report.case(f"flat/{case}", sizes.flat_large, samples[sizes.flat_large, case])
        small.ratio = 1.0
        large.ratio = large.median_us / small.median_us
        report.goals.append(
            Goal(
                f"flat in history: {case} median(N={sizes.flat_large})/median(N={sizes.flat_small})",
                large.ratio,
                1.3,
                "x",
            )
        )


def rng_start(rnd: int) -> int:
    return (rnd * 997) % 4096


# -- (b) Close to raw SQLite -----------------------------------------------------------------------------

# The baseline runs the package's own SQL text, with parameters written out by hand. These are the
# parameter layouts that hand-written code assumes; check_layouts() fails loudly if the package changes.
LAYOUTS: dict[str, list[object]] = {
    "_FINISH_ON_JOB": [
        "final",
        1,
        0,
        "job_id",
        "idx",
        "now",
        "size",
        0,
        "job_id",
        "idx",
        "job_id",
        "job_id",
        "idx",
        "final",
        1,
    ],
    "_SET_TARGET": ["status", "result", "error", "hint", "job_id", "idx"],
    "_INSERT_JOB": [
        "id",
        "caller",
        "caller_class",
        "idem_key",
        "status",
        "error",
        "targets_total",
        "targets_done",
        "created_at",
        "lease",
        "nbytes",
    ],
    "_INSERT_TARGET": ["job_id", "idx", "url", "options", "options"],
    "_TARGETS_TOTAL": ["job_id"],
    "_SELECT_TARGETS": ["job_id"],
}


def check_layouts() -> None:
    for name, layout in LAYOUTS.items():
        stmt: statements.Statement = getattr(manager, name)
        actual = [getattr(p, "name", p) for p in stmt.template]
        if actual != layout:
            raise SystemExit(f"bench.py: manager.{name} now takes {actual}, the baseline assumes {layout}")


class Baseline:
    """The same work with the stdlib sqlite3 module, as plainly as a competent engineer writes it:
    the same SQL, one connection in autocommit mode, BEGIN IMMEDIATE ... COMMIT where the package
    opens a write transaction."""

    def __init__(self, path: Path) -> None:
        self.conn = raw_connect(path)
        self.finish_sql = manager._FINISH_ON_JOB.sql
        self.set_target_sql = manager._SET_TARGET.sql
        self.insert_job_sql = manager._INSERT_JOB.sql
        self.insert_target_sql = manager._INSERT_TARGET.sql
        self.targets_total_sql = manager._TARGETS_TOTAL.sql
        self.select_targets_sql = manager._SELECT_TARGETS.sql

    def close(self) -> None:
        self.conn.close()

    def update_target_done(self, job_id: str, idx: int, result: str, now: int) -> None:
        size = len(result.encode("utf-8"))
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            cur = conn.execute(
                self.finish_sql, (1, 1, 0, job_id, idx, now, size, 0, job_id, idx, job_id, job_id, idx, 1, 1)
            )
            if cur.rowcount != 1:
                raise LookupError(f"no target {job_id}/{idx}")
            conn.execute(self.set_target_sql, ("done", result, None, None, job_id, idx))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def evict_noop(self, max_bytes: int) -> None:
        (total,) = self.conn.execute(TOTAL_NBYTES_SQL).fetchone()
        if total > max_bytes:
            raise AssertionError("the baseline does not evict")

    def create_job(self, job: tuple[Any, ...], targets: list[tuple[Any, ...]]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(self.insert_job_sql, job)
            conn.executemany(self.insert_target_sql, targets)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def put_targets(self, job_id: str, targets: list[tuple[Any, ...]]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute(self.targets_total_sql, (job_id,)).fetchone() is None:
                raise LookupError(job_id)
            conn.executemany(self.insert_target_sql, targets)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def read_targets(self, job_id: str) -> list[Any]:
        return self.conn.execute(self.select_targets_sql, (job_id,)).fetchall()


def job_row(job_id: str, targets_total: int) -> tuple[Any, ...]:
    return (job_id, "caller-1", "fleet", "", "queued", "", targets_total, 0, T0, T0, 0)


def target_rows(job_id: str, count: int) -> list[tuple[Any, ...]]:
    return [(job_id, i, f"https://example.com/{i}", OPTIONS, OPTIONS) for i in range(count)]


def make_job(job_id: str, targets_total: int) -> dcache.BatchJob:
    return dcache.BatchJob(
        id=job_id,
        caller="caller-1",
        caller_class="fleet",
        idem_key="",
        status="queued",
        error="",
        targets_total=targets_total,
        targets_done=0,
        created_at=T0,
        lease=T0,
        nbytes=0,
    )


def make_targets(count: int) -> list[dcache.BatchTarget]:
    return [dcache.BatchTarget(idx=i, url=f"https://example.com/{i}", options=OPTIONS) for i in range(count)]


def interleave(
    rounds: int, pkg_op: Op, base_op: Op, start: Callable[[int], int], count: int
) -> tuple[list[float], list[float]]:
    """One batch of each side per round, alternating which goes first; µs per call of each batch."""
    pkg: list[float] = []
    base: list[float] = []
    for rnd in range(rounds):
        sides = ((pkg_op, pkg), (base_op, base))
        for op, out in sides if rnd % 2 == 0 else sides[::-1]:
            out.append(time_batch(op, start(rnd), count))
    return pkg, base


def ratio_pair(report: Report, case: str, n: int, pkg: list[float], base: list[float]) -> float:
    p = report.case(f"raw/{case}/package", n, pkg)
    b = report.case(f"raw/{case}/sqlite3", n, base)
    p.ratio = p.median_us / b.median_us
    b.ratio = 1.0
    return p.ratio


def bench_raw(tmp: Path, sizes: Sizes, report: Report) -> None:
    check_layouts()
    pkg_path, base_path = tmp / "raw-package.db", tmp / "raw-sqlite3.db"
    steps = sizes.raw_rounds * sizes.raw_ops + sizes.warmup + 10
    b = Builder(pkg_path)
    b.jobs(
        "job-", sizes.flat_small, targets=sizes.targets_per_job, result_bytes=sizes.retained_result, lease0=T0
    )
    b.one_job("runner", caller="caller-0", status="running", targets=steps, result_bytes=None, lease=T0 + 1)
    b.one_job(
        "reader",
        caller="caller-0",
        status="done",
        targets=sizes.read_targets,
        result_bytes=sizes.read_result,
        lease=T0 + 1,
    )
    b.close()
    dcache.open_db(pkg_path)  # the speed schema, so both files are the same
    dcache.close_db()
    shutil.copyfile(pkg_path, base_path)
    dcache.open_db(pkg_path)
    base = Baseline(base_path)
    now = T0 + 10

    # Runner step: update_batch_target to done with 1 KB, then a no-op eviction.
    def pkg_step(i: int) -> None:
        dcache.update_batch_target("runner", i, "done", result=RESULT_1K, now=now)
        dcache.evict_batch_oldest(BUDGET)

    def base_step(i: int) -> None:
        base.update_target_done("runner", i, RESULT_1K, now)
        base.evict_noop(BUDGET)

    time_batch(pkg_step, 0, sizes.warmup)
    time_batch(base_step, 0, sizes.warmup)
    pkg, raw = interleave(
        sizes.raw_rounds, pkg_step, base_step, lambda r: sizes.warmup + r * sizes.raw_ops, sizes.raw_ops
    )
    ratio = ratio_pair(report, "runner_step", 1, pkg, raw)
    report.goals.append(Goal("close to raw: runner step package/sqlite3", ratio, 1.5, "x"))

    # Submit path: create_batch_job with 100 targets. Inputs are built before timing.
    per_batch = max(1, sizes.raw_ops // 10)
    total = (sizes.raw_rounds + 1) * per_batch
    pkg_jobs = [
        (make_job(f"sub-p-{i}", sizes.submit_targets), make_targets(sizes.submit_targets))
        for i in range(total)
    ]
    base_jobs = [
        (job_row(f"sub-b-{i}", sizes.submit_targets), target_rows(f"sub-b-{i}", sizes.submit_targets))
        for i in range(total)
    ]

    def pkg_submit(i: int) -> None:
        dcache.create_batch_job(*pkg_jobs[i])

    def base_submit(i: int) -> None:
        base.create_job(*base_jobs[i])

    time_batch(pkg_submit, 0, per_batch)
    time_batch(base_submit, 0, per_batch)
    pkg, raw = interleave(sizes.raw_rounds, pkg_submit, base_submit, lambda r: (r + 1) * per_batch, per_batch)
    ratio = ratio_pair(report, "submit_100", sizes.submit_targets, pkg, raw)
    report.goals.append(
        Goal(
            f"close to raw: create_batch_job with {sizes.submit_targets} targets package/sqlite3",
            ratio,
            1.5,
            "x",
        )
    )
    pkg_jobs.clear()
    base_jobs.clear()

    # put_batch_targets of 100,000 targets vs executemany; one call is the whole put. The BatchTarget
    # instances (package) and the row tuples (baseline) are built before timing.
    targets = make_targets(sizes.put_targets)
    rows = [target_rows(f"put-b-{r}", sizes.put_targets) for r in range(sizes.put_rounds)]
    for r in range(sizes.put_rounds):
        dcache.create_batch_job(make_job(f"put-p-{r}", sizes.put_targets))
        base.create_job(job_row(f"put-b-{r}", sizes.put_targets), [])

    def pkg_put(r: int) -> None:
        dcache.put_batch_targets(f"put-p-{r}", targets)

    def base_put(r: int) -> None:
        base.put_targets(f"put-b-{r}", rows[r])

    pkg, raw = interleave(sizes.put_rounds, pkg_put, base_put, lambda r: r, 1)
    ratio = ratio_pair(report, "put_batch_targets", sizes.put_targets, pkg, raw)
    report.goals.append(
        Goal(
            f"close to raw: put_batch_targets of {sizes.put_targets} targets package/executemany",
            ratio,
            1.5,
            "x",
        )
    )
    targets.clear()
    rows.clear()

    # Reading batch_targets of a 10,000-target job (model instances) vs fetchall (tuples).
    def pkg_read(i: int) -> None:
        got = dcache.batch_targets("reader")
        if got is None or len(got) != sizes.read_targets:
            raise AssertionError("batch_targets read the wrong rows")

    def base_read(i: int) -> None:
        if len(base.read_targets("reader")) != sizes.read_targets:
            raise AssertionError("fetchall read the wrong rows")

    time_batch(pkg_read, 0, 1)
    time_batch(base_read, 0, 1)
    pkg, raw = interleave(sizes.read_rounds, pkg_read, base_read, lambda r: 0, sizes.read_ops)
    ratio = ratio_pair(report, "batch_targets_read", sizes.read_targets, pkg, raw)
    report.goals.append(
        Goal(
            f"close to raw: batch_targets of {sizes.read_targets} targets package/fetchall (report only)",
            ratio,
            None,
            "x",
        )
    )
    base.close()
    dcache.close_db()


# -- (c) Short lock holds, and (d) the -wal file -------------------------------------------------------


class TimedLock:
    """Wraps db.lock (an RLock) and records how long each outermost hold lasted, per thread."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.depth = 0  # only the owner changes it, while holding inner
        self.since = 0
        self.holds: list[tuple[int, int]] = []  # (ns held, thread ident)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = bool(self.inner.acquire(blocking, timeout))
        if got:
            self.depth += 1
            if self.depth == 1:
                self.since = perf_ns()
        return got

    def release(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.holds.append((perf_ns() - self.since, threading.get_ident()))
        self.inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class Reader(threading.Thread):
    """Calls batch_job in a loop and records each call's latency."""

    def __init__(self, job_id: str) -> None:
        super().__init__(daemon=True)
        self.job_id = job_id
        self.stop = threading.Event()
        self.latencies: list[int] = []

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = perf_ns()
            if dcache.batch_job(self.job_id) is None:
                raise AssertionError("the reader's job is gone")
            self.latencies.append(perf_ns() - t0)


def p99(values: list[int]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


def timed_removal(label: str, run: Callable[[], int], expect: int) -> dict[str, float]:
    """Run a sweep or eviction with db.lock timed and a reader thread polling batch_job."""
    os.sync()  # no writeback of earlier groups' files (or their deletion) left to stall the timed run
    lock = TimedLock(dcache.db.lock)
    dcache.db.lock = lock
    reader = Reader("keep-0000000")
    try:
        reader.start()
        time.sleep(0.05)
        t0 = perf_ns()
        removed = run()
        elapsed = perf_ns() - t0
    finally:
        reader.stop.set()
        reader.join()
        dcache.db.lock = lock.inner
    if removed != expect:
        raise AssertionError(f"{label}: removed {removed} jobs, expected {expect}")
    mine = threading.get_ident()
    holds = sorted(ns for ns, who in lock.holds if who == mine)  # this thread: the sweep or eviction
    return {
        "max_hold_ms": holds[-1] / 1e6,
        "hold_p50_ms": holds[len(holds) // 2] / 1e6,
        "hold_p99_ms": p99(holds) / 1e6,
        "holds": float(len(holds)),
        "holds_over_50ms": float(sum(ns > 50_000_000 for ns in holds)),
        "max_hold_any_thread_ms": max(ns for ns, _ in lock.holds) / 1e6,
        "reader_p99_ms": p99(reader.latencies) / 1e6,
        "reader_max_ms": max(reader.latencies, default=0) / 1e6,
        "reader_calls": float(len(reader.latencies)),
        "elapsed_s": elapsed / 1e9,
    }


def bench_locks(tmp: Path, sizes: Sizes, report: Report) -> None:
    path = tmp / "sweep.db"
    rows = sizes.sweep_jobs * (sizes.sweep_targets + 1)
    t0 = time.perf_counter()
    b = Builder(path)
    b.jobs("old-", sizes.sweep_jobs, targets=sizes.sweep_targets, result_bytes=sizes.sweep_result, lease0=T0)
    b.jobs("keep-", 100, targets=10, result_bytes=None, lease0=T0 + 10**6, statuses=("queued",))
    b.close()
    log(
        f"locks: built {sizes.sweep_jobs} expired jobs x {sizes.sweep_targets} targets "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    dcache.open_db(path)
    now = T0 + 10**6
    sweep = timed_removal("sweep", lambda: dcache.sweep_batch(1000, now=now), sizes.sweep_jobs)
    sweep["wal_mb"] = wal_bytes(path) / 2**20
    log(f"locks: swept {rows} rows in {sweep['elapsed_s']:.1f} s")
    dcache.close_db()

    t0 = time.perf_counter()
    b = Builder(path)
    b.jobs(
        "evict-", sizes.sweep_jobs, targets=sizes.sweep_targets, result_bytes=sizes.sweep_result, lease0=T0
    )
    b.close()
    log(f"locks: built {sizes.sweep_jobs} evictable jobs in {time.perf_counter() - t0:.1f} s")
    dcache.open_db(path)
    keep_bytes = dcache.batch_nbytes() - sizes.sweep_jobs * sizes.sweep_targets * sizes.sweep_result
    evict = timed_removal("evict", lambda: dcache.evict_batch_oldest(keep_bytes), sizes.sweep_jobs)
    evict["wal_mb"] = wal_bytes(path) / 2**20
    log(f"locks: evicted {rows} rows in {evict['elapsed_s']:.1f} s")
    dcache.close_db()

    for name, m in (("sweep", sweep), ("evict", evict)):
        report.cases.append(Case(f"locks/{name}", rows, m["elapsed_s"] * 1e6 / sizes.sweep_jobs, None, [], m))
        report.goals.append(Goal(f"short locks: {name} longest hold of db.lock", m["max_hold_ms"], 50, "ms"))
        report.goals.append(
            Goal(f"short locks: reader batch_job p99 during {name}", m["reader_p99_ms"], 50, "ms")
        )
        report.goals.append(Goal(f"bounded disk: -wal file after {name}", m["wal_mb"], 64, "MB"))


# -- Disk space that follows the data (issue 11) -------------------------------------------------------


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
    report.goals.append(
        Goal("disk follows data: file / pages in use after evicting 90%", m["file_over_live"], 1.5, "x")
    )
    report.goals.append(Goal("disk follows data: longest hold of db.lock", m["max_hold_ms"], 50, "ms"))


# -- (d) Bounded memory ------------------------------------------------------------------------------------


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
    dcache.create_batch_job(make_job("big", count))
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
    path = tmp / "rss.db"
    out = subprocess.run(
        [sys.executable, __file__, "--rss-child", str(path), str(sizes.rss_targets)],
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
    report.goals.append(
        Goal(
            f"bounded memory: peak RSS growth, put of {sizes.rss_targets} targets from a generator",
            grew_mb,
            100,
            "MB",
        )
    )


# -- The pytest plugin's fixture ----------------------------------------------------------------------------

PLUGIN_CONFTEST = """
import json
import os

pytest_plugins = ["sift.testing"]
durations = []


def pytest_runtest_logreport(report):
    if report.when in ("setup", "teardown"):
        durations.append(report.duration)


def pytest_sessionfinish(session):
    with open(os.environ["SIFT_BENCH_DURATIONS"], "w") as f:
        json.dump(sum(durations), f)
"""


def bench_testing(tmp: Path, sizes: Sizes, report: Report) -> None:
    """What sift_store costs a test: pytest runs of N tests that use it (in memory) against N empty tests,
    in the same project, alternating; the difference per test is its set-up and tear-down."""
    project = tmp / "plugin-project"
    project.mkdir()
    (project / "conftest.py").write_text(PLUGIN_CONFTEST)
    parametrize = f"import pytest\n\n\n@pytest.mark.parametrize('i', range({sizes.plugin_tests}))\n"
    (project / "test_empty.py").write_text(parametrize + "def test_empty(i):\n    pass\n")
    (project / "test_store.py").write_text(parametrize + "def test_store(sift_store, i):\n    pass\n")
    out = tmp / "durations.json"
    env = dict(os.environ, SIFT_BENCH_DURATIONS=str(out))
    wall: dict[str, list[float]] = {"test_empty.py": [], "test_store.py": []}
    hooks: dict[str, list[float]] = {"test_empty.py": [], "test_store.py": []}
    for rnd in range(sizes.plugin_rounds):
        for name in sorted(wall, reverse=rnd % 2 == 1):
            t0 = perf_ns()
            subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name],
                cwd=project,
                env=env,
                check=True,
                capture_output=True,
            )
            wall[name].append((perf_ns() - t0) / 1e3 / sizes.plugin_tests)
            hooks[name].append(json.loads(out.read_text()) * 1e6 / sizes.plugin_tests)
    n = sizes.plugin_tests
    empty = report.case("testing/empty_tests", n, wall["test_empty.py"])
    store = report.case("testing/sift_store_tests", n, wall["test_store.py"])
    paired = [s - e for s, e in zip(wall["test_store.py"], wall["test_empty.py"], strict=True)]
    store.extra = {
        "per_test_us": statistics.median(paired),
        "setup_teardown_us": statistics.median(hooks["test_store.py"]),
        "setup_teardown_empty_us": statistics.median(hooks["test_empty.py"]),
    }
    store.ratio = store.median_us / empty.median_us
    empty.ratio = 1.0
    report.goals.append(
        Goal(
            f"cheap fixture: sift_store set-up+tear-down per test, {n} tests with it - {n} empty tests",
            statistics.median(paired) / 1e3,
            1,
            "ms",
        )
    )


def bench_hooks(tmp: Path, sizes: Sizes, report: Report) -> None:
    """Peewee's documented request hooks (``db.connect()`` before a request, ``db.close()`` after it) around
    a poll request (a read and a touch), from several threads at once, against the same requests
    without them: the time per request of each side, alternating which side goes first."""
    path = tmp / "hooks.db"
    dcache.open_db(path)
    ids = [f"job-{t}" for t in range(sizes.hooks_threads)]
    for job_id in ids:
        dcache.create_batch_job(make_job(job_id, 1))

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
        for request, out in sides if rnd % 2 == 0 else sides[::-1]:
            out.append(batch(request))
    dcache.close_db()
    n = sizes.hooks_threads
    base = report.case("hooks/without_hooks", n, plain)
    hooks = report.case("hooks/peewee_flask_hooks", n, hooked)
    base.ratio, hooks.ratio = 1.0, hooks.median_us / base.median_us
    report.goals.append(
        Goal(
            f"free hooks: time per poll request with Peewee's connect/close hooks / without, {n} threads "
            "(1.11 x = 90% of the throughput)",
            hooks.ratio,
            round(1 / 0.9, 2),
            "x",
        )
    )


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
        for n in stores if rnd % 2 == 0 else stores[::-1]:
            t0 = perf_ns()
            dcache.open_db(paths[n])
            opens[n].append((perf_ns() - t0) / 1000)
            dcache.close_db()
    small = report.case("ops/open_db", sizes.ops_small, opens[sizes.ops_small])
    large = report.case("ops/open_db", sizes.ops_large, opens[sizes.ops_large])
    small.ratio, large.ratio = 1.0, large.median_us / small.median_us
    report.goals.append(
        Goal(f"O(1) open: open_db at N={sizes.ops_large} / N={sizes.ops_small} jobs", large.ratio, 1.3, "x")
    )

    checks: list[float] = []
    passes: list[float] = []
    dcache.open_db(paths[sizes.ops_large])
    plain = raw_connect(paths[sizes.ops_large])
    for rnd in range(sizes.ops_checks):
        sides = ("check", "pass") if rnd % 2 == 0 else ("pass", "check")
        for side in sides:
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
    baseline.ratio, check.ratio = 1.0, check.median_us / baseline.median_us
    report.goals.append(
        Goal(
            f"fast check: check_store / one GROUP BY pass, N={sizes.ops_large} jobs (2 x = 50% of its speed)",
            check.ratio,
            2.0,
            "x",
        )
    )


# -- The tail on SQLite with several processes (issue 10) -------------------------------------------------

#: Rounds of each side and calls per process per round, by run size.
TAIL_RUNS = {FULL: (8, 600), QUICK: (2, 60)}
TAIL_PROCESSES = 4
TAIL_WORKLOADS = ("update_batch_target", "mix")
#: The two ways a writer waits for another process's transaction: SQLite's busy handler alone (before
#: the writers' queue; the store's private switch ``_queue_writers``, for measurement only), and the queue.
TAIL_SIDES = {"busy_handler": False, "queue": True}


def tail_writer(path: str, queued: bool, tag: str, calls: int, workload: str, barrier: Any, out: Any) -> None:
    """One forked process: ``calls`` writes through the package, each timed; puts (start, end, latencies
    in µs, error) on ``out``. ``mix``: 60% target results, 20% creates of 10 targets, 20% idempotent
    submits of 5 (a key in two repeats)."""
    try:
        dcache.db._queue_writers = queued
        dcache.open_db(path)
        rng = random.Random(tag)
        latencies: list[float] = []
        barrier.wait(60)
        start = perf_ns()
        for i in range(calls):
            op = "update" if workload == "update_batch_target" else rng.choice("uuuuuuccss")
            t0 = perf_ns()
            if op == "u":
                dcache.update_batch_target(
                    f"tail-{tag[-1]}", rng.randrange(50), "done", result="x" * 100, now=T0 + i
                )
            elif op == "c":
                dcache.create_batch_job(make_job(f"tail-{tag}-c{i}", 10), make_targets(10))
            else:
                job = make_job(f"tail-{tag}-s{i}", 5)
                job.idem_key = f"{tag}-key{i // 2}"
                dcache.submit_batch_job(job, make_targets(5), 3600, now=T0)
            latencies.append((perf_ns() - t0) / 1000)
        out.put((start, perf_ns(), latencies, None))
    except BaseException as exc:  # reported by the parent, which must not wait forever
        out.put((0, 0, [], f"{type(exc).__name__}: {exc}"))
    finally:
        dcache.close_db()


def tail_round(path: Path, queued: bool, tag: str, calls: int, workload: str) -> tuple[list[float], float]:
    """TAIL_PROCESSES forked writers released at once: every call's latency (µs), and calls per second."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(TAIL_PROCESSES), ctx.Queue()
    procs = [
        ctx.Process(target=tail_writer, args=(str(path), queued, f"{tag}-{p}", calls, workload, barrier, out))
        for p in range(TAIL_PROCESSES)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(60)
    errors = [r[3] for r in results if r[3] is not None]
    if errors:
        raise RuntimeError(f"tail: a writer failed: {errors[0]}")
    latencies = [x for r in results for x in r[2]]
    elapsed_s = (max(r[1] for r in results) - min(r[0] for r in results)) / 1e9
    return latencies, len(latencies) / elapsed_s


def bench_tail(tmp: Path, sizes: Sizes, report: Report) -> None:
    """4 processes writing one file, waiting on SQLite's busy handler alone (today's way before the queue)
    and queued on the writers' OS lock, in alternating rounds of one run: p50/p99/max of every call, and
    calls per second. Goals for the queue: p99 <= 10 ms, worst call <= 50 ms, throughput no lower."""
    rounds, calls = TAIL_RUNS[sizes]
    path = tmp / "tail.db"
    dcache.open_db(path)
    for p in range(TAIL_PROCESSES):
        job = make_job(f"tail-{p}", 50)
        job.status = "running"
        dcache.create_batch_job(job, make_targets(50))
    dcache.close_db()  # no store open in the parent when it forks
    for workload in TAIL_WORKLOADS:
        latencies: dict[str, list[float]] = {side: [] for side in TAIL_SIDES}
        rates: dict[str, list[float]] = {side: [] for side in TAIL_SIDES}
        for rnd in range(rounds):
            sides = list(TAIL_SIDES) if rnd % 2 == 0 else list(TAIL_SIDES)[::-1]
            for side in sides:
                tag = f"{workload[0]}{rnd}{side[0]}"
                got, rate = tail_round(path, TAIL_SIDES[side], tag, calls, workload)
                latencies[side].extend(got)
                rates[side].append(rate)
        cases = {}
        for side in TAIL_SIDES:
            ordered = sorted(latencies[side])
            cases[side] = report.case(
                f"tail/{workload}/{side}",
                TAIL_PROCESSES,
                ordered,
                p50_ms=ordered[len(ordered) // 2] / 1000,
                p99_ms=ordered[int(len(ordered) * 0.99)] / 1000,
                max_ms=ordered[-1] / 1000,
                calls_per_s=statistics.median(rates[side]),
                calls=len(ordered),
            )
            cases[side].samples_us = []  # thousands of calls: the extras summarize them
        busy, queue = cases["busy_handler"], cases["queue"]
        # Per round pair, busy-handler calls/s over queue calls/s; <= 1: the queue is no slower.
        ratio = statistics.median(b / q for b, q in zip(rates["busy_handler"], rates["queue"], strict=True))
        busy.ratio, queue.ratio = 1.0, ratio
        label = f"tail, {TAIL_PROCESSES} processes, {workload}"
        report.goals.append(Goal(f"{label}: queue p99 per call", queue.extra["p99_ms"], 10, "ms"))
        report.goals.append(Goal(f"{label}: queue worst call", queue.extra["max_ms"], 50, "ms"))
        report.goals.append(
            Goal(
                f"{label}: throughput, busy handler calls/s / queue calls/s (busy handler: p99 "
                f"{busy.extra['p99_ms']:.1f} ms, worst {busy.extra['max_ms']:.0f} ms)",
                ratio,
                1.0,
                "x",
            )
        )


# -- Output ------------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import peewee

    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "peewee": getattr(peewee, "__version__", "unknown"),
        "platform": platform.platform(),
    }


def print_report(report: Report, info: dict[str, Any]) -> None:
    print(
        f"machine: {info['nproc']} CPUs, {info['cpu']}; Python {info['python']}, "
        f"SQLite {info['sqlite']}, peewee {info['peewee']}"
    )
    print()
    print(f"{'case':<34} {'N':>9} {'median µs/op':>13} {'ratio':>7}")
    print("-" * 66)
    for c in report.cases:
        ratio = "" if c.ratio is None else f"{c.ratio:.2f}"
        print(f"{c.name:<34} {c.n:>9} {c.median_us:>13.1f} {ratio:>7}")
    print()
    for c in report.cases:
        if c.extra:
            figures = ", ".join(f"{k}={v:.3g}" for k, v in c.extra.items())
            print(f"{c.name}: {figures}")
    print()
    for g in report.goals:
        limit = "" if g.limit is None else f" (goal <= {g.limit:g} {g.unit})"
        print(f"{g.verdict}  {g.name}: {g.value:.2f} {g.unit}{limit}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (CI smoke run)")
    parser.add_argument("--json", metavar="FILE", type=Path, help="also write the figures to FILE")
    parser.add_argument("--check", action="store_true", help="exit 1 if a goal fails")
    parser.add_argument(
        "--only",
        choices=("flat", "raw", "locks", "memory", "disk", "testing", "hooks", "ops", "tail"),
        action="append",
        help="run only these groups (repeatable)",
    )
    parser.add_argument("--rss-child", nargs=2, metavar=("PATH", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child[0], int(args.rss_child[1]))
        return 0

    sizes = QUICK if args.quick else FULL
    groups = args.only or ["flat", "raw", "locks", "memory", "disk", "testing", "hooks", "ops", "tail"]
    report = Report()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sift-bench-") as tmp_name:
        tmp = Path(tmp_name)
        for group, run in (
            ("flat", bench_flat),
            ("raw", bench_raw),
            ("locks", bench_locks),
            ("memory", bench_memory),
            ("testing", bench_testing),
            ("hooks", bench_hooks),
            ("ops", bench_ops),
            ("disk", bench_disk),
            ("tail", bench_tail),
        ):
            if group in groups:
                t0 = time.perf_counter()
                run(tmp, sizes, report)
                log(f"{group}: {time.perf_counter() - t0:.1f} s")
                for suffix in ("", "-wal", "-shm"):  # free the disk between groups
                    for p in tmp.glob(f"*.db{suffix}"):
                        p.unlink()
    elapsed = time.perf_counter() - started
    info = machine()
    print_report(report, info)
    command = "python scripts/bench.py" + (" --quick" if args.quick else "")
    print(f"\n{command}: {elapsed:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "command": command,
                    "quick": args.quick,
                    "elapsed_s": elapsed,
                    "machine": info,
                    "sizes": asdict(sizes),
                    "cases": [asdict(c) for c in report.cases],
                    "goals": [dict(asdict(g), verdict=g.verdict) for g in report.goals],
                },
                indent=2,
            )
            + "\n"
        )
    failed = [g for g in report.goals if g.verdict == "FAIL"]
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
