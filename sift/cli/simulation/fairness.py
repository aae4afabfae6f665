"""Fairness seen from outside: each caller's wait for its first and last result, how many of the flooding
caller's targets were handed out before a caller's first, and each host's peak of targets running at once.

The single-process simulation feeds a :class:`FairnessLog` from its runner threads, which change it under
one lock with the claim or write that changes the store, so its counts are the store's. ``--hosts`` builds
the same figures from the hosts' journals (the waits) and from a sampler that reads the running targets
from the store (the peaks): see :mod:`.coordinator`.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sift.dcache import BatchTarget, TargetStatus, url_host

from ..report import Column, format_count, table
from .workload import FLOOD_CALLER, JobSpec

__all__ = [
    "CallerSeen",
    "FairnessLog",
    "caller_rows",
    "fairness_lines",
    "fairness_report",
    "journal_callers",
    "running_urls",
]

#: How many hosts the human summary lists (the JSON holds every host).
SHOWN_HOSTS = 8


@dataclass
class CallerSeen:
    """One caller: when it first submitted, its first and last stored result, and the flood's targets
    handed out from its first submission to its first claimed target."""

    caller: str
    caller_class: str
    jobs: int = 0
    targets: int = 0
    first_submit: float | None = None
    first_result: float | None = None
    last_result: float | None = None
    flood_at_submit: int | None = None
    flood_before_first: int | None = None

    def row(self) -> dict[str, Any]:
        def wait(t: float | None) -> float | None:
            return None if t is None or self.first_submit is None else round(t - self.first_submit, 4)

        return {
            "caller": self.caller,
            "class": self.caller_class,
            "jobs": self.jobs,
            "targets": self.targets,
            "first_result_s": wait(self.first_result),
            "last_result_s": wait(self.last_result),
            "flood_at_submit": self.flood_at_submit,
            "flood_before_first": self.flood_before_first,
        }


class FairnessLog:
    """The single process's record, changed by the caller and runner threads under the caller's lock."""

    def __init__(self, specs: Iterable[JobSpec]) -> None:
        self.callers: dict[str, CallerSeen] = {}
        for spec in specs:
            seen = self.callers.setdefault(spec.caller, CallerSeen(spec.caller, spec.caller_class))
            seen.jobs += 1
            seen.targets += spec.targets
        self.flood_claimed = 0
        self.running: collections.Counter[str] = collections.Counter()
        self.peaks: dict[str, int] = {}

    def submitted(self, caller: str, t: float) -> None:
        seen = self.callers[caller]
        if seen.first_submit is None:
            seen.first_submit, seen.flood_at_submit = t, self.flood_claimed

    def claimed(self, claimed: Iterable[tuple[str, str]]) -> None:
        """A claim's targets, as (caller, url): the flood's count and each host's running targets grow."""
        flood_before = self.flood_claimed
        for caller, url in claimed:
            seen = self.callers[caller]
            if seen.flood_before_first is None and seen.flood_at_submit is not None:
                seen.flood_before_first = flood_before - seen.flood_at_submit
            self.flood_claimed += caller == FLOOD_CALLER[0]
            host = url_host(url)
            self.running[host] += 1
            self.peaks[host] = max(self.peaks.get(host, 0), self.running[host])

    def finished(self, urls: Iterable[str]) -> None:
        """Targets no longer running (written, or requeued at a restart)."""
        for url in urls:
            self.running[url_host(url)] -= 1

    def results(self, caller: str, t: float) -> None:
        seen = self.callers[caller]
        seen.first_result = t if seen.first_result is None else seen.first_result
        seen.last_result = t


def caller_rows(callers: Iterable[CallerSeen]) -> list[dict[str, Any]]:
    return [seen.row() for seen in sorted(callers, key=lambda seen: seen.caller)]


def running_urls() -> collections.Counter[str]:
    """The store's running targets by host, read in one statement (a consistent snapshot); their number is
    bounded by what the runners hold, and the partial index of running targets finds them."""
    T = BatchTarget
    rows: Any = T.select(T.url).where(T.status == TargetStatus.RUNNING).tuples()
    return collections.Counter(url_host(url) for (url,) in rows)


def journal_callers(
    specs: Iterable[JobSpec], prefix: str, journals: dict[int, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Each caller's row from the hosts' journals, merged by time (one monotonic clock on one machine): its
    first submission, its first and last stored result, and the flood's targets in the claims journaled
    from its first submission to the claim of its first target."""
    spec_of = {f"{prefix}-{spec.number:05d}": spec for spec in specs}
    by_number = {spec.number: spec for spec in spec_of.values()}
    log = FairnessLog(spec_of.values())
    events: list[tuple[float, int, dict[str, Any]]] = []
    for records in journals.values():
        events += [
            (r["t"], order, r) for order, r in enumerate(records) if r["k"] in ("sub", "claim", "done")
        ]
    for t, _, r in sorted(events, key=lambda e: (e[0], e[1])):
        if r["k"] == "sub":
            log.submitted(by_number[r["n"]].caller, t)
        elif r["k"] == "claim":
            log.claimed((spec_of[job].caller, "") for job, _ in r["got"] if job in spec_of)
        elif r["job"] in spec_of:
            log.results(spec_of[r["job"]].caller, t)
    return caller_rows(log.callers.values())


def fairness_report(
    rows: list[dict[str, Any]], peaks: dict[str, int], claim: dict[str, Any], counted: str
) -> dict[str, Any]:
    """The summary's ``fairness`` entry: the claim's options, each caller's row, the small callers' median
    wait for their first result, and every host's peak (busiest first) with how it was counted."""
    small = [r["first_result_s"] for r in rows if r["caller"] != FLOOD_CALLER[0] and r["first_result_s"]]
    return {
        "claim": claim,
        "callers": rows,
        "small_first_result_median_s": round(statistics.median(small), 4) if small else None,
        "host_peaks": dict(sorted(peaks.items(), key=lambda kv: (-kv[1], kv[0]))),
        "host_peaks_counted": counted,
        "busiest_host_peak": max(peaks.values(), default=0),
    }


def fairness_lines(report: dict[str, Any]) -> Iterator[str]:
    """The human summary's part on fairness: the callers' table, then the busiest hosts' peaks."""

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f} s"

    options = ", ".join(f"{k}={v}" for k, v in report["claim"].items()) or "the defaults (fair)"
    yield ""
    yield f"Callers (claim_batch_targets with {options})"
    rows = [
        {
            **row,
            "jobs": format_count(row["jobs"]),
            "targets": format_count(row["targets"]),
            "first": secs(row["first_result_s"]),
            "last": secs(row["last_result_s"]),
            "before": "-" if row["flood_before_first"] is None else format_count(row["flood_before_first"]),
        }
        for row in report["callers"]
    ]
    columns = [
        Column("caller", "caller"),
        Column("class", "class"),
        Column("jobs", "jobs", right=True),
        Column("targets", "targets", right=True),
        Column("first result", "first", right=True),
        Column("last result", "last", right=True),
        Column("flood targets before its first", "before", right=True),
    ]
    yield from table(rows, columns, indent="  ")
    peaks = list(report["host_peaks"].items())
    yield ""
    yield f"Busiest hosts (peak of targets running at once, {report['host_peaks_counted']})"
    host_rows = [{"host": h, "peak": format_count(n)} for h, n in peaks[:SHOWN_HOSTS]]
    if len(peaks) > SHOWN_HOSTS:
        host_rows.append({"host": f"({len(peaks) - SHOWN_HOSTS} more hosts)", "peak": ""})
    yield from table(host_rows, [Column("host", "host"), Column("peak", "peak", right=True)], indent="  ")
