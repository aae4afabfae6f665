"""scripts/pg_footprint.py, the WAL and disk figures of docs/explanation/scaling.md: its WAL is
this run's own (another session writing at the same time does not count), and it leaves no database."""

from __future__ import annotations

import threading

import psycopg
import pytest
from conftest import POSTGRES_URL, SUFFIX, postgres_missing
from helpers import load_script

pytestmark = pytest.mark.postgres


footprint = load_script("pg_footprint")


def databases() -> set[str]:
    with psycopg.connect(POSTGRES_URL) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database").fetchall()}


@pytest.mark.slow
def test_wal_is_counted_for_this_run_alone() -> None:
    missing = postgres_missing()
    if missing:
        pytest.skip(missing)
    noise = f"sift_noise_{SUFFIX}"
    stop = threading.Event()
    written = [0]

    def other_session() -> None:  # another database's writes, about 9 KB of WAL each, meanwhile
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'CREATE TABLE "{noise}" (x text)')
            try:
                while not stop.is_set():
                    conn.execute(
                        f"""INSERT INTO "{noise}" SELECT string_agg(md5(random()::text), '')
                        FROM generate_series(1, 300)"""
                    )
                    written[0] += 1
            finally:
                conn.execute(f'DROP TABLE "{noise}"')

    before = databases()
    writer = threading.Thread(target=other_session)
    writer.start()
    try:
        figures = footprint.measure(POSTGRES_URL, 30, 3, 1_000)
    finally:
        stop.set()
        writer.join()
    assert written[0] > 30  # the other session wrote far more WAL than the run's touches
    # Each result's 1,000 bytes (too short to compress) are in the WAL of its write.
    assert figures["write"]["wal_bytes_without_fpi"] >= 1_000
    # A touch rewrites one job row and its index entries: far below one noise insert (about 9,600 B).
    assert 0 < figures["touch"]["wal_bytes_without_fpi"] < 2_000
    assert figures["sizes"]["batch_target heap"] >= 1_000
    assert figures["database"].startswith("sift_footprint_")
    assert figures["database"] not in databases() | before  # the run's own database is gone


@pytest.mark.parametrize("field", ["jobs", "targets", "result_bytes"])
def test_bad_sizes_are_refused_before_any_database(field: str) -> None:
    sizes = {"jobs": 1, "targets": 1, "result_bytes": 1, field: 0}
    with pytest.raises(ValueError, match=f"^{field}: "):
        footprint.measure("postgresql://nobody@127.0.0.1:1/none", **sizes)
