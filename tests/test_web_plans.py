"""The dashboard's paged reads on PostgreSQL over 100,000 jobs: one range of a primary key, in its order,
stopped by the LIMIT; never a scan of batch_job or batch_target, never a sort. SQLite's are pinned in
test_web.py."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import open_empty_postgres

from sift.dcache import db
from sift.web import queries

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture(scope="module")
def history(postgres_schema: str) -> None:
    """100,000 finished jobs of 100 callers, the first 1,000 with 10 targets each, one of them with 200,000,
    analyzed."""
    open_empty_postgres(postgres_schema)
    with db.atomic():
        db.execute_sql(
            "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, error, targets_total, "
            "targets_done, created_at, lease, nbytes) SELECT 'old-' || lpad(g::text, 6, '0'), "
            "'caller-' || mod(g, 100), 'fleet', 'key-' || g, (ARRAY['done', 'failed'])[1 + mod(g, 2)], "
            "'', 10, 10, 1000 + g, 1000 + g, 0 FROM generate_series(0, 99999) g"
        )
        db.execute_sql(
            "INSERT INTO batch_target (job_id, idx, url, options, status) "
            "SELECT 'old-' || lpad(g::text, 6, '0'), i, 'u', '{}', 'done' FROM generate_series(0, 999) g, "
            "generate_series(0, 9) i"
        )
        db.execute_sql(  # one big job: a page of its targets must not read the rest of them
            "INSERT INTO batch_target (job_id, idx, url, options, status) "
            "SELECT 'old-000001', i, 'u', '{}', 'done' FROM generate_series(10, 199999) i"
        )
    db.execute_sql("ANALYZE batch_job")
    db.execute_sql("ANALYZE batch_target")


PAGES: dict[str, Any] = {
    "first page": lambda: queries.jobs_query(status="", caller="", search="", after="", limit=51),
    "a later page": lambda: queries.jobs_query(status="", caller="", search="", after="old-050000", limit=51),
    "by status": lambda: queries.jobs_query(
        status="failed", caller="", search="", after="old-000100", limit=51
    ),
    "targets": lambda: queries.targets_query("old-000001", after=3, limit=51),
    "later targets": lambda: queries.targets_query("old-000001", after=150_000, limit=51),
}


@pytest.mark.parametrize("name", list(PAGES))
def test_a_page_reads_one_range_of_a_primary_key(history: None, name: str) -> None:
    sql, params = PAGES[name]().sql()
    plan = "\n".join(row[0] for row in db.execute_sql(f"EXPLAIN {sql}", params).fetchall())
    assert plan.startswith("Limit"), plan
    assert "batch_job_pkey" in plan or "batch_target_pkey" in plan, plan
    assert "Seq Scan" not in plan and "Sort" not in plan, plan
