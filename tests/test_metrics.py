"""The Prometheus collector (``sift[metrics]``), scraped with prometheus_client's own parser after real
store calls."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docs_pages import block, block_path
from helpers import make_job, make_targets
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sift import dcache
from sift.dcache.backends.sqlite.schema import TOTAL_NBYTES_SQL
from sift.dcache.metrics import COUNTER_HELP, StoreCollector, register

GAUGES = (
    "sift_batch_nbytes",
    "sift_live_batch_jobs",
    "sift_store_file_bytes",
    "sift_store_reclaimable_bytes",
)


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    register(registry)
    yield registry


def scrape(registry: CollectorRegistry) -> dict[str, tuple[str, float]]:
    """Every sample of the exposition text: name -> (its family's type, value)."""
    text = generate_latest(registry).decode()
    return {
        sample.name: (family.type, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def work() -> None:
    """Real calls that move the counters and the gauges."""
    for n in range(4):
        dcache.create_batch_job(make_job(f"job-{n}", lease=1_000 + n), make_targets(3))
    for idx in range(3):
        dcache.update_batch_target("job-0", idx, "done", result="é" * 100, now=2_000)  # 200 bytes each
    dcache.update_batch_target("job-1", 0, "done", result="x" * 50, now=2_000)
    dcache.set_batch_job_status("job-0", "done", now=2_000)
    dcache.set_batch_job_status("job-1", "running", now=2_000)
    dcache.batch_job("job-1")
    dcache.batch_job("nope")
    with pytest.raises(dcache.JobNotFound):
        dcache.touch_batch_job("nope", now=2_000)
    assert dcache.evict_batch_oldest(100) == 1  # job-0 and its 600 bytes


def test_counters_and_gauges_after_real_calls(file_store: Path, registry: CollectorRegistry) -> None:
    work()
    found = scrape(registry)
    stats = dcache.stats()
    for name, value in stats.items():
        assert found.pop(f"sift_{name}_total") == ("counter", value)
        found.pop(f"sift_{name}_created", None)  # the parser's timestamp sample, if the format has one
    assert stats["jobs_created"] == 4 and stats["targets_put"] == 12
    assert (stats["batch_job_hit"], stats["batch_job_miss"], stats["batch_write_miss"]) == (1, 1, 1)
    assert (stats["jobs_evicted"], stats["bytes_evicted"]) == (1, 600)
    assert found.pop("sift_batch_nbytes") == ("gauge", 50) == ("gauge", dcache.batch_nbytes())
    assert found.pop("sift_live_batch_jobs") == ("gauge", 3) == ("gauge", dcache.live_batch_jobs_total())
    space = dcache.store_space()
    assert found.pop("sift_store_file_bytes") == ("gauge", space.page_count * space.page_size)
    assert found.pop("sift_store_reclaimable_bytes") == ("gauge", space.reclaimable_bytes)
    assert found == {}


@pytest.mark.postgres
def test_counters_and_gauges_on_postgresql(pg_target: str, registry: CollectorRegistry) -> None:
    """The same scrape on PostgreSQL: the file gauges give way to the tables' size (relation_space())."""
    dcache.open_db(pg_target)
    work()
    found = scrape(registry)
    stats = dcache.stats()
    for name, value in stats.items():
        assert found.pop(f"sift_{name}_total") == ("counter", value)
        found.pop(f"sift_{name}_created", None)
    assert (stats["jobs_evicted"], stats["bytes_evicted"], stats["jobs_created"]) == (1, 600, 4)
    assert found.pop("sift_batch_nbytes") == ("gauge", 50) == ("gauge", dcache.batch_nbytes())
    assert found.pop("sift_live_batch_jobs") == ("gauge", 3) == ("gauge", dcache.live_batch_jobs_total())
    table_bytes = found.pop("sift_store_table_bytes")
    assert table_bytes == ("gauge", dcache.relation_space().total_bytes) and table_bytes[1] > 0
    assert found == {}


def test_every_counter_has_its_help(registry: CollectorRegistry) -> None:
    assert set(COUNTER_HELP) == set(dcache.stats())


def test_a_scrape_follows_the_store(tmp_path: Path, registry: CollectorRegistry) -> None:
    dcache.open_db(tmp_path / "a.db")
    try:
        dcache.create_batch_job(make_job("job-1", status="running"), make_targets(3))
        assert scrape(registry)["sift_live_batch_jobs"] == ("gauge", 1)
        assert scrape(registry)["sift_jobs_created_total"] == ("counter", 1)
        dcache.open_db(tmp_path / "b.db")  # a new store: counters start again, gauges read the new file
        found = scrape(registry)
        assert found["sift_live_batch_jobs"] == ("gauge", 0)
        assert found["sift_jobs_created_total"] == ("counter", 0)
    finally:
        dcache.close_db()


def test_with_no_store_open_the_scrape_has_only_the_counters(registry: CollectorRegistry) -> None:
    dcache.db.init(None)  # no store at all, as before the first open_db
    with pytest.raises(dcache.StoreNotOpen):
        dcache.batch_nbytes()
    found = scrape(registry)
    assert not set(GAUGES) & set(found)
    assert found["sift_jobs_created_total"] == ("counter", dcache.stats()["jobs_created"])


def test_a_scrape_reads_no_job_or_target_rows(file_store: Path, registry: CollectorRegistry) -> None:
    """The gauges read the kept total, a partial index of live jobs and SQLite's page counts."""
    work()
    statements: list[str] = []
    conn: sqlite3.Connection = dcache.db.connection()
    conn.set_trace_callback(statements.append)
    try:
        scrape(registry)
    finally:
        conn.set_trace_callback(None)
    assert TOTAL_NBYTES_SQL in statements
    reads = [sql for sql in statements if not sql.startswith("PRAGMA") and sql != TOTAL_NBYTES_SQL]
    assert len(reads) == 1 and "batch_target" not in reads[0]
    plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {reads[0]}"))
    # batch_job_live and batch_job_claim both hold exactly the live jobs
    assert re.search(r"INDEX batch_job_(live|claim)\b", plan) and "SCAN batch_job " not in plan + " "


# -- The docs' examples ----------------------------------------------------------------------------------


@pytest.fixture
def default_registry() -> Iterator[None]:
    """The examples register with prometheus_client's default registry: take the collector out after."""
    yield
    for collector in list(REGISTRY._collector_to_names):
        if isinstance(collector, StoreCollector):
            REGISTRY.unregister(collector)


def check_scrape(text: str) -> None:
    found = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    assert found["sift_jobs_created_total"] == dcache.stats()["jobs_created"] == 4
    assert found["sift_batch_nbytes"] == dcache.batch_nbytes() == 50


@pytest.mark.usefixtures("default_registry")
def test_docs_flask_example(file_store: Path) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}  # as in an app's own module
    exec(compile(block("metrics-flask"), block_path("metrics-flask"), "exec"), namespace)
    work()
    response = namespace["app"].test_client().get("/metrics")
    assert response.status_code == 200
    check_scrape(response.get_data(as_text=True))


@pytest.mark.usefixtures("default_registry")
@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_docs_fastapi_example(file_store: Path) -> None:
    from fastapi import testclient  # in the test extra, as Flask and httpx are: CI runs both examples

    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(block("metrics-fastapi"), block_path("metrics-fastapi"), "exec"), namespace)
    work()
    response = testclient.TestClient(namespace["app"]).get("/metrics/")
    assert response.status_code == 200
    check_scrape(response.text)


@pytest.mark.usefixtures("default_registry")
def test_register_again_returns_the_collector_it_has(file_store: Path) -> None:
    """A second app in one process (or one pytest run) registers again: no error, nothing counted twice."""
    registry = CollectorRegistry()
    first = register(registry)
    assert register(registry) is first
    assert register(REGISTRY) is register(REGISTRY)  # the default registry, as the docs' apps use it
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    assert scrape(registry)["sift_jobs_created_total"] == ("counter", 1)
    other = register(registry, prefix="other")  # another prefix is another collector
    assert other is not first and scrape(registry)["other_jobs_created_total"] == ("counter", 1)
