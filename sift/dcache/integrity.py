"""The store's invariant check (``sift check``, and ``check_store_invariants`` in tests): one implementation.

It reads the jobs in chunks of consecutive ids, each chunk with its targets in one read transaction, so
another thread waits at most one chunk for the shared connection and another process is never blocked.
The integrity check and the byte total, which read the whole file in one statement, run on a private
connection for a file store, so they hold no lock at all; without repair, the integrity check runs in a
thread of its own beside the chunks (its findings, if any, replace theirs). ``repair=True`` rewrites only
derived data (``targets_done``, ``nbytes``, the byte total, a missing index or trigger) and deletes orphan
targets, each chunk in one short write transaction; a bad status, an idx out of range, options that are not
JSON or a job missing targets past its grace period is data a person must decide about, so it is reported
and left as it is.

Written once for every backend: what differs (the page check, snapshots, the schema check, the byte
total's keeping and repair, SQL spellings) is asked of the open backend (see its ``maintenance`` module).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .clock import unix_now
from .database import db
from .errors import StoreConflict, StoreCorrupt
from .hosts import url_host
from .models import FINAL_TARGET_STATUSES, JobStatus, TargetStatus
from .reports import Repair, StoreReport, Violation
from .sqlfiles import load_sql

__all__ = ["REPAIRABLE", "check_store", "data_violations"]

#: Jobs read (and, with repair, fixed) per transaction.
JOBS_PER_CHUNK = 500
#: About how many targets one chunk reads, so a chunk of big jobs holds the lock no longer.
TARGETS_PER_CHUNK = 5_000

#: The kinds of violation ``repair=True`` fixes; the others (quick_check, job_status, targets_total,
#: target_status, target_idx, target_options, target_result, target_host, missing_targets) are left for a
#: person.
REPAIRABLE = frozenset({"schema", "total", "targets_done", "nbytes", "orphan_targets"})

#: Seconds after its ``created_at`` (by the store clock) a job may still lack target rows: the time
#: between ``create_batch_job`` and the ``put_batch_targets`` calls that complete it. Past it, a job with
#: fewer target rows than ``targets_total`` can never finish, and the check reports it.
MISSING_TARGETS_GRACE = 3600

_JOB_STATUSES = frozenset(s.value for s in JobStatus)


def _sql_list(values: Any) -> str:
    return ", ".join(f"'{v.value}'" for v in values)


_FINAL = _sql_list(FINAL_TARGET_STATUSES)
_VALID_TARGET = _sql_list(TargetStatus)


def check_store(*, repair: bool = False, progress: Callable[[int], None] | None = None) -> StoreReport:
    """Check every invariant of the open store and name each violation with the job it affects;
    with ``repair``, recompute the derived fields and delete orphan targets, reporting each change.
    ``progress`` is called after each chunk with the number of jobs it read."""
    report = StoreReport()
    if not db.backend.has_pages:  # PostgreSQL keeps its files whole: there is no page check to run
        _check_data(report, repair, progress)
        return report
    if repair or not db.backend.reads_beside:
        # Nothing else can be trusted on a damaged file, and repair must not write into it.
        report.violations += _page_check()
        if not report.violations:
            _check_data(report, repair, progress)
        return report
    # Reading only, on a file: the integrity check reads the whole file on a connection of its own, in a
    # thread of its own, while the chunks go by on the shared one (SQLite runs without the GIL).
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sift-check") as pool:
        integrity = pool.submit(_page_check)
        try:
            _check_data(report, repair, progress)
            failure: StoreCorrupt | None = None
        except StoreCorrupt as exc:
            failure = exc
        damage = integrity.result()
    if damage:  # what the chunks found on a damaged file cannot be trusted
        return StoreReport(violations=damage)
    if failure is not None:
        raise failure
    return report


def _page_check() -> list[Violation]:
    return [Violation("quick_check", None, problem) for problem in db.backend.page_check()]


def _check_data(report: StoreReport, repair: bool, progress: Callable[[int], None] | None) -> None:
    """Everything but the integrity check, into ``report``."""
    missing = _missing_schema(report)
    report.violations += [Violation("schema", None, f"{name} is missing") for name in missing]
    if {"batch_job", "batch_target"} & set(missing) and not repair:
        return
    if missing and repair:
        db.backend.create_missing_schema()
        report.repairs += [Repair("schema", None, f"created {name}") for name in missing]
    if "batch_totals" not in missing:
        report.violations += [Violation("total", None, detail) for detail in db.backend.total_problems()]
        kept, actual = db.backend.read_whole(db.backend.sql_totals)[0]
        if kept != actual:
            shown = "no row" if kept is None else repr(kept)
            report.violations.append(
                Violation("total", None, f"batch_totals holds {shown}, but SUM(nbytes) is {actual}")
            )
    low: Any = None
    while True:
        with db.backend.read_snapshot():
            high = _chunk_end(low)
            chunk = _Chunk(low, high)
        report.jobs += chunk.jobs
        report.targets += chunk.targets
        report.violations += chunk.violations
        if progress is not None:
            progress(chunk.jobs)
        if repair and chunk.fixes:
            report.repairs += _fix_chunk(low, high)
        if high is None:
            break
        low = high
    if repair and report.violations:
        report.repairs += [Repair("total", None, detail) for detail in db.backend.repair_total()]


def data_violations(limit: int) -> list[Violation]:
    """The first ``limit`` violations of the rules on rows (every kind but quick_check, schema and total),
    read inside the caller's transaction, chunk by chunk: how a restore holds its rows to the check."""
    found: list[Violation] = []
    low: Any = None
    while len(found) < limit:
        high = _chunk_end(low)
        found += _Chunk(low, high).violations
        if high is None:
            break
        low = high
    return found[:limit]


def _missing_schema(report: StoreReport) -> list[str]:
    """The parts of the schema the store lacks; also a recorded schema version that is not this sift's
    (into ``report``: a person decides, as for a status)."""
    missing = db.backend.missing_schema()
    if "sift_schema" not in missing and (problem := db.backend.schema_version_problem()) is not None:
        report.violations.append(Violation("schema_version", None, problem))
    return missing


def _fix_chunk(low: Any, high: Any) -> list[Repair]:
    """Repair one chunk in one write transaction, reading it again there: another writer may have changed
    it since the check read it. On PostgreSQL its jobs are locked first (job before target, as every
    writer does) under the removal lock (no sweep or eviction meanwhile), so what it writes is exact."""

    def run() -> list[Repair]:
        with db.backend.removals():
            db.backend.lock_job_range(*_id_range("id", low, high))
            return _Chunk(low, high).fix()

    try:
        return run()
    except StoreConflict as conflict:
        result: list[Repair] = db.backend.retry(conflict, run)
        return result


class _Chunk:
    """The jobs with ``low < id <= high`` (None: no bound) and the targets in that range of job ids:
    what is wrong with them, and the fixes for what repair may fix."""

    def __init__(self, low: Any, high: Any) -> None:
        self.violations: list[Violation] = []
        self.fixes: list[tuple[str, Any, Any, Any]] = []  # (kind, job id, stored value, right value)
        target_range, target_params = _id_range("job_id", low, high)
        job_range, job_params = _id_range("id", low, high)
        sql = _sql()
        groups = db.fetch_all(sql.target_groups.format(where=target_range), target_params)
        jobs = db.fetch_all(sql.jobs.format(where=job_range), job_params)
        by_job = {group[0]: group for group in groups}
        self.jobs, self.targets = len(jobs), sum(group[1] for group in groups)
        self.cutoff = unix_now() - MISSING_TARGETS_GRACE  # a job created at or before it is past its grace
        valid, no_targets = _JOB_STATUSES, (None, 0, 0, 0, 0, None, None, 0, 0, 0)
        for job in jobs:
            job_id, status, total, done, nbytes, _ = job
            group = by_job.pop(job_id, no_targets)
            _, rows, final, size, bad, idx_min, idx_max, bad_options, bad_claims, pending_results = group
            # The usual case, decided here without a call: every check passes.
            if (
                status in valid
                and done == final
                and nbytes == size
                and not bad
                and not bad_options
                and not bad_claims
                and not pending_results
                and rows == total
                and (
                    idx_min is None
                    or (
                        type(idx_min) is int
                        and type(idx_max) is int
                        and type(total) is int
                        and idx_min >= 0
                        and idx_max < total
                    )
                )
            ):
                continue
            self._check_job(job, group)
        if db.backend.hosts_stored:
            self._check_hosts(sql.hosts.format(where=target_range), target_params)
        for job_id, count, *_ in by_job.values():  # targets whose job is not there
            self._add("orphan_targets", _name(job_id), f"{_targets(count)} without their job")
            self.fixes.append(("orphan_targets", job_id, count, 0))

    def _check_job(self, job: tuple[Any, ...], group: tuple[Any, ...]) -> None:
        job_id, status, total, done, nbytes, created_at = job
        _, rows, final, size, bad_statuses, idx_min, idx_max, bad_options, bad_claims, pending_results = group
        name = _name(job_id)
        if status not in _JOB_STATUSES:
            self._add("job_status", name, f"status {status!r} is not one of {', '.join(JobStatus)}")
        if not (type(total) is int and total >= 0 and (type(done) is not int or done <= total)):
            self._add("targets_total", name, f"targets_total is {total!r} (targets_done {done!r})")
        if done != final:
            verb = "is" if final == 1 else "are"
            detail = f"targets_done is {done!r}, but {_targets(final)} {verb} done or failed"
            self._add("targets_done", name, detail)
            self.fixes.append(("targets_done", job_id, done, final))
        if nbytes != size:
            self._add("nbytes", name, f"nbytes is {nbytes!r}, but its results hold {size} bytes (UTF-8)")
            self.fixes.append(("nbytes", job_id, nbytes, size))
        if bad_statuses:
            status_min, status_max = db.fetch_one(_sql().bad_statuses, (job_id,))
            shown = repr(status_min) if status_min == status_max else f"{status_min!r} to {status_max!r}"
            detail = f"{_targets(bad_statuses)} with a status not in {', '.join(TargetStatus)}: {shown}"
            self._add("target_status", name, detail)
        if idx_min is not None and _outside(idx_min, idx_max, total):
            self._add("target_idx", name, _idx_detail(job_id, total))
        if bad_options:
            self._add("target_options", name, f"{_targets(bad_options)} whose options are not valid JSON")
        if bad_claims:
            detail = f"{_targets(bad_claims)} with attempts below 0, or running for a runner with no attempt"
            self._add("target_attempts", name, detail)
        if pending_results:
            self._add("target_result", name, f"{_targets(pending_results)} pending yet holding a result")
        if _missing_targets(rows, total, created_at, self.cutoff):
            detail = (
                f"holds {rows} of its {total} targets more than {MISSING_TARGETS_GRACE} s after it was "
                "created: it can never finish (put_batch_targets the rest, or delete it)"
            )
            self._add("missing_targets", name, detail)

    def _check_hosts(self, query: str, params: tuple[Any, ...]) -> None:
        """A pending or running target's host must be ``url_host(url)``, as every insert writes it
        (``target_host``): claims read it, per-host limits count by it. A finished target's host is read by
        nothing, so it is not parsed (the check stays a pass of SQL over the history)."""
        wrong: dict[Any, list[tuple[Any, Any, str]]] = {}
        for job_id, idx, url, host in db.fetch_all(query, params):
            if type(url) is str and host != (right := url_host(url)):
                wrong.setdefault(job_id, []).append((idx, host, right))
        for job_id, found in wrong.items():
            idx, host, right = min(found)  # the first by idx: the same report on every backend
            shown = f"idx {idx}: {host!r}, not {right!r}"
            detail = f"{_targets(len(found))} whose host is not its URL's ({shown})"
            self._add("target_host", _name(job_id), detail)

    def _add(self, kind: str, job_id: str, detail: str) -> None:
        self.violations.append(Violation(kind, job_id, detail))

    def fix(self) -> list[Repair]:
        """Apply the fixes (inside the caller's write transaction) and describe each change."""
        repairs = []
        sql = _sql()
        for kind, job_id, stored, right in self.fixes:
            if kind == "orphan_targets":
                # Only while the job is still missing: a job created since the read keeps its targets.
                db.run_sql(sql.delete_orphans, (job_id,))
                repairs.append(Repair(kind, _name(job_id), f"deleted {_targets(stored)}"))
            else:
                db.run_sql(sql.fix_job.format(column=kind), (right, job_id))
                repairs.append(Repair(kind, _name(job_id), f"{stored!r} -> {right}"))
        return repairs


@dataclass(frozen=True)
class _Statements:
    """The check's statements in one backend's spelling."""

    target_groups: str
    jobs: str
    bad_statuses: str
    hosts: str
    chunk_end: str
    idx_outside: str
    fix_job: str
    delete_orphans: str
    mark: str  # the parameter placeholder
    true: str  # a condition that always holds


#: The check's statements, each with the slots of one backend's spellings (see the file).
_QUERIES = {name: statements[0] for name, statements in load_sql(__package__, "integrity.sql").items()}


class _Slots(dict[str, str]):
    """Fills a statement's spellings, leaving the slots a run fills ({where}, {column}, ...) as they are."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _statements(backend: Any) -> _Statements:
    """The check's statements in the spelling of ``backend`` (a backend class, or one open)."""
    count_if = backend.sql_count_if
    slots = _Slots(
        mark=backend.param,
        count_final=count_if.format(f"status IN ({_FINAL})"),
        count_invalid=count_if.format(f"status NOT IN ({_VALID_TARGET})"),
        count_invalid_options=count_if.format(backend.sql_invalid_options),
        count_unsound_claims=count_if.format(_UNSOUND_CLAIM) if backend.claims_stored else "0",
        count_pending_results=count_if.format("status = 'pending' AND result IS NOT NULL"),
        result_bytes=backend.sql_result_bytes,
        least_bound=backend.sql_least.format(a="j", b="t"),
        integer_idx=backend.sql_integer_idx,
        valid_target=_VALID_TARGET,
    )
    spelled = {name: sql.format_map(slots) for name, sql in _QUERIES.items()}
    return _Statements(**spelled, mark=backend.param, true=backend.sql_true)


#: A target whose claim breaks the rules: attempts below 0 (each claim adds one, a release takes back only its
#: own), or a target running for a runner that no attempt was counted for.
_UNSOUND_CLAIM = "attempts < 0 OR (status = 'running' AND runner IS NOT NULL AND attempts < 1)"

#: Each backend's statements (one set per ``statement_key``: an older store read-only has no claim columns).
_BY_BACKEND: dict[str, _Statements] = {}


def _sql() -> _Statements:
    backend = db.backend
    statements = _BY_BACKEND.get(backend.statement_key)
    if statements is None:
        statements = _BY_BACKEND[backend.statement_key] = _statements(backend)
    return statements


def _chunk_end(low: Any) -> Any:
    """The last job id of the chunk after ``low``, or None when the chunk reaches the end: at most
    JOBS_PER_CHUNK jobs and about TARGETS_PER_CHUNK targets (one job with more is a chunk of its own)."""
    jobs, job_params = _id_range("id", low, None)
    targets, target_params = _id_range("job_id", low, None)
    sql = _sql().chunk_end.format(jobs=jobs, targets=targets)
    row = db.fetch_one(sql, (*job_params, JOBS_PER_CHUNK - 1, *target_params, TARGETS_PER_CHUNK - 1))
    return row[0]


def _id_range(column: str, low: Any, high: Any) -> tuple[str, tuple[Any, ...]]:
    sql = _sql()
    clauses, params = [], []
    if low is not None:
        clauses.append(f"{column} > {sql.mark}")
        params.append(low)
    if high is not None:
        clauses.append(f"{column} <= {sql.mark}")
        params.append(high)
    return " AND ".join(clauses) or sql.true, tuple(params)


def _missing_targets(rows: int, total: Any, created_at: Any, cutoff: int) -> bool:
    """Whether a job past its grace period holds fewer target rows than its total."""
    if type(total) is not int or type(created_at) is not int:  # another program's text: job_status's
        return False
    return rows < total and created_at <= cutoff


def _outside(idx_min: Any, idx_max: Any, total: Any) -> bool:
    # SQLite sorts text after every number, so a text idx written by another program shows in idx_max.
    if not all(type(v) is int for v in (idx_min, idx_max, total)):
        return True
    return bool(idx_min < 0 or idx_max >= total)


def _idx_detail(job_id: Any, total: Any) -> str:
    rows = db.fetch_all(_sql().idx_outside, (job_id, total))
    shown = ", ".join(repr(row[0]) for row in rows[:5]) + (", ..." if len(rows) > 5 else "")
    last = total - 1 if type(total) is int else f"{total!r} - 1"
    return f"target idx outside 0..{last} (targets_total - 1): {shown}"


def _targets(n: int) -> str:
    return f"{n} target" if n == 1 else f"{n} targets"


def _name(job_id: Any) -> str:
    return job_id if isinstance(job_id, str) else repr(job_id)
