"""The dashboard's pages on a store of ``web_jobs`` finished jobs: the server time of one request (the
Flask app called through its test client, in this process), each page in turn, in rounds."""

from __future__ import annotations

from pathlib import Path

from sift import dcache

from ..fixtures import Builder, PgBuilder
from ..harness import Report, perf_ns
from ..sizes import T0, Sizes
from ..stores import POSTGRES, SQLITE, PgServer, StoreUnderTest

#: The pages timed, by path: the jobs page (its first page and one further on, through its cursor), a
#: job's page, and the overview.
WEB_PAGES = {
    "jobs": "/jobs",
    "jobs_further": "/jobs?after=job-0050000",
    "job": "/jobs/job-0000007",
    "overview": "/",
}
WEB_ROUNDS = 20
#: The goal: the jobs page of a large store in at most this much server time.
WEB_GOAL_MS = 1000.0


def build_web(b: Builder | PgBuilder, sizes: Sizes) -> None:
    b.jobs("job-", sizes.web_jobs, targets=10, result_bytes=100, lease0=T0)
    b.close()


def run_web(target: str, sizes: Sizes, report: Report, store: StoreUnderTest) -> None:
    from sift.web import create_app

    dcache.open_db(target)
    try:
        client = create_app(None, read_only=True).test_client()
        samples: dict[str, list[float]] = {name: [] for name in WEB_PAGES}
        for rnd in range(WEB_ROUNDS + 1):
            for name, path in WEB_PAGES.items():
                t0 = perf_ns()
                answer = client.get(path)
                elapsed = (perf_ns() - t0) / 1000
                if answer.status_code != 200:
                    raise RuntimeError(f"web: {path} answered {answer.status_code}")
                if rnd:  # the first round warms the caches and the templates
                    samples[name].append(elapsed)
    finally:
        dcache.close_db()
    cases = {
        name: report.case(f"{store.prefix}web/{name}", sizes.web_jobs, got) for name, got in samples.items()
    }
    report.goal(
        f"{store.goal_prefix}the dashboard's jobs page on {sizes.web_jobs:,} jobs: server time",
        cases["jobs"].median_us / 1000,
        WEB_GOAL_MS,
        "ms",
    )


def bench_web(tmp: Path, sizes: Sizes, report: Report) -> None:
    """The dashboard on a SQLite file."""
    path = tmp / "web.db"
    build_web(Builder(path), sizes)
    run_web(str(path), sizes, report, SQLITE)


def pg_web(server: PgServer, sizes: Sizes, report: Report) -> None:
    """The dashboard on a PostgreSQL schema."""
    schema = server.new_schema("web")
    build_web(PgBuilder(server, schema), sizes)
    run_web(server.target(schema), sizes, report, POSTGRES)
    server.drop(schema)
