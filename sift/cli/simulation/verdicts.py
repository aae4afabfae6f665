"""The end of every simulation: the store's invariants, as ``check_store`` finds them, and what the run
must show besides (no job left live, the bytes within the budget); then the footer of a human summary."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import peewee

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, JobStatus

from ..report import Column, format_count, table
from ..rows import counts_by_status

__all__ = ["Check", "jobs_by_status", "store_checks", "summary_footer", "whole_store_check"]


@dataclass(frozen=True)
class Check:
    """One verdict of the summary: what must hold, whether it did, and the facts behind it."""

    name: str
    ok: bool
    detail: str


#: The kinds of ``check_store`` violation the summary names one by one; any other kind (a damaged file, a
#: status outside the enums, ...) fails the check of the whole store.
NAMED_KINDS = frozenset({"targets_done", "nbytes", "total", "orphan_targets"})


def whole_store_check(report: dcache.StoreReport) -> Check:
    """Whether ``check_store`` found nothing at all, with the first thing it found."""
    found = report.violations
    detail = f"{len(found)} violations" + (f", first: {found[0]}" if found else "")
    return Check("check_store() finds no violation", not found, detail)


def store_checks(
    report: dcache.StoreReport, budget: int | None = None, *, whole: bool = False
) -> list[Check]:
    """The store's invariants from ``check_store``'s report, each kind named; no job may be left queued or
    running; with ``budget``, the bytes stored fit in it. Then the check of the whole store: always with
    ``whole``, else only when a violation is of a kind not named here, so that no finding goes unreported."""
    found = collections.Counter(violation.kind for violation in report.violations)
    jobs = report.jobs

    def per_job(kind: str, name: str) -> Check:
        bad = found[kind]
        return Check(name, bad == 0, f"{bad} of {jobs} jobs differ" if bad else f"{jobs} jobs")

    nbytes = dcache.batch_nbytes()
    total: int = BatchJob.select(peewee.fn.COALESCE(peewee.fn.SUM(BatchJob.nbytes), 0)).scalar()
    orphans = _orphan_targets() if found["orphan_targets"] else 0
    live = dcache.live_batch_jobs_total()
    checks = [
        per_job("targets_done", "targets_done equals each job's done and failed target rows"),
        per_job("nbytes", "nbytes equals the UTF-8 bytes of each job's results"),
        Check("batch_nbytes() equals SUM(nbytes)", not found["total"], f"{nbytes:,} and {total:,}"),
        Check("no target row without its job", not found["orphan_targets"], f"{orphans} orphan targets"),
        Check("no job left queued or running", live == 0, f"{live} live jobs"),
    ]
    if budget is not None:
        checks.append(Check("bytes stored within the budget", nbytes <= budget, f"{nbytes:,} of {budget:,}"))
    if whole or set(found) - NAMED_KINDS:
        checks.append(whole_store_check(report))
    return checks


def _orphan_targets() -> int:
    """How many target rows have no job (what ``check_store`` reports per missing job)."""
    return BatchTarget.select().where(BatchTarget.job_id.not_in(BatchJob.select(BatchJob.id))).count()


def jobs_by_status() -> dict[str, int]:
    """The store's jobs by status, every status named."""
    return counts_by_status(BatchJob, tuple(s.value for s in JobStatus))


def summary_footer(summary: dict[str, Any]) -> Iterator[str]:
    """The end of a human summary (single process or hosts): jobs by status, then the invariants' verdicts."""
    yield ""
    yield "Jobs by status"
    rows = [{"status": k, "count": format_count(v)} for k, v in summary["jobs"].items()]
    yield from table(rows, [Column("status", "status"), Column("count", "count", right=True)], indent="  ")
    yield ""
    yield "Invariants"
    for check in summary["invariants"]:
        yield f"  {'ok  ' if check['ok'] else 'FAIL'}  {check['name']} ({check['detail']})"
    yield ""
    yield "All invariants hold." if summary["ok"] else "INVARIANTS FAILED: the store is inconsistent."
