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

from ..harness import Report, alternate, checkpoints_settled, log
from ..sizes import BUDGET, OPTIONS, RESULT_1K, T0, Sizes
from ..stores import PgServer

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
        checkpoints_settled()

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
    from .runner import bench_runner_peers  # the runner's batch against huey's: huey is installed here

    bench_runner_peers(tmp, sizes, report)


#: The original schema on PostgreSQL, as the plain psycopg side runs it: its two tables and two indexes.
PG_ORIGINAL_DDL = (
    "CREATE TABLE batch_job (id TEXT PRIMARY KEY, caller TEXT NOT NULL, caller_class TEXT NOT NULL, "
    "idem_key TEXT NOT NULL, status TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', "
    "targets_total BIGINT NOT NULL, "
    "targets_done BIGINT NOT NULL DEFAULT 0, created_at BIGINT NOT NULL, lease BIGINT NOT NULL, "
    "nbytes BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE batch_target (job_id TEXT NOT NULL, idx BIGINT NOT NULL, url TEXT NOT NULL, "
    "options JSON NOT NULL, "
    "status TEXT NOT NULL, result TEXT, error TEXT, hint TEXT, PRIMARY KEY (job_id, idx))",
    "CREATE INDEX batch_job_idem ON batch_job(caller, idem_key)",
    "CREATE INDEX batch_job_lease ON batch_job(lease)",
)


class PsycopgBatch:
    """The same batch as a careful engineer writes it with plain psycopg on the original schema: the job and
    its targets in one transaction; per result one transaction that locks the job's row, reads the target,
    updates it and the job (count, bytes, lease); the byte total kept in the program; one read of all
    results."""

    READ = "SELECT status, octet_length(result) FROM batch_target WHERE job_id = %s AND idx = %s"
    SET_TARGET = "UPDATE batch_target SET status = %s, result = %s WHERE job_id = %s AND idx = %s"
    SET_JOB = (
        "UPDATE batch_job SET targets_done = targets_done + %s, nbytes = nbytes + %s, lease = %s "
        "WHERE id = %s"
    )

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        for statement in PG_ORIGINAL_DDL:
            conn.execute(statement)
        self.total = 0

    def batch(self, job_id: str, targets: int) -> Callable[[], None]:
        rows = [(job_id, i, f"https://example.com/{i}", OPTIONS) for i in range(targets)]
        conn, now = self.conn, T0 + 1

        def run() -> None:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, targets_total, "
                    "created_at, lease) VALUES (%s, 'peers', 'fleet', '', 'queued', %s, %s, %s)",
                    (job_id, targets, T0, T0),
                )
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO batch_target (job_id, idx, url, options, status) "
                        "VALUES (%s, %s, %s, %s, 'pending')",
                        rows,
                    )
            size = len(RESULT_1K.encode())
            for i in range(targets):
                with conn.transaction():
                    conn.execute("SELECT 1 FROM batch_job WHERE id = %s FOR UPDATE", (job_id,))
                    row = conn.execute(self.READ, (job_id, i)).fetchone()
                    counted = 0 if row[0] in ("done", "failed") else 1
                    delta = size - (row[1] or 0)
                    conn.execute(self.SET_TARGET, ("done", RESULT_1K, job_id, i))
                    conn.execute(self.SET_JOB, (counted, delta, now, job_id))
                self.total += delta
                if self.total > BUDGET:
                    raise AssertionError("the baseline does not evict")
            got = conn.execute(
                "SELECT result FROM batch_target WHERE job_id = %s ORDER BY idx", (job_id,)
            ).fetchall()
            if len(got) != targets or got[-1][0] != RESULT_1K:
                raise AssertionError("psycopg: the batch's results are not all there")

        return run


def pg_peers(server: PgServer, sizes: Sizes, report: Report) -> None:
    """A batch on sift's PostgreSQL store (per-target writes, and bulk writes of 10) against plain psycopg
    doing the same batch on the original schema, side by side. procrastinate is not measured here."""
    log("pg peers: procrastinate is not measured (only plain psycopg)")
    targets = sizes.submit_targets
    sift_schema, plain_schema = server.new_schema("peers_sift"), server.new_schema("peers_plain")
    dcache.open_db(server.target(sift_schema))
    conn = server.connect(plain_schema)
    conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{plain_schema}"')
    plain = PsycopgBatch(conn)
    samples: dict[str, list[float]] = {"sift": [], f"sift_bulk{BULK}": [], "psycopg": []}
    for rnd in range(sizes.raw_rounds + 1):  # round 0 warms up, untimed
        sides = {
            "sift": sift_batch(f"pg-{rnd}", targets, None),
            f"sift_bulk{BULK}": sift_batch(f"pg-{rnd}-bulk", targets, BULK),
            "psycopg": plain.batch(f"pg-{rnd}", targets),
        }
        for side in alternate(rnd, tuple(sides)):
            t0 = time.perf_counter()
            sides[side]()
            if rnd:
                samples[side].append((time.perf_counter() - t0) * 1e6 / targets)
    conn.close()
    dcache.close_db()
    server.drop(sift_schema)
    server.drop(plain_schema)
    base = report.case("pg/peers/psycopg", targets, samples["psycopg"])
    for side in ("sift", f"sift_bulk{BULK}"):
        ratio = report.pair(report.case(f"pg/peers/{side}", targets, samples[side]), base)
        report.goal(
            f"PostgreSQL peers: a {targets}-target batch, {side}/psycopg (report only)", ratio, None, "x"
        )
