"""What one job costs a PostgreSQL store, in WAL and on disk (docs/explanation/scaling.md).

Runs the store's own functions on a PostgreSQL database of its own (created, then dropped): N jobs of T
pending targets are created, every target gets a result of R bytes (``update_batch_target``), every job
is touched, then every job is evicted (``evict_batch_oldest(0)``). The WAL of each phase is read with
``pg_walinspect`` (PostgreSQL 15 contrib) and counted only for the records of this database's
transactions, so other sessions writing to the same server do not count. Full-page images are counted
apart: how many there are depends on when the last checkpoint ran.

    python scripts/pg_footprint.py                     # $SIFT_TEST_POSTGRES, 2,000 jobs x 10 x 1 KiB
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from sift import dcache

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
#: Jobs per WAL reading: the server recycles WAL segments after a checkpoint, so read them soon.
CHUNK = 50

#: Jobs as (number, id).
Chunk = Sequence[tuple[int, str]]


def with_database(url: str, name: str) -> str:
    """``url`` with its database replaced by ``name`` (and no fragment)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def measure(server: str, jobs: int, targets: int, result_bytes: int) -> dict[str, Any]:
    """The figures of one run, on a new database that is dropped at the end."""
    for name, value in (("jobs", jobs), ("targets", targets), ("result_bytes", result_bytes)):
        if type(value) is not int or value <= 0:
            raise ValueError(f"{name}: must be an int > 0, got {value!r}")
    database = f"sift_footprint_{os.getpid()}_{secrets.token_hex(4)}"  # other machines may share the server
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
        try:
            return {"database": database} | _measure(
                with_database(server, database), jobs, targets, result_bytes
            )
        finally:
            dcache.close_db()
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _measure(url: str, jobs: int, targets: int, result_bytes: int) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_walinspect")
        oid = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
        assert oid is not None
        dcache.open_db(f"{url}?schema=sift", max_connections=2)
        result = "r" * result_bytes
        ids = [(i, f"job-{i:07d}") for i in range(jobs)]

        def create(chunk: Chunk) -> None:
            for i, job_id in chunk:
                job = dcache.BatchJob(
                    id=job_id, caller=f"caller-{i % 16}", caller_class="fleet", idem_key=f"key-{i}",
                    status="running", targets_total=targets, created_at=i, lease=i,
                )  # fmt: skip
                urls = (f"https://example.com/{i}/{k}" for k in range(targets))
                dcache.create_batch_job(
                    job, (dcache.BatchTarget(idx=k, url=u, options="{}") for k, u in enumerate(urls))
                )

        def write(chunk: Chunk) -> None:
            for i, job_id in chunk:
                for k in range(targets):
                    dcache.update_batch_target(job_id, k, "done", result=result, now=jobs + i)
                dcache.set_batch_job_status(job_id, "done", now=jobs + i)

        def touch(chunk: Chunk) -> None:
            for i, job_id in chunk:
                dcache.touch_batch_job(job_id, now=2 * jobs + i)

        def evict(chunk: Chunk) -> None:
            dcache.evict_batch_oldest(dcache.batch_nbytes() - sum(job.nbytes for job in _jobs(chunk)))

        figures: dict[str, Any] = {"jobs": jobs, "targets": targets, "result_bytes": result_bytes}
        figures["create"] = _wal(conn, oid[0], create, ids, 1)
        figures["write"] = _wal(conn, oid[0], write, ids, targets)
        figures["sizes"] = _sizes(conn, jobs, targets)
        figures["touch"] = _wal(conn, oid[0], touch, ids, 1)
        figures["evict"] = _wal(conn, oid[0], evict, ids, 1)
        assert dcache.batch_nbytes() == 0 and dcache.batch_job(ids[-1][1]) is None
        dcache.close_db()
        return figures


def _jobs(chunk: Chunk) -> list[dcache.BatchJob]:
    found = [dcache.batch_job(job_id) for _, job_id in chunk]
    return [job for job in found if job is not None]


def _wal(
    conn: psycopg.Connection[Any], oid: int, phase: Callable[[Chunk], None], ids: Chunk, per_job: int
) -> dict[str, float]:
    """Run ``phase`` over the jobs, a chunk at a time; the WAL bytes (all, and full-page images) of this
    database's records, per job (``per_job`` = 1) or per target (``per_job`` = targets)."""
    total = fpi = records = 0
    for at in range(0, len(ids), CHUNK):
        start = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()
        phase(ids[at : at + CHUNK])
        end = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()
        assert start is not None and end is not None
        # A record is ours when it names a block of this database, or belongs to a transaction that did.
        row = conn.execute(
            """WITH r AS (SELECT * FROM pg_get_wal_records_info(%s, %s)),
            ours AS (SELECT * FROM r WHERE block_ref LIKE %s),
            xids AS (SELECT DISTINCT xid FROM ours WHERE xid <> 0)
            SELECT COALESCE(SUM(record_length), 0), COALESCE(SUM(fpi_length), 0), COUNT(*)
            FROM r WHERE block_ref LIKE %s OR xid IN (SELECT xid FROM xids)""",
            (start[0], end[0], f"%/{oid}/%", f"%/{oid}/%"),
        ).fetchone()
        assert row is not None
        total, fpi, records = total + int(row[0]), fpi + int(row[1]), records + int(row[2])
    per = len(ids) * per_job
    return {
        "wal_bytes": total / per,
        "fpi_bytes": fpi / per,
        "wal_bytes_without_fpi": (total - fpi) / per,
        "records": records / per,
    }


def _sizes(conn: psycopg.Connection[Any], jobs: int, targets: int) -> dict[str, float]:
    """Bytes on disk per job row and per target row (heap with TOAST, and each index), as they are
    after every target was written once: dead row versions included, before any vacuum."""
    sizes: dict[str, float] = {}
    for table, rows in (("batch_job", jobs), ("batch_target", jobs * targets)):
        heap = conn.execute("SELECT pg_table_size(%s)", (f"sift.{table}",)).fetchone()
        assert heap is not None
        sizes[f"{table} heap"] = heap[0] / rows
        for (index,) in conn.execute(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass ORDER BY 1",
            (f"sift.{table}",),
        ).fetchall():
            size = conn.execute("SELECT pg_relation_size(%s)", (index,)).fetchone()
            assert size is not None
            sizes[f"{index} index"] = size[0] / rows
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("server", nargs="?", default=os.environ.get("SIFT_TEST_POSTGRES", DEFAULT_SERVER))
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--result", type=int, default=1_024, help="bytes of each result")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        figures = measure(args.server, args.jobs, args.targets, args.result)
    except ValueError as exc:
        parser.error(str(exc))
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"{args.jobs:,} jobs x {args.targets} targets x {args.result:,} B results, one database of its own")
    print(f"{'phase':<32} {'WAL B':>9} {'of it FPI':>9} {'w/o FPI':>9} {'records':>8}")
    for phase, unit in (("create", "job"), ("write", "target write"), ("touch", "touch"), ("evict", "job")):
        f = figures[phase]
        name = f"{phase} (per {unit})"
        print(
            f"{name:<32} {f['wal_bytes']:>9,.0f} {f['fpi_bytes']:>9,.0f} "
            f"{f['wal_bytes_without_fpi']:>9,.0f} {f['records']:>8.1f}"
        )
    print("\non disk after every target was written once (before any vacuum), bytes per row:")
    for name, size in figures["sizes"].items():
        print(f"  {name:<40} {size:>9,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
