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
from helpers import make_job, make_target, make_targets
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sift import dcache
from sift.dcache.backends.sqlite.schema import TOTAL_NBYTES_SQL
from sift.dcache.counters import Counters
from sift.dcache.metrics import CALLER_LABELS, COUNTER_HELP, HOST_LABELS, StoreCollector, register

GAUGES = (
    "sift_batch_nbytes",
    "sift_live_batch_jobs",
    "sift_paused_batch_jobs",
    "sift_paused_callers",
    "sift_hosts_backed_off",
    "sift_store_file_bytes",
    "sift_store_reclaimable_bytes",
)


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    register(registry)
    yield registry


#: The gauges with a label: the busiest callers and hosts.
LABELED = {
    "sift_caller_pending_targets": "caller",
    "sift_caller_running_targets": "caller",
    "sift_host_running_targets": "host",
}


def scrape(registry: CollectorRegistry) -> dict[str, tuple[str, float]]:
    """Every sample of the exposition text without a label: name -> (its family's type, value)."""
    text = generate_latest(registry).decode()
    return {
        sample.name: (family.type, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name not in LABELED
    }


def scrape_labeled(registry: CollectorRegistry) -> dict[str, dict[str, float]]:
    """The labeled gauges' samples: name -> {label value: value}; each family a gauge, each label once."""
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name in LABELED:
                assert family.type == "gauge" and list(sample.labels) == [LABELED[sample.name]]
                series = found.setdefault(sample.name, {})
                label = sample.labels[LABELED[sample.name]]
                assert label not in series
                series[label] = sample.value
    return found


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
    assert dcache.pause_batch_job("job-2") and dcache.pause_caller("bob")
    dcache.back_off_host("slow.example", dcache.unix_now() + 3_600)


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
    for gauge in ("sift_paused_batch_jobs", "sift_paused_callers", "sift_hosts_backed_off"):
        assert found.pop(gauge) == ("gauge", 1), gauge
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
    for gauge in ("sift_paused_batch_jobs", "sift_paused_callers", "sift_hosts_backed_off"):
        assert found.pop(gauge) == ("gauge", 1), gauge
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


def test_a_scrape_reads_no_pending_target_and_no_history(
    file_store: Path, registry: CollectorRegistry
) -> None:
    """The gauges read the kept total, partial indexes of live jobs (the count, and the callers' outstanding
    targets) and of running targets (the busiest hosts and the callers' running ones), and SQLite's page
    counts: never a pending target, nor a finished job."""
    work()
    dcache.claim_batch_targets(2, runner="r1", now=2_000)
    statements: list[str] = []
    conn: sqlite3.Connection = dcache.db.connection()
    conn.set_trace_callback(statements.append)
    try:
        scrape(registry)
    finally:
        conn.set_trace_callback(None)
    assert TOTAL_NBYTES_SQL in statements
    reads = [sql for sql in statements if not sql.startswith("PRAGMA") and sql != TOTAL_NBYTES_SQL]
    assert len(reads) == 6
    live_count, outstanding, running, *politeness = reads
    for sql in politeness:  # the paused jobs (each job by its key), the paused callers, the backed-off hosts
        plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
        assert "batch_target" not in sql and "SCAN batch_job " not in plan + " ", plan
    for sql in (live_count, outstanding):
        assert "batch_target" not in sql
        plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
        # batch_job_live and batch_job_claim both hold exactly the live jobs
        assert re.search(r"INDEX batch_job_(live|claim)\b", plan) and "SCAN batch_job " not in plan + " "
    plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {running}"))
    assert "INDEX batch_target_running" in plan and "SCAN batch_target " not in plan + " "
    assert "SCAN batch_job " not in plan + " "  # each running target's job by its key


def test_gauges_per_caller_and_host_are_capped(
    store: dcache.StoreDatabase, registry: CollectorRegistry
) -> None:
    """More callers and hosts than the labels allow: the busiest are named, the rest summed in (other), and
    the series of each gauge add up to the store's own counts."""
    callers = CALLER_LABELS + 5
    for n in range(callers):
        targets = [
            make_target(i, url=f"https://Host-{(n + i) % (HOST_LABELS + 4)}.example:8080/{n}/{i}")
            for i in range(n + 1)
        ]
        dcache.create_batch_job(
            make_job(f"job-{n}", caller=f"caller-{n:02d}", targets_total=n + 1, created_at=1_000 + n), targets
        )
    dcache.create_batch_job(make_job("gone", caller="old", status="done", targets_total=3), make_targets(3))
    claimed = dcache.claim_batch_targets(60, per_job=3, runner="r1", now=2_000)
    found = scrape_labeled(registry)
    pending, running = found["sift_caller_pending_targets"], found["sift_caller_running_targets"]
    hosts = found["sift_host_running_targets"]
    assert len(pending) == len(running) == CALLER_LABELS + 1 and set(pending) == set(running)
    load = dcache.store_load(callers=CALLER_LABELS, hosts=HOST_LABELS)
    assert pending == {r.caller: r.pending for r in [*load.callers, load.other_callers]}
    assert running == {r.caller: r.running for r in [*load.callers, load.other_callers]}
    assert load.more_callers == 5 and "old" not in pending  # a finished job's caller waits for nothing
    outstanding = sum(n + 1 for n in range(callers))
    assert sum(pending.values()) + sum(running.values()) == outstanding
    assert sum(running.values()) == len(claimed) == sum(hosts.values())
    assert len(hosts) == HOST_LABELS + 1 and "(other)" in hosts
    assert all(re.fullmatch(r"host-\d+\.example", h) for h in hosts if h != "(other)")  # url_host's host
    named = [v for h, v in hosts.items() if h != "(other)"]
    assert named == sorted(named, reverse=True)
    # The busiest callers: most outstanding first, which here is the latest callers, with the most targets.
    assert list(pending)[:3] == [f"caller-{n:02d}" for n in (callers - 1, callers - 2, callers - 3)]


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


def test_a_claim_reaches_the_listeners_as_its_two_counts() -> None:
    """What feeds the multiprocess files: a claim's two counts, each an addition a listener hears."""
    counts = Counters()
    heard: list[tuple[str, int]] = []
    counts.listen(lambda name, amount: heard.append((name, amount)))
    counts.add_event("claims", "targets_claimed", 7)
    counts.add("target_writes", 7)
    assert heard == [("claims", 1), ("targets_claimed", 7), ("target_writes", 7)]
    assert {name: n for name, n in counts.snapshot().items() if n} == dict(heard)


def test_a_missing_multiprocess_directory_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    with pytest.raises(dcache.InvalidBatchInput) as info:
        register(CollectorRegistry(), prefix="sift_missing_dir")
    assert info.value.field == "PROMETHEUS_MULTIPROC_DIR" and "missing" in info.value.problem
