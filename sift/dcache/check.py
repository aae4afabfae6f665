"""The store's invariant check (``sift check``, and ``check_store_invariants`` in tests): one implementation.

It reads the jobs in chunks of consecutive ids, each chunk with its targets in one read transaction, so
another thread waits at most one chunk for the shared connection and another process is never blocked.
The integrity check and the byte total, which read the whole file in one statement, run on a private
connection for a file store, so they hold no lock at all; without repair, the integrity check runs in a
thread of its own beside the chunks (its findings, if any, replace theirs). ``repair=True`` rewrites only
derived data (``targets_done``, ``nbytes``, the byte total, a missing index or trigger) and deletes orphan
targets, each chunk in one short write transaction; a bad status or an idx out of range is data a person
must decide about, so it is reported and left as it is.

On PostgreSQL the same checks run with PostgreSQL's spellings (no ``quick_check``: the server keeps its own
files whole), each chunk in one REPEATABLE READ transaction. The schema check reads the catalog (tables,
indexes, the total's trigger and functions, the ``sift_schema`` version) and the byte total is the 16 slot
rows summed. Repair stays exact while other processes write: each chunk's fixes lock their jobs first (the
rule every writer follows: job before target) under the removal advisory lock, and the total is recomputed
with ``batch_totals`` locked against writers (``EXCLUSIVE``: readers go on).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from .database import db
from .errors import BatchError, StoreConflict, StoreCorrupt
from .models import FINAL_TARGET_STATUSES, JobStatus, TargetStatus
from .sqlite import (
    BASE_SCHEMA,
    RECOMPUTE_TOTAL_SQL,
    SCHEMA_NAMES,
    SPEED_SCHEMA,
    TOTAL_NBYTES_SQL,
    SerializedSqliteDatabase,
)

__all__ = ["Repair", "StoreReport", "Violation", "check_store"]

#: Jobs read (and, with repair, fixed) per transaction.
JOBS_PER_CHUNK = 500
#: About how many targets one chunk reads, so a chunk of big jobs holds the lock no longer.
TARGETS_PER_CHUNK = 5_000

#: The kinds of violation ``repair=True`` fixes; the others (quick_check, job_status, target_status,
#: target_idx) are left for a person to decide.
REPAIRABLE = frozenset({"schema", "total", "targets_done", "nbytes", "orphan_targets"})

#: PostgreSQL's schema objects by kind (the tables' primary keys come with the tables).
PG_SCHEMA_NAMES = frozenset(
    {("table", "batch_job"), ("table", "batch_target"), ("table", "batch_totals"), ("table", "sift_schema")}
    | {("index", "batch_job_idem"), ("index", "batch_job_lease"), ("index", "batch_job_live")}
    | {("index", "batch_job_evictable"), ("index", "batch_job_claim"), ("index", "batch_target_pending")}
    | {("index", "batch_job_live_lease"), ("trigger", "batch_totals_track")}
    | {("function", "batch_totals_track"), ("function", "sift_json_valid"), ("function", "sift_json")}
)

_JOB_STATUSES = frozenset(s.value for s in JobStatus)


def _sql_list(values: Any) -> str:
    return ", ".join(f"'{v.value}'" for v in values)


_FINAL = _sql_list(FINAL_TARGET_STATUSES)
_VALID_TARGET = _sql_list(TargetStatus)


@dataclass(frozen=True)
class _Entry:
    kind: str
    job_id: str | None  # the job it is about; None for the whole store
    detail: str

    def __str__(self) -> str:
        where = "" if self.job_id is None else f" (job {self.job_id!r})"
        return f"{self.kind}{where}: {self.detail}"


@dataclass(frozen=True)
class Violation(_Entry):
    """One broken invariant; ``job_id`` names the job it affects (None for the whole store)."""


@dataclass(frozen=True)
class Repair(_Entry):
    """One change ``check_store(repair=True)`` made: the kind it mended, the job, and what changed."""


@dataclass
class StoreReport:
    """What ``check_store`` found (``violations``, as found before any repair) and changed (``repairs``)."""

    jobs: int = 0
    targets: int = 0
    violations: list[Violation] = field(default_factory=list)
    repairs: list[Repair] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the store was consistent (a repaired store was not: check again to see it is now)."""
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        return {
            "ok": self.ok,
            "jobs": self.jobs,
            "targets": self.targets,
            "violations": [asdict(v) for v in self.violations],
            "repairs": [asdict(r) for r in self.repairs],
        }

    def __str__(self) -> str:
        head = f"{self.jobs} jobs, {self.targets} targets: "
        head += "ok" if self.ok else f"{len(self.violations)} violation(s)"
        lines = [head, *(f"  {v}" for v in self.violations)]
        lines += [f"  repaired {r}" for r in self.repairs]
        return "\n".join(lines)


def check_store(*, repair: bool = False, progress: Callable[[int], None] | None = None) -> StoreReport:
    """Check every invariant of the open store and name each violation with the job it affects;
    with ``repair``, recompute the derived fields and delete orphan targets, reporting each change.
    ``progress`` is called after each chunk with the number of jobs it read."""
    report = StoreReport()
    if not _on_sqlite():  # PostgreSQL keeps its files whole: there is no quick_check to run
        _check_data(report, repair, progress)
        return report
    if repair or db.database in (":memory:", ""):
        # Nothing else can be trusted on a damaged file, and repair must not write into it.
        report.violations += _quick_check()
        if not report.violations:
            _check_data(report, repair, progress)
        return report
    # Reading only, on a file: the integrity check reads the whole file on a connection of its own, in a
    # thread of its own, while the chunks go by on the shared one (SQLite runs without the GIL).
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sift-check") as pool:
        integrity = pool.submit(_quick_check)
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


def _quick_check() -> list[Violation]:
    try:
        rows = _side_read("PRAGMA quick_check")
    except StoreCorrupt as exc:  # too damaged for quick_check to finish
        rows = [(str(exc.__cause__ or exc),)]
    return [] if rows == [("ok",)] else [Violation("quick_check", None, str(row[0])) for row in rows]


def _check_data(report: StoreReport, repair: bool, progress: Callable[[int], None] | None) -> None:
    """Everything but the integrity check, into ``report``."""
    missing = _missing_schema(report)
    report.violations += [Violation("schema", None, f"{name} is missing") for name in missing]
    if {"batch_job", "batch_target"} & set(missing) and not repair:
        return
    if missing and repair:
        _create_schema()
        report.repairs += [Repair("schema", None, f"created {name}") for name in missing]
    if "batch_totals" not in missing:
        if not _on_sqlite():
            _check_slots(report)
        kept, actual = _side_read(_sql().total)[0]
        if kept != actual:
            shown = "no row" if kept is None else repr(kept)
            report.violations.append(
                Violation("total", None, f"batch_totals holds {shown}, but SUM(nbytes) is {actual}")
            )
    low: Any = None
    while True:
        with _read_transaction():
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
        _repair_total(report)


def _missing_schema(report: StoreReport) -> list[str]:
    """The parts of the schema the store lacks; on PostgreSQL also a ``sift_schema`` version that is not
    this sift's (into ``report``: a person decides, as for a status)."""
    if _on_sqlite():
        with _read_transaction():
            present = {row[0] for row in db.fetch_all("SELECT name FROM sqlite_master", ())}
        return sorted(SCHEMA_NAMES - present)
    rows = db.fetch_all(_PG_SCHEMA, (db.backend.schema,) * 3)  # type: ignore[attr-defined]
    missing = sorted(PG_SCHEMA_NAMES - {(kind, name) for kind, name in rows})
    names = [name if kind == "table" else f"{name} ({kind})" for kind, name in missing]
    if ("table", "sift_schema") not in missing:
        from .postgres import SCHEMA_VERSION

        versions = [row[0] for row in db.fetch_all("SELECT version FROM sift_schema", ())]
        if versions != [SCHEMA_VERSION]:
            detail = f"sift_schema holds version(s) {versions}; this sift writes version {SCHEMA_VERSION}"
            report.violations.append(Violation("schema_version", None, detail))
    return names


def _create_schema() -> None:
    """Create what is missing of the schema, as ``open_db`` does for a new store."""
    if _on_sqlite():
        with db.write():
            for statement in BASE_SCHEMA + SPEED_SCHEMA:
                db.run_sql(statement, ())
    else:
        db.backend._prepare_schema()  # type: ignore[attr-defined]


def _fix_chunk(low: Any, high: Any) -> list[Repair]:
    """Repair one chunk in one write transaction, reading it again there: another writer may have changed
    it since the check read it. On PostgreSQL its jobs are locked first (job before target, as every
    writer does) under the removal lock (no sweep or eviction meanwhile), so what it writes is exact."""

    def run() -> list[Repair]:
        with db.backend.removals():
            if not _on_sqlite():
                where, params = _id_range("id", low, high)
                db.run_sql(_LOCK_JOBS.format(where=where), params)
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
        valid, no_targets = _JOB_STATUSES, (None, 0, 0, 0, 0, None, None)
        for job in jobs:
            job_id, status, total, done, nbytes = job
            group = by_job.pop(job_id, no_targets)
            _, _, final, size, bad, idx_min, idx_max = group
            # The usual case, decided here without a call: every check passes.
            if (
                status in valid
                and done == final
                and nbytes == size
                and not bad
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
        for job_id, count, *_ in by_job.values():  # targets whose job is not there
            self._add("orphan_targets", _name(job_id), f"{_targets(count)} without their job")
            self.fixes.append(("orphan_targets", job_id, count, 0))

    def _check_job(self, job: tuple[Any, ...], group: tuple[Any, ...]) -> None:
        job_id, status, total, done, nbytes = job
        _, _, final, size, bad_statuses, idx_min, idx_max = group
        name = _name(job_id)
        if status not in _JOB_STATUSES:
            self._add("job_status", name, f"status {status!r} is not one of {', '.join(JobStatus)}")
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
    total: str
    chunk_end: str
    idx_outside: str
    fix_job: str
    delete_orphans: str
    mark: str  # the parameter placeholder
    true: str  # a condition that always holds


def _statements(postgres: bool) -> _Statements:
    q = "%s" if postgres else "?"
    # One pass over the targets of a range of jobs, in primary-key order (no sort): per job, the rows, the
    # final ones, the UTF-8 bytes of the results, the statuses outside the enum, the smallest and largest idx.
    count_if, size = ("SUM(({})::int)", "octet_length(result)") if postgres else ("SUM({})", None)
    size = size or "length(CAST(result AS BLOB))"
    # SQLite's min() of two values skips neither NULL: coalesce each with the other. SQLite also orders an
    # id another program wrote as a number; PostgreSQL's columns hold only what their types allow.
    least = "LEAST(j, t)" if postgres else "min(coalesce(j, t), coalesce(t, j))"
    return _Statements(
        target_groups=f"""SELECT job_id, COUNT(*), {count_if.format(f"status IN ({_FINAL})")},
            COALESCE(SUM({size}), 0), {count_if.format(f"status NOT IN ({_VALID_TARGET})")}, MIN(idx),
            MAX(idx) FROM batch_target WHERE {{where}} GROUP BY job_id""",
        jobs="SELECT id, status, targets_total, targets_done, nbytes FROM batch_job WHERE {where} "
        "ORDER BY id",
        # The statuses outside the enum of one job's targets, for the report (only when there are some).
        bad_statuses=f"""SELECT MIN(status), MAX(status) FROM batch_target
            WHERE job_id = {q} AND status NOT IN ({_VALID_TARGET})""",
        # PostgreSQL: the 16 slot rows summed, in the same statement (one snapshot) as the jobs' sum.
        total=(
            "SELECT (SELECT COALESCE(SUM(nbytes), 0)::bigint FROM batch_totals), "
            "(SELECT COALESCE(SUM(nbytes), 0)::bigint FROM batch_job)"
            if postgres
            else f"SELECT ({TOTAL_NBYTES_SQL}), (SELECT COALESCE(SUM(nbytes), 0) FROM batch_job)"
        ),
        chunk_end=(
            f"SELECT {least} FROM "
            f"(SELECT (SELECT id FROM batch_job WHERE {{jobs}} ORDER BY id LIMIT 1 OFFSET {q}) AS j, "
            f"(SELECT job_id FROM batch_target WHERE {{targets}} ORDER BY job_id LIMIT 1 OFFSET {q}) AS t) "
            "AS bounds"
        ),
        idx_outside=(
            f"SELECT idx FROM batch_target WHERE job_id = {q} AND NOT ("
            + ("" if postgres else "typeof(idx) = 'integer' AND ")
            + f"idx >= 0 AND idx < {q}) ORDER BY idx LIMIT 6"
        ),
        fix_job=f"UPDATE batch_job SET {{column}} = {q} WHERE id = {q}",
        delete_orphans=(
            f"DELETE FROM batch_target WHERE job_id = {q} "
            "AND NOT EXISTS (SELECT 1 FROM batch_job WHERE batch_job.id = batch_target.job_id)"
        ),
        mark=q,
        true="TRUE" if postgres else "1",
    )


_SQLITE, _POSTGRES = _statements(False), _statements(True)

# PostgreSQL: the schema's objects present in the store's schema, as (kind, name).
_PG_SCHEMA = """SELECT CASE c.relkind WHEN 'i' THEN 'index' ELSE 'table' END, c.relname FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'i')
    UNION ALL SELECT 'trigger', t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal
    AND t.tgenabled <> 'D'
    UNION ALL SELECT 'function', p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = %s"""
# PostgreSQL: a repair chunk's jobs, locked in one order before their targets are read again.
_LOCK_JOBS = "SELECT 1 FROM batch_job WHERE {where} ORDER BY id FOR NO KEY UPDATE"
# PostgreSQL: the total recomputed into slot 0 (the other slots to 0), with writers held off meanwhile.
_LOCK_TOTALS = "LOCK TABLE batch_totals IN EXCLUSIVE MODE"
_RECOMPUTE_SLOTS = (
    "UPDATE batch_totals SET nbytes = CASE WHEN slot = 0 THEN "
    "(SELECT COALESCE(SUM(nbytes), 0) FROM batch_job) ELSE 0 END"
)


def _on_sqlite() -> bool:
    return isinstance(db.backend, SerializedSqliteDatabase)


def _sql() -> _Statements:
    return _SQLITE if _on_sqlite() else _POSTGRES


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


def _check_slots(report: StoreReport) -> None:
    """PostgreSQL: the byte total's slot rows are exactly 0..TOTAL_SLOTS-1 (a missing one loses what the
    trigger adds to it; an extra one counts in the sum)."""
    from .postgres import TOTAL_SLOTS

    slots = {row[0] for row in db.fetch_all("SELECT slot FROM batch_totals", ())}
    missing, extra = sorted(set(range(TOTAL_SLOTS)) - slots), sorted(slots - set(range(TOTAL_SLOTS)))
    if missing or extra:
        detail = f"batch_totals should have the slot rows 0..{TOTAL_SLOTS - 1}: "
        detail += "; ".join(
            text for text in (missing and f"{missing} missing", extra and f"{extra} extra") if text
        )
        report.violations.append(Violation("total", None, detail))


def _repair_total(report: StoreReport) -> None:
    """Recompute the byte total if it differs from SUM(nbytes), in one write transaction (a full scan).
    On PostgreSQL: slot 0 gets the sum and the others 0 (missing slot rows are made, others deleted),
    with ``batch_totals`` locked so no writer adds to a slot meanwhile (see the module's docstring)."""
    if _on_sqlite():
        with db.write():
            kept, actual = db.fetch_one(_sql().total, ())
            if kept != actual:
                db.run_sql(RECOMPUTE_TOTAL_SQL, ())
                shown = "no row" if kept is None else repr(kept)
                report.repairs.append(Repair("total", None, f"{shown} -> {actual}"))
        return
    from .postgres import TOTAL_SLOTS

    with db.write():
        db.run_sql(_LOCK_TOTALS, ())
        # Every transaction that added to a slot has ended; a statement that changes nbytes later adds
        # its own delta after this commit, to the sum read here without it: the total stays exact.
        kept, actual = db.fetch_one(_sql().total, ())
        slots = [row[0] for row in db.fetch_all("SELECT slot FROM batch_totals ORDER BY slot", ())]
        if slots != list(range(TOTAL_SLOTS)):
            db.run_sql("DELETE FROM batch_totals WHERE slot NOT BETWEEN 0 AND %s", (TOTAL_SLOTS - 1,))
            db.run_sql(
                "INSERT INTO batch_totals (slot, nbytes) SELECT g, 0 FROM generate_series(0, %s) g "
                "ON CONFLICT (slot) DO NOTHING",
                (TOTAL_SLOTS - 1,),
            )
            report.repairs.append(Repair("total", None, f"slot rows {slots} -> 0..{TOTAL_SLOTS - 1}"))
        elif kept == actual:
            return
        db.run_sql(_RECOMPUTE_SLOTS, ())
        if kept != actual:
            report.repairs.append(Repair("total", None, f"{kept!r} -> {actual} (slot 0; the others 0)"))


def _targets(n: int) -> str:
    return f"{n} target" if n == 1 else f"{n} targets"


def _name(job_id: Any) -> str:
    return job_id if isinstance(job_id, str) else repr(job_id)


@contextlib.contextmanager
def _read_transaction() -> Iterator[None]:
    """One chunk's reads as one snapshot, under the lock; inside a caller's transaction, that one. On
    PostgreSQL a REPEATABLE READ transaction on the thread's connection (no lock: writers go on)."""
    if not _on_sqlite():
        pg_conn = db.backend.usable_connection()  # type: ignore[attr-defined]
        if pg_conn.info.transaction_status != 0:  # psycopg's IDLE: inside a caller's transaction
            yield
            return
        db.run_sql("BEGIN ISOLATION LEVEL REPEATABLE READ", ())
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # the error raised already says more
                db.run_sql("ROLLBACK", ())
            raise
        db.run_sql("COMMIT", ())
        return
    with db.lock:
        conn: sqlite3.Connection = db.connection()
        if conn.in_transaction:
            yield
            return
        db.run_sql("BEGIN", ())
        try:
            yield
        except BaseException:
            with contextlib.suppress(sqlite3.Error, BatchError):  # the error raised already says more
                db.run_sql("ROLLBACK", ())
            raise
        if conn.in_transaction:
            db.run_sql("COMMIT", ())


def _side_read(sql: str) -> list[Any]:
    """Rows of a statement that reads the whole file: on a private read-only connection for a file (no
    lock held, nothing blocked); an in-memory store has only the shared connection, and PostgreSQL's
    statement reads one snapshot on the thread's connection, blocking no one."""
    if db.deferred or not _on_sqlite() or db.database in (":memory:", ""):
        with db.lock:
            rows: list[Any] = db.fetch_all(sql, ())
            return rows
    try:  # db.database is the path, or the mode=ro URI of a read-only store
        conn = sqlite3.connect(
            db.database, timeout=db.timeout, isolation_level=None, check_same_thread=False, uri=db.readonly
        )
        try:
            conn.execute("PRAGMA query_only = 1")
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        db.raise_store_error(exc)
        raise
