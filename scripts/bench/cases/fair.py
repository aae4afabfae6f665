"""The fair claim's cost as the store grows: a claim of 50 over 1,000 callers with 1M pending targets on
10,000 hosts, against the same claim with 1,000 pending targets; with and without a per-host limit."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sift import dcache
from sift.dcache.backends.sqlite.settings import PRAGMAS

from ..fixtures import wal_frames
from ..harness import Report, alternate, log, perf_ns
from ..sizes import T0, Sizes
from ..stores import POSTGRES, SQLITE, PgServer, StoreUnderTest

#: The callers with pending work, the hosts their targets are spread over, and the claim's size.
FAIR_CALLERS = 1_000
FAIR_HOSTS = 10_000
FAIR_LIMIT = 50
#: The per-host limit of the second pair of cases.
FAIR_PER_HOST = 2
RUNNER = "bench-fair"
#: Claims whose -wal frames are counted on a SQLite file: under SQLite's 1,000-frame checkpoint.
FRAME_CLAIMS = 3

#: A job of each caller per row of ``jobs``: ``{caller}/{n}``, created in order; its targets are spread
#: over the hosts (the host of target j of job k is h{(k * 7919 + j) % FAIR_HOSTS}).
JOBS_SQL = (
    "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, error, targets_total, targets_done, "
    "created_at, lease, nbytes) VALUES ({m}, {m}, 'fleet', '', 'queued', '', {m}, 0, {m}, {m}, 0)"
)
TARGETS_SQL = (
    "INSERT INTO batch_target (job_id, idx, url, options, status, host) "
    "VALUES ({m}, {m}, {m}, '{{}}', 'pending', {m})"
)


def _shape(pending: int) -> tuple[int, int]:
    """Jobs of each caller and targets of each job: one target a caller for 1,000 pending, else two jobs a
    caller."""
    return (1, 1) if pending <= FAIR_CALLERS else (2, max(1, pending // FAIR_CALLERS // 2))


def _rows(pending: int) -> tuple[list[tuple[Any, ...]], Callable[[], Any]]:
    """Every job row, and a generator of every target row (job k, target j)."""
    per_caller, per_job = _shape(pending)
    jobs = []
    for k in range(FAIR_CALLERS * per_caller):
        caller = f"caller-{k % FAIR_CALLERS:04d}"
        jobs.append((f"{caller}/{k // FAIR_CALLERS}", caller, per_job, T0 + k, T0 + 10**6))

    def targets() -> Any:
        for k, job in enumerate(jobs):
            for j in range(per_job):
                host = f"h{(k * 7919 + j) % FAIR_HOSTS}.example"
                yield (job[0], j, f"https://{host}/{k}/{j}", host)

    return jobs, targets


def _fill(execute_many: Callable[[str, Any], Any], mark: str, pending: int) -> None:
    jobs, targets = _rows(pending)
    execute_many(JOBS_SQL.format(m=mark), jobs)
    execute_many(TARGETS_SQL.format(m=mark), targets())


def build_sqlite(path: Path, pending: int) -> None:
    """A store file made by open_db (the current schema), filled with plain SQL."""
    dcache.open_db(path)
    dcache.close_db()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    _fill(conn.executemany, "?", pending)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()


def build_postgres(server: PgServer, schema: str, pending: int) -> None:
    dcache.open_db(server.target(schema))
    dcache.close_db()
    conn = server.connect(schema)
    with conn.cursor() as cursor:
        _fill(cursor.executemany, "%s", pending)
    conn.execute("VACUUM ANALYZE batch_job, batch_target")
    conn.close()


def _claims(target: str, count: int, warmup: int, per_host: int | None) -> tuple[float, dict[str, float]]:
    """µs per claim of FAIR_LIMIT, median of ``count`` claims after ``warmup``; each claim's targets are
    released after it (untimed), so the store keeps its pending targets. On a SQLite file, also the -wal
    frames one claim appends (over FRAME_CLAIMS claims after the timed ones), by table and index."""
    dcache.open_db(target)

    def claim(i: int) -> list[Any]:
        got = dcache.claim_batch_targets(FAIR_LIMIT, per_host=per_host, runner=RUNNER, now=T0 + i)
        if len(got) != FAIR_LIMIT:
            raise AssertionError(f"fair claims: a claim of {FAIR_LIMIT} got {len(got)}")
        return got

    try:
        times = []
        for i in range(warmup + count):
            t0 = perf_ns()
            claim(i)
            elapsed = (perf_ns() - t0) / 1000
            dcache.release_claims(RUNNER)
            if i >= warmup:
                times.append(elapsed)
        frames: dict[str, float] = {}
        if not target.startswith("postgresql"):
            counted = wal_frames(Path(target), claim, warmup + count, FRAME_CLAIMS)
            dcache.release_claims(RUNNER)
            frames = {} if counted is None else {f"wal_frames/{k}": round(v, 1) for k, v in counted.items()}
    finally:
        dcache.close_db()
    times.sort()
    return times[len(times) // 2], frames


# The floor: a fair claim of FAIR_LIMIT as plain sqlite3 writes it at its least on the same file, one
# transaction: per caller in name order, its oldest live job (batch_job_ring), that job's first pending
# target in batch_target_host's order, the target and the job made running. Every caller's oldest job has
# pending targets in these stores (each claim is released), so it searches no further.
FLOOR_JOB_SQL = (
    "SELECT id FROM batch_job WHERE caller = ? AND status IN ('queued', 'running') "
    "ORDER BY created_at LIMIT 1"
)
FLOOR_PICK_SQL = (
    "SELECT rowid FROM batch_target WHERE job_id = ? AND status = 'pending' AND host >= '' "
    "ORDER BY host, idx LIMIT 1"
)
FLOOR_CLAIM_SQL = (
    "UPDATE batch_target SET status = 'running', runner = ?, heartbeat = ?, attempts = attempts + 1 "
    "WHERE rowid = ?"
)
FLOOR_JOB_RUNNING_SQL = "UPDATE batch_job SET status = 'running', lease = ? WHERE id = ?"
FLOOR_RELEASE_SQL = (
    "UPDATE batch_target SET status = 'pending', runner = NULL, heartbeat = NULL, attempts = attempts - 1 "
    "WHERE rowid = ?"
)


def _floor_claims(path: str, count: int, warmup: int) -> float:
    """µs per claim of FAIR_LIMIT written at its least in plain sqlite3 (above), with the store's pragmas,
    median of ``count`` claims after ``warmup``; each released after it (untimed), as :func:`_claims` does.
    What the file's layout alone costs a claim as the store grows."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for name, value in PRAGMAS.items():
            conn.execute(f"PRAGMA {name} = {value}")
        callers = [row[0] for row in conn.execute("SELECT DISTINCT caller FROM batch_job ORDER BY caller")]
        times = []
        for i in range(warmup + count):
            t0 = perf_ns()
            conn.execute("BEGIN IMMEDIATE")
            taken = []
            for k in range(FAIR_LIMIT):
                caller = callers[(i * FAIR_LIMIT + k) % len(callers)]
                ((job,),) = conn.execute(FLOOR_JOB_SQL, (caller,)).fetchall()
                ((rowid,),) = conn.execute(FLOOR_PICK_SQL, (job,)).fetchall()
                conn.execute(FLOOR_CLAIM_SQL, (RUNNER, T0 + i, rowid))
                conn.execute(FLOOR_JOB_RUNNING_SQL, (T0 + i, job))
                taken.append((rowid,))
            conn.execute("COMMIT")
            elapsed = (perf_ns() - t0) / 1000
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(FLOOR_RELEASE_SQL, taken)
            conn.execute("COMMIT")
            if i >= warmup:
                times.append(elapsed)
    finally:
        conn.close()
    times.sort()
    return times[len(times) // 2]


def run_fair(
    small: str, large: str, sizes: Sizes, report: Report, store: StoreUnderTest, floor: bool = False
) -> None:
    """Claims of 50 on the small and the large store, in rounds (the order alternating); a goal per pair:
    the large store's time per claim at most 1.3 x the small one's. With ``floor`` (SQLite files), the
    claim without per_host written at its least in plain sqlite3 (:func:`_floor_claims`) in the same
    rounds, its ratio reported."""
    for per_host in (None, FAIR_PER_HOST):
        label = "" if per_host is None else f", per_host={per_host}"
        samples: dict[str, list[float]] = {small: [], large: []}
        floors: dict[str, list[float]] = {small: [], large: []}
        frames: dict[str, dict[str, float]] = {}
        with_floor = floor and per_host is None
        for rnd in range(sizes.fair_rounds):
            for target in alternate(rnd, (small, large)):
                median, frames[target] = _claims(target, sizes.fair_claims, sizes.warmup // 5, per_host)
                samples[target].append(median)
                if with_floor:
                    floors[target].append(_floor_claims(target, sizes.fair_claims, sizes.warmup // 5))
        name = f"{store.prefix}claims/fair{'' if per_host is None else '_per_host'}"
        few = report.case(name, FAIR_CALLERS, samples[small], **frames[small])
        many = report.case(name, sizes.fair_pending, samples[large], **frames[large])
        ratio = report.pair(many, few)
        report.goal(
            f"{store.goal_prefix}a fair claim of {FAIR_LIMIT}{label} over {FAIR_CALLERS} callers: "
            f"{sizes.fair_pending:,} pending targets on {FAIR_HOSTS:,} hosts / {FAIR_CALLERS:,}",
            ratio,
            1.3,
            "x",
        )
        if with_floor:
            floor_few = report.case(f"{store.prefix}claims/fair_floor", FAIR_CALLERS, floors[small])
            floor_many = report.case(f"{store.prefix}claims/fair_floor", sizes.fair_pending, floors[large])
            floor_ratio = report.pair(floor_many, floor_few)
            report.goal(
                f"{store.goal_prefix}the same claim written at its least in plain sqlite3 on the same files: "
                f"{sizes.fair_pending:,} / {FAIR_CALLERS:,} (report only)",
                floor_ratio,
                None,
                "x",
            )


def bench_fair(tmp: Path, sizes: Sizes, report: Report) -> None:
    """The fair claim on SQLite files."""
    small, large = tmp / "fair-small.db", tmp / "fair-large.db"
    log(f"fair claims: building {sizes.fair_pending:,} pending targets (SQLite)")
    build_sqlite(small, FAIR_CALLERS)
    build_sqlite(large, sizes.fair_pending)
    run_fair(str(small), str(large), sizes, report, SQLITE, floor=True)


def pg_fair(server: PgServer, sizes: Sizes, report: Report) -> None:
    """The fair claim on PostgreSQL schemas."""
    small, large = server.new_schema("fair_small"), server.new_schema("fair_large")
    log(f"fair claims: building {sizes.fair_pending:,} pending targets (PostgreSQL)")
    build_postgres(server, small, FAIR_CALLERS)
    build_postgres(server, large, sizes.fair_pending)
    run_fair(server.target(small), server.target(large), sizes, report, POSTGRES)
    server.drop(small)
    server.drop(large)
