"""Close to raw: the package against the same work written plainly on the driver (sqlite3, or psycopg
on PostgreSQL), interleaved: the runner step, a submit, a bulk put, a bulk read.

The SQLite runner step's baseline is the seed a careful engineer writes on the original schema alone (its
two indexes, no triggers): BEGIN IMMEDIATE, read the target, update it and its job, COMMIT, and a running
total of the bytes kept in the program. Everything sift adds (its indexes, the byte total's trigger, the
writers' queue, the checkpoint policy) is part of what is measured. The other SQLite baselines run the
package's own statements on a copy of its file."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sift import dcache
from sift.dcache import manager, statements, tables

# The baselines send the store's own statement texts (manager's compiled statements, the total's read), so
# that only the package's own work differs; no public API exposes them.
from sift.dcache.backends.sqlite import writes as sqlite_writes
from sift.dcache.backends.sqlite.schema import BASE_SCHEMA, TOTAL_NBYTES_SQL
from sift.dcache.hosts import url_host
from sift.testing import make_job, make_targets

from ..fixtures import Builder, PgBuilder, raw_connect, wal_frames
from ..harness import Report, interleave, interleave_all, log, time_batch
from ..sizes import BUDGET, OPTIONS, RESULT_1K, T0, Sizes
from ..stores import PgServer
from .hot_paths import RUNNER_JOB, runner_step
from .set_writes import bench_set_writes

# The baseline runs the package's own SQL text, with parameters written out by hand. These are the
# parameter layouts that hand-written code assumes; check_layouts() fails loudly if the package changes.
LAYOUTS: dict[str, list[object]] = {
    "_INSERT_JOB": list(tables.JOB_COLUMNS),
    "_INSERT_TARGET": ["job_id", "idx", "url", "options", "options", "host"],
    "_TARGETS_TOTAL": ["job_id"],
    "_SELECT_TARGETS": ["job_id"],
}


#: Runner steps whose -wal frames are counted, after the timed ones: under SQLite's 1,000-frame checkpoint.
FRAMES_STEPS = 100
#: What each of the structures a result write moves costs it: the package's statements sent plainly on
#: copies of its file, each without one of them (the pending targets' index; the byte total's trigger, its
#: row's only writer), and without both; against the full file and the careful seed, in one interleaved run.
STEP_PARTS: dict[str, tuple[str, ...]] = {
    "package_sql": (),
    "no_host_index": ("DROP INDEX batch_target_host",),
    "no_byte_total": ("DROP TRIGGER batch_totals_update",),
    "neither": ("DROP INDEX batch_target_host", "DROP TRIGGER batch_totals_update"),
}


def check_layouts() -> None:
    """Stop the run when a statement the baselines bind by hand takes its parameters in a new order."""
    for name, layout in LAYOUTS.items():
        stmt: statements.Statement = getattr(manager, name)
        actual = [getattr(p, "name", p) for p in stmt.template]
        if actual != layout:
            raise SystemExit(f"bench: manager.{name} now takes {actual}, the baseline assumes {layout}")


def with_hosts(rows: list[tuple[Any, ...]]) -> Any:
    """Each target row with its host last (schema version 4), computed as the package computes it, inside
    the timed call as the package does."""
    return ((*row, url_host(row[2])) for row in rows)


class Baseline:
    """The same work with the stdlib sqlite3 module, as plainly as a competent engineer writes it:
    the same SQL, one connection in autocommit mode, BEGIN IMMEDIATE ... COMMIT where the package
    opens a write transaction."""

    def __init__(self, path: Path) -> None:
        self.conn = raw_connect(path)
        self.insert_job_sql = manager._INSERT_JOB.sql
        self.insert_target_sql = manager._INSERT_TARGET.sql
        self.targets_total_sql = manager._TARGETS_TOTAL.sql
        self.select_targets_sql = manager._SELECT_TARGETS.sql

    def close(self) -> None:
        self.conn.close()

    def update_target_done(
        self, job_id: str, idx: int, result: str, now: int, *, at_lease: bool = False
    ) -> None:
        """The package's result write, its statements sent plainly: the job's update, then the target's.
        ``at_lease``: the job's lease is ``now`` already, and the form that leaves it alone is sent."""
        size = len(result.encode("utf-8"))
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            move = conn.execute(sqlite_writes._move_sql(1, at_lease), (job_id, None, now, 1, idx, 1, size))
            if move.rowcount != 1:
                raise LookupError(
                    f"no target {job_id}/{idx}" + (f" in a job whose lease is {now}" if at_lease else "")
                )
            conn.execute(sqlite_writes._WRITE_ONE, (job_id, idx, "done", result, None, None))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def update_targets_done(self, job_id: str, idxs: range, result: str, now: int) -> None:
        """The package's write of several results in one transaction, its statements sent plainly: the job
        moved by the set's change, its targets checked in the same statement (its rows padded to a power of
        two, as the package pads them), then the one target's write, run for each target."""
        size = len(result.encode("utf-8"))
        rows = 1 << (len(idxs) - 1).bit_length()
        pad = rows - len(idxs)
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            move: list[Any] = [job_id, None, now, len(idxs)]
            for idx in idxs:
                move += (idx, 1, size)
            move += (-1, 0, 0) * pad
            if not (
                conn.execute(sqlite_writes._move_sql(rows, True), move).rowcount
                or conn.execute(sqlite_writes._move_sql(rows, False), move).rowcount
            ):
                raise LookupError(f"not every one of the targets {idxs} may be written")
            writes = [(job_id, idx, "done", result, None, None) for idx in idxs]
            conn.executemany(sqlite_writes._WRITE_ONE, writes)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def evict_noop(self, max_bytes: int) -> None:
        (total,) = self.conn.execute(TOTAL_NBYTES_SQL).fetchone()
        if total > max_bytes:
            raise AssertionError("the baseline does not evict")

    def create_job(self, job: tuple[Any, ...], targets: list[tuple[Any, ...]]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(self.insert_job_sql, job)
            conn.executemany(self.insert_target_sql, with_hosts(targets))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def put_targets(self, job_id: str, targets: list[tuple[Any, ...]]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute(self.targets_total_sql, (job_id,)).fetchone() is None:
                raise LookupError(job_id)
            conn.executemany(self.insert_target_sql, with_hosts(targets))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def read_targets(self, job_id: str) -> list[Any]:
        return self.conn.execute(self.select_targets_sql, (job_id,)).fetchall()


class CarefulRunner:
    """The runner step as a careful engineer writes it with the stdlib sqlite3 module on the original
    schema alone: one BEGIN IMMEDIATE, read the target, update it and its job, COMMIT; the byte total is
    a running sum in the program (the seed's one process owns the file), so the no-op eviction reads
    nothing."""

    FINAL = ("done", "failed")
    READ = "SELECT status, length(CAST(result AS BLOB)) FROM batch_target WHERE job_id = ? AND idx = ?"
    SET_TARGET = (
        "UPDATE batch_target SET status = ?, result = ?, error = ?, hint = ? WHERE job_id = ? AND idx = ?"
    )
    SET_JOB = (
        "UPDATE batch_job SET targets_done = targets_done + ?, nbytes = nbytes + ?, lease = ? WHERE id = ?"
    )

    def __init__(self, path: Path, source: Path) -> None:
        """A new file at ``path`` with the original schema, holding ``source``'s jobs and targets."""
        self.path = path
        self.conn = conn = raw_connect(path)
        for statement in BASE_SCHEMA:
            conn.execute(statement)
        conn.execute("ATTACH DATABASE ? AS source", (str(source),))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO batch_job SELECT * FROM source.batch_job ORDER BY rowid")
        conn.execute(  # the original columns only: the claims' columns are sift's
            "INSERT INTO batch_target SELECT job_id, idx, url, options, status, result, error, hint"
            " FROM source.batch_target ORDER BY job_id, idx"
        )
        conn.execute("COMMIT")
        conn.execute("DETACH DATABASE source")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (self.total,) = conn.execute("SELECT COALESCE(SUM(nbytes), 0) FROM batch_job").fetchone()

    @classmethod
    def opened(cls, path: Path) -> CarefulRunner:
        """The careful runner on a file it made earlier (its running total read again)."""
        careful = cls.__new__(cls)
        careful.path, careful.conn = path, raw_connect(path)
        (careful.total,) = careful.conn.execute("SELECT COALESCE(SUM(nbytes), 0) FROM batch_job").fetchone()
        return careful

    def close(self) -> None:
        self.conn.close()

    def update_target_done(self, job_id: str, idx: int, result: str, now: int) -> None:
        size = len(result.encode("utf-8"))
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(self.READ, (job_id, idx)).fetchone()
            if row is None:
                raise LookupError(f"no target {job_id}/{idx}")
            counted = 0 if row[0] in self.FINAL else 1
            delta = size - (row[1] or 0)
            conn.execute(self.SET_TARGET, ("done", result, None, None, job_id, idx))
            conn.execute(self.SET_JOB, (counted, delta, now, job_id))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.total += delta

    def evict_noop(self, max_bytes: int) -> None:
        if self.total > max_bytes:
            raise AssertionError("the baseline does not evict")


def job_row(job_id: str, targets_total: int) -> tuple[Any, ...]:
    """The baseline's job: the row of ``pkg_job``."""
    return (job_id, "caller-1", "fleet", "", "queued", "", targets_total, 0, T0, T0, 0)


def target_rows(job_id: str, count: int) -> list[tuple[Any, ...]]:
    """The baseline's targets: the rows of ``make_targets(count, options=OPTIONS)``."""
    return [(job_id, i, f"https://example.com/{i}", OPTIONS, OPTIONS) for i in range(count)]


def pkg_job(job_id: str, targets_total: int) -> dcache.BatchJob:
    """The package's job: a queued job of the first caller, created at T0."""
    return make_job(id=job_id, caller="caller-1", targets_total=targets_total, created_at=T0, lease=T0)


def ratio_pair(report: Report, case: str, n: int, pkg: list[float], base: list[float]) -> float:
    """The package's case and its sqlite3 baseline's; the package's median over the baseline's."""
    return report.pair(
        report.case(f"raw/{case}/package", n, pkg), report.case(f"raw/{case}/sqlite3", n, base)
    )


def bench_step_parts(
    tmp: Path, source: Path, careful: CarefulRunner, start: int, now: int, sizes: Sizes, report: Report
) -> None:
    """STEP_PARTS: the runner step's statements sent plainly on copies of ``source`` (the package's file,
    its runner job's targets pending from ``start``), and the careful seed, interleaved batch by batch;
    each case's ratio is its median over the seed's."""
    sides: list[Callable[[int], None]] = []
    plain: list[Baseline] = []
    for part, statements_ in STEP_PARTS.items():
        path = tmp / f"raw-part-{part}.db"
        src, dst = sqlite3.connect(source), sqlite3.connect(path)
        src.backup(dst)
        src.close()
        dst.execute("PRAGMA journal_mode = wal")
        for statement in statements_:
            dst.execute(statement)
        dst.commit()
        dst.close()
        base = Baseline(path)
        plain.append(base)

        def step(i: int, base: Baseline = base) -> None:
            base.update_target_done(RUNNER_JOB, i, RESULT_1K, now, at_lease=True)
            base.evict_noop(BUDGET)

        sides.append(step)

    def seed_step(i: int) -> None:
        careful.update_target_done(RUNNER_JOB, i, RESULT_1K, now)
        careful.evict_noop(BUDGET)

    sides.append(seed_step)
    samples = interleave_all(
        sizes.raw_rounds, tuple(sides), lambda r: start + r * sizes.runner_ops, sizes.runner_ops
    )
    for base in plain:
        base.close()
    seed = report.case("raw/runner_step_parts/sqlite3", 1, samples[-1])
    seed.ratio = 1.0
    for part, times in zip(STEP_PARTS, samples[:-1], strict=True):
        case = report.case(f"raw/runner_step_parts/{part}", 1, times)
        case.ratio = case.median_us / seed.median_us
    log(
        "raw: the runner step's statements sent plainly, over the seed: "
        + ", ".join(f"{c.name.rsplit('/', 1)[1]} {c.ratio:.2f}" for c in report.cases[-len(STEP_PARTS) :])
    )


def bench_raw(tmp: Path, sizes: Sizes, report: Report) -> None:
    """The package and the sqlite3 baseline on two copies of one file, interleaved batch by batch."""
    check_layouts()
    pkg_path, base_path = tmp / "raw-package.db", tmp / "raw-sqlite3.db"
    # the comparison's steps, then as many for the structures' costs (bench_step_parts)
    steps = 2 * sizes.raw_rounds * sizes.runner_ops + sizes.warmup + FRAMES_STEPS + 10
    b = Builder(pkg_path)
    b.jobs(
        "job-", sizes.flat_small, targets=sizes.targets_per_job, result_bytes=sizes.retained_result, lease0=T0
    )
    b.one_job(RUNNER_JOB, caller="caller-0", status="running", targets=steps, result_bytes=None, lease=T0 + 1)
    b.one_job(
        "reader",
        caller="caller-0",
        status="done",
        targets=sizes.read_targets,
        result_bytes=sizes.read_result,
        lease=T0 + 1,
    )
    b.close()
    dcache.open_db(pkg_path)  # the speed schema, so both files are the same
    dcache.close_db()
    shutil.copyfile(pkg_path, base_path)
    careful = CarefulRunner(tmp / "raw-original.db", pkg_path)
    dcache.open_db(pkg_path)
    base = Baseline(base_path)
    now = T0 + 10

    pkg_step = runner_step(now)

    def sql_step(i: int) -> None:
        base.update_target_done(RUNNER_JOB, i, RESULT_1K, now, at_lease=True)
        base.evict_noop(BUDGET)

    def base_step(i: int) -> None:
        careful.update_target_done(RUNNER_JOB, i, RESULT_1K, now)
        careful.evict_noop(BUDGET)

    # The job's first result moves its lease to ``now`` (the package's first step does so too); every later
    # one is in the lease's second.
    base.update_target_done(RUNNER_JOB, 0, RESULT_1K, now)
    sides = (pkg_step, sql_step, base_step)
    for op in sides:
        time_batch(op, 1, sizes.warmup)
    pkg, sql, raw = interleave_all(
        sizes.raw_rounds, sides, lambda r: 1 + sizes.warmup + r * sizes.runner_ops, sizes.runner_ops
    )
    after = 1 + sizes.warmup + sizes.raw_rounds * sizes.runner_ops
    frames = {
        side: wal_frames(path, op, after, FRAMES_STEPS)
        for side, path, op in (
            ("package", pkg_path, pkg_step),
            ("package_sql", base_path, sql_step),
            ("sqlite3", careful.path, base_step),
        )
    }
    parts_from = after + FRAMES_STEPS
    bench_step_parts(tmp, base_path, careful, parts_from, now, sizes, report)
    careful.close()
    pkg_case = report.case("raw/runner_step/package", 1, pkg)
    sql_case = report.case("raw/runner_step/package_sql", 1, sql)
    base_case = report.case("raw/runner_step/sqlite3", 1, raw)
    ratio = report.pair(pkg_case, base_case)
    report.goal("close to raw: runner step package/sqlite3 on the original schema", ratio, 1.25, "x")
    # Where that ratio comes from: the package's statements on its schema, sent plainly, against the careful
    # seed; and the package's Python around those same statements.
    sql_case.ratio = sql_case.median_us / base_case.median_us
    report.goal(
        "close to raw: runner step, the package's statements sent plainly/sqlite3 (report only)",
        sql_case.ratio,
        None,
        "x",
    )
    report.goal(
        "close to raw: runner step, the package/its statements sent plainly (report only)",
        pkg_case.median_us / sql_case.median_us,
        None,
        "x",
    )
    for name, counted in frames.items():
        if counted is None:
            log("raw: this SQLite has no dbstat table; the runner step's -wal frames are not counted")
            break
        {"package": pkg_case, "package_sql": sql_case, "sqlite3": base_case}[name].extra.update(
            {f"wal_frames/{tree}": round(n, 2) for tree, n in counted.items()}
        )
        log(
            f"raw: -wal frames a runner step appends, {name}: "
            + ", ".join(f"{t} {n:.2f}" for t, n in counted.items())
        )

    # Submit path: create_batch_job with 100 targets. Inputs are built before timing.
    per_batch = max(1, sizes.raw_ops // 10)
    total = (sizes.raw_rounds + 1) * per_batch
    pkg_jobs = [
        (pkg_job(f"sub-p-{i}", sizes.submit_targets), make_targets(sizes.submit_targets, options=OPTIONS))
        for i in range(total)
    ]
    base_jobs = [
        (job_row(f"sub-b-{i}", sizes.submit_targets), target_rows(f"sub-b-{i}", sizes.submit_targets))
        for i in range(total)
    ]

    def pkg_submit(i: int) -> None:
        dcache.create_batch_job(*pkg_jobs[i])

    def base_submit(i: int) -> None:
        base.create_job(*base_jobs[i])

    time_batch(pkg_submit, 0, per_batch)
    time_batch(base_submit, 0, per_batch)
    pkg, raw = interleave(sizes.raw_rounds, pkg_submit, base_submit, lambda r: (r + 1) * per_batch, per_batch)
    ratio = ratio_pair(report, "submit_100", sizes.submit_targets, pkg, raw)
    report.goal(
        f"close to raw: create_batch_job with {sizes.submit_targets} targets package/sqlite3",
        ratio,
        1.5,
        "x",
    )
    pkg_jobs.clear()
    base_jobs.clear()

    # put_batch_targets of 100,000 targets vs executemany; one call is the whole put. The BatchTarget
    # instances (package) and the row tuples (baseline) are built before timing.
    targets = make_targets(sizes.put_targets, options=OPTIONS)
    rows = [target_rows(f"put-b-{r}", sizes.put_targets) for r in range(sizes.put_rounds)]
    for r in range(sizes.put_rounds):
        dcache.create_batch_job(pkg_job(f"put-p-{r}", sizes.put_targets))
        base.create_job(job_row(f"put-b-{r}", sizes.put_targets), [])

    def pkg_put(r: int) -> None:
        dcache.put_batch_targets(f"put-p-{r}", targets)

    def base_put(r: int) -> None:
        base.put_targets(f"put-b-{r}", rows[r])

    pkg, raw = interleave(sizes.put_rounds, pkg_put, base_put, lambda r: r, 1)
    ratio = ratio_pair(report, "put_batch_targets", sizes.put_targets, pkg, raw)
    report.goal(
        f"close to raw: put_batch_targets of {sizes.put_targets} targets package/executemany",
        ratio,
        1.5,
        "x",
    )
    targets.clear()
    rows.clear()

    # Reading batch_targets of a 10,000-target job (model instances) vs fetchall (tuples).
    def pkg_read(i: int) -> None:
        got = dcache.batch_targets("reader")
        if got is None or len(got) != sizes.read_targets:
            raise AssertionError("batch_targets read the wrong rows")

    def base_read(i: int) -> None:
        if len(base.read_targets("reader")) != sizes.read_targets:
            raise AssertionError("fetchall read the wrong rows")

    time_batch(pkg_read, 0, 1)
    time_batch(base_read, 0, 1)
    pkg, raw = interleave(sizes.read_rounds, pkg_read, base_read, lambda r: 0, sizes.read_ops)
    ratio = ratio_pair(report, "batch_targets_read", sizes.read_targets, pkg, raw)
    report.goal(
        f"close to raw: batch_targets of {sizes.read_targets} targets package/fetchall (report only)",
        ratio,
        None,
        "x",
    )
    base.close()
    dcache.close_db()
    bench_set_writes(tmp, sizes, report)


class PgBaseline:
    """The runner step with plain psycopg, as plainly as a competent engineer writes it: the store's own
    statements (the write as one statement, which locks the job and the target, moves the count and writes
    the target; the total's read) on one connection in autocommit mode, each its own transaction, as the
    package sends them."""

    def __init__(self, conn: Any) -> None:
        # The write it sends: a private text.
        from sift.dcache.backends.postgres import writes

        self.conn = conn
        self.write_sql = writes._WRITE_TARGETS
        self.total_sql = dcache.db.total_nbytes_sql
        #: What one runner step sends.
        self.statements = [self.write_sql, self.total_sql]

    def update_target_done(self, job_id: str, idx: int, result: str, now: int) -> None:
        size = len(result.encode("utf-8"))
        values = {
            "idx": [idx],
            "status": ["done"],
            "final": [1],
            "size": [size],
            "result": [result],
            "error": [None],
            "hint": [None],
            "job_id": job_id,
            "runner": None,
            "n": 1,
            "now": now,
        }
        if self.conn.execute(self.write_sql, values).rowcount != 1:
            raise LookupError(f"no target {job_id}/{idx}")

    def evict_noop(self, max_bytes: int) -> None:
        row = self.conn.execute(self.total_sql).fetchone()
        if row[0] > max_bytes:
            raise AssertionError("the baseline does not evict")


def statements_of(call: Callable[[], object]) -> list[str]:
    """The SQL texts the open PostgreSQL store runs during ``call`` (its transactions' BEGIN and COMMIT go
    through Peewee, not run_sql, and are not listed)."""
    backend = dcache.db.backend
    inner = backend.run_sql
    sent: list[str] = []

    def recording(sql: str, params: Any) -> Any:
        sent.append(sql)
        return inner(sql, params)

    setattr(backend, "run_sql", recording)  # noqa: B010 (an instance attribute shadows the method)
    try:
        call()
    finally:
        delattr(backend, "run_sql")
    return sent


def pg_raw(server: PgServer, sizes: Sizes, report: Report) -> None:
    """The runner step (update_batch_target to done with 1 KB, then a no-op eviction) against plain
    psycopg running the same statements, on two running jobs of one store, interleaved."""
    schema = server.new_schema("raw")
    steps = sizes.raw_rounds * sizes.raw_ops + sizes.warmup + 10
    b = PgBuilder(server, schema)
    b.jobs(
        "job-", sizes.flat_small, targets=sizes.targets_per_job, result_bytes=sizes.retained_result, lease0=T0
    )
    for job_id in (RUNNER_JOB, "runner-base"):
        b.one_job(job_id, caller="caller-0", status="running", targets=steps, result_bytes=None, lease=T0 + 1)
    b.close()
    dcache.open_db(server.target(schema))
    check_layouts()  # PostgreSQL's compilation of the statements the baseline binds by hand
    base = PgBaseline(server.connect(schema))
    now = T0 + 10

    pkg_step = runner_step(now)

    def base_step(i: int) -> None:
        base.update_target_done("runner-base", i, RESULT_1K, now)
        base.evict_noop(BUDGET)

    sent = statements_of(lambda: pkg_step(0))
    if sent != base.statements:
        raise SystemExit(f"bench: the runner step now sends {sent}; the baseline sends {base.statements}")
    time_batch(pkg_step, 1, sizes.warmup - 1)
    time_batch(base_step, 0, sizes.warmup)
    pkg, raw = interleave(
        sizes.raw_rounds, pkg_step, base_step, lambda r: sizes.warmup + r * sizes.raw_ops, sizes.raw_ops
    )
    ratio = report.pair(
        report.case("pg/raw/runner_step/package", 1, pkg), report.case("pg/raw/runner_step/psycopg", 1, raw)
    )
    report.goal("PostgreSQL: close to raw: runner step package/psycopg", ratio, 1.5, "x")
    base.conn.close()
    dcache.close_db()
    server.drop(schema)
