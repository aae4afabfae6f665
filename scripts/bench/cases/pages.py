"""A page of results (``batch_targets(job_id, after=, limit=)``) from a job of ``page_large`` targets and
from one of ``page_small``, in one store, in alternating rounds: one range read of the primary key, so the
large job's page costs what the small one's does."""

from __future__ import annotations

from pathlib import Path

from sift import dcache

from ..fixtures import Builder, PgBuilder
from ..harness import Op, Report, interleave, time_batch
from ..sizes import T0, Sizes
from ..stores import POSTGRES, SQLITE, PgServer, StoreUnderTest

#: Targets a page holds, and how many pages a timed batch reads.
PAGE_LIMIT = 100
PAGE_BATCH = 200
PAGE_ROUNDS = 10
#: Each result's bytes: a small page of results, as a client reads them.
PAGE_RESULT = 200


def build_pages(b: Builder | PgBuilder, sizes: Sizes) -> None:
    for job_id, targets in (("small", sizes.page_small), ("large", sizes.page_large)):
        b.one_job(job_id, caller="alice", status="done", targets=targets, result_bytes=PAGE_RESULT, lease=T0)
    b.close()


def run_pages(target: str, sizes: Sizes, report: Report, store: StoreUnderTest) -> None:
    dcache.open_db(target)
    try:
        # The pages read start anywhere in the small job's range, so that both jobs read the same pages.
        span = sizes.page_small - PAGE_LIMIT

        def page_of(job_id: str) -> Op:
            def read(i: int) -> None:
                page = dcache.batch_targets(job_id, after=(i * 37) % span, limit=PAGE_LIMIT)
                assert page is not None and len(page) == PAGE_LIMIT

            return read

        for warm in (page_of("small"), page_of("large")):  # the pages read come into the caches first
            time_batch(warm, 0, PAGE_BATCH)
        small, large = interleave(
            PAGE_ROUNDS, page_of("small"), page_of("large"), lambda r: r * PAGE_BATCH, PAGE_BATCH
        )
    finally:
        dcache.close_db()
    base = report.case(f"{store.prefix}pages/batch_targets", sizes.page_small, small)
    case = report.case(f"{store.prefix}pages/batch_targets", sizes.page_large, large)
    ratio = report.pair(case, base)
    report.goal(
        f"{store.goal_prefix}a page of {PAGE_LIMIT} results: a job of {sizes.page_large:,} targets / one of "
        f"{sizes.page_small:,}",
        ratio,
        1.3,
        "x",
    )


def bench_pages(tmp: Path, sizes: Sizes, report: Report) -> None:
    """Pages of a small and a large job on a SQLite file."""
    path = tmp / "pages.db"
    build_pages(Builder(path), sizes)
    run_pages(str(path), sizes, report, SQLITE)


def pg_pages(server: PgServer, sizes: Sizes, report: Report) -> None:
    """Pages of a small and a large job on a PostgreSQL schema."""
    schema = server.new_schema("pages")
    build_pages(PgBuilder(server, schema), sizes)
    run_pages(server.target(schema), sizes, report, POSTGRES)
    server.drop(schema)
