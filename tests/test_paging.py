"""``batch_targets(job_id, after=, limit=)``: a page of a job's targets, idx order, read as one range of the
target's primary key. (Every statement's plan is also pinned in test_query_plans.py and, on a large
PostgreSQL store, test_postgres_plans.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from helpers import make_job, make_targets, rule_statements, snapshot

from sift import dcache


def ten_targets(store: Any) -> None:
    dcache.create_batch_job(make_job("j", targets_total=10), make_targets(10))
    dcache.create_batch_job(make_job("other", targets_total=3), make_targets(3))


@pytest.mark.parametrize(
    ("after", "limit", "expected"),
    [
        (None, 3, [0, 1, 2]),
        (2, 3, [3, 4, 5]),
        (0, 1, [1]),
        (8, 5, [9]),
        (9, 5, []),
        (100, None, []),
        (6, None, [7, 8, 9]),
        (None, 100, list(range(10))),
        (0, None, list(range(1, 10))),
    ],
)
def test_after_and_limit(store: Any, after: int | None, limit: int | None, expected: list[int]) -> None:
    ten_targets(store)
    page = dcache.batch_targets("j", after=after, limit=limit)
    assert page is not None and [t.idx for t in page] == expected
    assert all(t.job_id == "j" for t in page)


@pytest.mark.parametrize("limit", [1, 3, 4, 10])
def test_pages_make_up_the_whole(store: Any, limit: int) -> None:
    ten_targets(store)
    dcache.update_batch_target("j", 4, "done", result="r", now=1_001)
    whole = dcache.batch_targets("j")
    assert whole is not None
    pages, after = [], None
    while page := dcache.batch_targets("j", after=after, limit=limit):
        assert len(page) <= limit
        pages.extend(page)
        after = page[-1].idx
    assert [t.__data__ for t in pages] == [t.__data__ for t in whole]


def test_an_unknown_job_and_a_job_without_targets(store: Any) -> None:
    ten_targets(store)
    dcache.create_batch_job(make_job("empty", targets_total=2))
    assert dcache.batch_targets("nope", after=0) is None
    assert dcache.batch_targets("nope", limit=5) is None
    assert dcache.batch_targets("empty", limit=5) == []
    assert dcache.batch_targets("", limit=5) is None


def test_the_original_call_is_unchanged(store: Any) -> None:
    ten_targets(store)
    whole = dcache.batch_targets("j")
    assert whole is not None and [t.idx for t in whole] == list(range(10))
    assert dcache.batch_targets("nope") is None


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"after": -1}, "after"),
        ({"after": "2"}, "after"),
        ({"after": True}, "after"),
        ({"after": 1.0}, "after"),
        ({"limit": 0}, "limit"),
        ({"limit": -3}, "limit"),
        ({"limit": True}, "limit"),
        ({"limit": "10"}, "limit"),
        ({"after": 1, "limit": 0}, "limit"),
    ],
)
def test_bad_after_or_limit_names_its_field(store: Any, arguments: dict[str, Any], field: str) -> None:
    ten_targets(store)
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as raised:
        dcache.batch_targets("j", **arguments)
    assert raised.value.field == field
    assert snapshot() == before


@pytest.mark.sqlite_only
def test_a_page_is_one_range_of_the_primary_key(file_store: Path) -> None:
    """On 2,000 jobs of 10 targets, the page's plan is a search of the target's primary key on the job and
    an idx range, in its order: no scan, no sort."""
    with dcache.db.atomic():
        for n in range(2_000):
            dcache.create_batch_job(make_job(f"job-{n:04d}", targets_total=10), make_targets(10))
    dcache.db.execute_sql("ANALYZE")
    sql, params = rule_statements()["_PAGE"].bind({"job_id": "job-0007", "after_idx": 3, "limit": 4})
    lines = [row[3] for row in dcache.db.execute_sql("EXPLAIN QUERY PLAN " + sql, params).fetchall()]
    assert lines == ["SEARCH t1 USING INDEX sqlite_autoindex_batch_target_1 (job_id=? AND idx>?)"]
    assert [row[1] for row in dcache.db.execute_sql(sql, params).fetchall()] == [4, 5, 6, 7]


@pytest.mark.postgres
def test_a_page_is_one_range_of_the_primary_key_on_postgres(pg_target: str) -> None:
    dcache.open_db(pg_target)
    with dcache.db.atomic():
        for n in range(500):
            dcache.create_batch_job(make_job(f"job-{n:04d}", targets_total=10), make_targets(10))
    dcache.db.execute_sql("ANALYZE batch_target")
    sql, params = rule_statements()["_PAGE"].bind({"job_id": "job-0007", "after_idx": 3, "limit": 4})
    plan = "\n".join(row[0] for row in dcache.db.execute_sql("EXPLAIN " + sql, params).fetchall())
    assert re.search(r"Index Scan using batch_target_pkey on batch_target", plan), plan
    assert "Seq Scan" not in plan and "Sort" not in plan, plan
