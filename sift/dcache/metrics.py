"""Prometheus metrics of the store, for ``pip install 'sift[metrics]'`` (the official ``prometheus_client``).

Import this module to use it: ``import sift.dcache`` alone never imports ``prometheus_client``.

    from prometheus_client import make_wsgi_app
    from sift.dcache.metrics import register

    register()              # adds the store's collector to prometheus_client's default registry
    metrics = make_wsgi_app()  # mount it at /metrics

Each scrape reads:

- the ``stats()`` counters, as counters (``sift_jobs_created_total``, ...). They count this process's
  calls since its last ``open_db``, which starts them again at 0: Prometheus takes that as a counter reset.
  Under a server with several worker processes, each worker's scrape shows its own.
- ``batch_nbytes()`` and ``live_batch_jobs_total()`` as gauges, and the file's size and reclaimable
  bytes: the kept byte total, a count over the partial index of live jobs, and SQLite's page counts. None
  of them scans the jobs or targets. With no store open they are left out and the scrape still succeeds.
  On PostgreSQL the two file gauges are replaced by ``sift_store_table_bytes``, the size of the store's
  tables with their indexes (``relation_space()``: the catalog's figures, no scan); the server's own
  exporters report the rest (dead rows, vacuums).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from .counters import stats
from .errors import StoreNotOpen
from .manager import batch_nbytes, live_batch_jobs_total
from .space import file_backed, relation_space, store_space

__all__ = ["COUNTER_HELP", "StoreCollector", "register"]

#: What each ``stats()`` counter counts: the help text of its metric.
COUNTER_HELP = {
    "batch_job_hit": "batch_job() calls that found the job",
    "batch_job_miss": "batch_job() calls for an unknown job",
    "batch_targets_hit": "batch_targets() calls that found the job",
    "batch_targets_miss": "batch_targets() calls for an unknown job",
    "batch_idem_hit": "batch_job_by_idem() calls that found a job",
    "batch_idem_miss": "batch_job_by_idem() calls that found none",
    "batch_write_miss": "writes that named an unknown job or target",
    "invalid_input": "calls refused for invalid input",
    "jobs_created": "jobs created",
    "targets_put": "targets stored",
    "target_writes": "target results and statuses written",
    "jobs_swept": "jobs deleted by sweep_batch()",
    "jobs_evicted": "jobs deleted by evict_batch_oldest()",
    "bytes_evicted": "result bytes deleted by evict_batch_oldest()",
    "jobs_marked_failed": "jobs failed by mark_in_flight_failed()",
    "claims": "claim_batch_targets() calls that claimed at least one target",
    "targets_claimed": "targets moved to running by claim_batch_targets()",
    "jobs_rescued": "jobs failed by rescue_stale_jobs()",
    "claims_renewed": "claims renewed by renew_claims()",
    "claims_released": "claims given back by release_claims()",
    "targets_requeued": "stale claims' targets put back to pending by requeue_stale_claims()",
    "targets_failed_stale": "stale claims' targets failed at their last attempt by requeue_stale_claims()",
    "late_writes_refused": "update_batch_target() calls refused because the runner's claim was requeued",
}


class StoreCollector(Collector):
    """The open store's counters and gauges, read on every scrape."""

    def __init__(self, prefix: str = "sift") -> None:
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        p = self.prefix
        for name, value in stats().items():
            what = COUNTER_HELP.get(name, name.replace("_", " "))
            yield CounterMetricFamily(f"{p}_{name}", f"{what}, since this process opened the store", value)
        try:
            nbytes = batch_nbytes()
            live = live_batch_jobs_total()
            on_file = file_backed()
            space = store_space() if on_file else None
            tables = None if on_file else relation_space()
        except StoreNotOpen:
            return
        yield GaugeMetricFamily(f"{p}_batch_nbytes", "result bytes of all jobs (batch_nbytes())", nbytes)
        yield GaugeMetricFamily(f"{p}_live_batch_jobs", "jobs queued or running, all callers", live)
        if tables is not None:
            yield GaugeMetricFamily(
                f"{p}_store_table_bytes", "size of the store's tables with their indexes", tables.total_bytes
            )
        if space is None:
            return
        yield GaugeMetricFamily(
            f"{p}_store_file_bytes", "size of the store file's pages", space.page_count * space.page_size
        )
        yield GaugeMetricFamily(
            f"{p}_store_reclaimable_bytes", "bytes of free pages in the store file", space.reclaimable_bytes
        )


def register(registry: CollectorRegistry = REGISTRY, *, prefix: str = "sift") -> StoreCollector:
    """Add a :class:`StoreCollector` to ``registry`` (prometheus_client's default one unless given)."""
    collector = StoreCollector(prefix)
    registry.register(collector)
    return collector
