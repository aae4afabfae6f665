"""Prometheus metrics of the store, for ``pip install 'sift[metrics]'`` (the official ``prometheus_client``).

Import this module to use it: ``import sift.dcache`` alone never imports ``prometheus_client``.

    from prometheus_client import make_wsgi_app
    from sift.dcache.metrics import register

    register()              # adds the store's collector to prometheus_client's default registry
    metrics = make_wsgi_app()  # mount it at /metrics

Each scrape reads:

- the ``stats()`` counters, as counters (``sift_jobs_created_total``, ...). In one process they count its
  calls since its last ``open_db``. With several worker processes (gunicorn, ``uvicorn --workers``), set
  ``PROMETHEUS_MULTIPROC_DIR`` (an empty directory, before the server starts) and scrape a registry with
  prometheus_client's ``MultiProcessCollector``: each process then adds every count to its file there as it
  happens, and a scrape sums the files of every worker, live or recycled, whichever worker answers it.
  These are events of processes: the store cannot hold them (a sweep deletes the jobs it counted).
- ``batch_nbytes()`` and ``live_batch_jobs_total()`` as gauges, and the file's size and reclaimable
  bytes: the kept byte total, a count over the partial index of live jobs, and SQLite's page counts. None
  of them scans the jobs or targets. They come from the store, so every worker reports the same. With no
  store open they are left out and the scrape still succeeds. On PostgreSQL the two file gauges are
  replaced by ``sift_store_table_bytes``, the size of the store's tables with their indexes
  (``relation_space()``: the catalog's figures, no scan); the server's own exporters report the rest.
- who waits and which sites are busy (``store_load()``): ``sift_caller_pending_targets`` and
  ``sift_caller_running_targets`` by ``caller``, for the ``CALLER_LABELS`` callers with the most of both,
  and ``sift_host_running_targets`` by ``host``, for the ``HOST_LABELS`` hosts with the most running
  targets; the rest of each is summed under the label value ``(other)``, so a scrape has at most
  ``CALLER_LABELS + 1`` callers and ``HOST_LABELS + 1`` hosts whatever the store holds. This reads every live
  job's row and every running target (both through partial indexes), never the pending targets.
- politeness: ``sift_paused_batch_jobs`` (live jobs paused), ``sift_paused_callers`` and
  ``sift_hosts_backed_off`` (hosts whose back-off has not ended), read from their own small tables.

``register()`` may be called again (a second app in one process, several apps in one pytest run): on a
registry that has the store's collector already it returns that one, so nothing is counted twice.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator

from prometheus_client import Counter
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from .counters import counters, stats
from .errors import InvalidBatchInput, StoreNotOpen
from .load import store_load
from .manager import batch_nbytes, live_batch_jobs_total
from .politeness import backed_off_hosts, paused_callers, paused_jobs
from .reports import LoadReport
from .space import file_backed, relation_space, store_space

__all__ = ["CALLER_LABELS", "COUNTER_HELP", "HOST_LABELS", "MULTIPROCESS_DIR", "StoreCollector", "register"]

#: The most callers and hosts a scrape names; the rest are summed under ``(other)``.
CALLER_LABELS = 20
HOST_LABELS = 10

#: prometheus_client's setting for several processes: the directory of their counter files.
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"

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
    """The open store's gauges, and this process's counters (unless they are counted in files)."""

    def __init__(self, prefix: str = "sift", *, counters: bool = True) -> None:
        self.prefix = prefix
        #: Whether a scrape reads the counters from this process (False: from the multiprocess files).
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        p = self.prefix
        for name, value in stats().items() if self.counters else ():
            what = COUNTER_HELP.get(name, name.replace("_", " "))
            yield CounterMetricFamily(f"{p}_{name}", f"{what}, since this process opened the store", value)
        try:
            nbytes = batch_nbytes()
            live = live_batch_jobs_total()
            on_file = file_backed()
            space = store_space() if on_file else None
            tables = None if on_file else relation_space()
            load = store_load(callers=CALLER_LABELS, hosts=HOST_LABELS)
            paused, paused_by_caller, held = (
                len(paused_jobs()),
                len(paused_callers()),
                len(backed_off_hosts()),
            )
        except StoreNotOpen:
            return
        yield GaugeMetricFamily(f"{p}_batch_nbytes", "result bytes of all jobs (batch_nbytes())", nbytes)
        yield GaugeMetricFamily(f"{p}_live_batch_jobs", "jobs queued or running, all callers", live)
        yield GaugeMetricFamily(f"{p}_paused_batch_jobs", "live jobs paused (pause_batch_job)", paused)
        yield GaugeMetricFamily(f"{p}_paused_callers", "callers paused (pause_caller)", paused_by_caller)
        yield GaugeMetricFamily(f"{p}_hosts_backed_off", "hosts backed off now (back_off_host)", held)
        yield from _load_gauges(p, load)
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


def _load_gauges(p: str, load: LoadReport) -> Iterator[Metric]:
    """Per caller and per host, capped: the rest summed under ``(other)`` (present, 0 when there is none,
    so a dashboard's sum of the series is the whole)."""
    pending = GaugeMetricFamily(
        f"{p}_caller_pending_targets",
        "pending targets of the caller's queued and running jobs",
        labels=["caller"],
    )
    running = GaugeMetricFamily(
        f"{p}_caller_running_targets",
        "running targets of the caller's queued and running jobs",
        labels=["caller"],
    )
    for row in [*load.callers, load.other_callers]:
        pending.add_metric([row.caller], row.pending)
        running.add_metric([row.caller], row.running)
    hosts = GaugeMetricFamily(
        f"{p}_host_running_targets", "running targets of the host (url_host of their URLs)", labels=["host"]
    )
    for host in [*load.hosts, load.other_hosts]:
        hosts.add_metric([host.host], host.running)
    yield pending
    yield running
    yield hosts


def register(registry: CollectorRegistry = REGISTRY, *, prefix: str = "sift") -> StoreCollector:
    """Add a :class:`StoreCollector` to ``registry`` (prometheus_client's default one unless given), or
    return the one it has for ``prefix``. With ``PROMETHEUS_MULTIPROC_DIR`` set, the counters go to that
    directory's files instead (scrape them with ``MultiProcessCollector``), and the collector gives gauges."""
    with _lock:
        known = _collectors.setdefault(registry, {})
        collector = known.get(prefix)
        if collector is not None:
            with contextlib.suppress(KeyError):  # taken out since (registry.unregister): put back below
                registry.unregister(collector)
        else:
            in_files = bool(os.environ.get(MULTIPROCESS_DIR))
            if in_files and not os.path.isdir(os.environ[MULTIPROCESS_DIR]):
                raise InvalidBatchInput(
                    MULTIPROCESS_DIR,
                    f"names {os.environ[MULTIPROCESS_DIR]!r}, which is not a directory: make it (empty) "
                    "before the server starts, or unset it to count in this process",
                )
            collector = known[prefix] = StoreCollector(prefix, counters=not in_files)
            if in_files and prefix not in _file_counters:
                _file_counters[prefix] = _count_in_files(prefix)
        registry.register(collector)
        return collector


_lock = threading.Lock()
#: The collector each registry has, by prefix.
_collectors: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, StoreCollector]] = (
    weakref.WeakKeyDictionary()
)
#: Multiprocess mode: the prefixes whose counters this process adds to the directory's files.
_file_counters: dict[str, dict[str, Counter]] = {}


def _count_in_files(prefix: str) -> dict[str, Counter]:
    """prometheus_client counters (not in any registry: their values live in the multiprocess files), fed
    by every addition to the ``stats()`` counters from now on."""
    files = {name: Counter(f"{prefix}_{name}", what, registry=None) for name, what in COUNTER_HELP.items()}

    def add(name: str, amount: int) -> None:
        files[name].inc(amount)

    counters.listen(add)
    return files
