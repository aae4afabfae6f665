"""What is PostgreSQL's own: choosing the backend by URL, the schema, driver errors by SQLSTATE, retries of
conflicts, broken connections, fork, read-only opens. The rules themselves run on PostgreSQL through the
``store`` fixture of every other test file."""

from __future__ import annotations

import multiprocessing
import os
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import POSTGRES_URL, open_empty_postgres, postgres_target
from helpers import create_partial, make_job, make_targets, snapshot, stored_job

from sift import dcache
from sift.dcache import db, retries
from sift.dcache.backends.postgres.connection import PostgresStore
from sift.dcache.backends.postgres.schema import SCHEMA_VERSION
from sift.dcache.backends.postgres.writes import CONFLICT_RETRIES

pytestmark = pytest.mark.postgres

ctx = multiprocessing.get_context("spawn")


@pytest.fixture
def pg(postgres_schema: str) -> Iterator[str]:
    """The worker's schema, open and empty; yields its target URL."""
    open_empty_postgres(postgres_schema)
    yield postgres_target(postgres_schema)
    dcache.close_db()


@pytest.fixture
def fresh_schema(postgres_schema: str) -> Iterator[str]:
    """A schema name no store uses yet (dropped after the test)."""
    name = f"{postgres_schema}_new"
    yield name
    dcache.close_db()
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


# -- Choosing the backend -------------------------------------------------------------------------------


def test_postgresql_url_opens_a_postgres_store(pg: str) -> None:
    assert isinstance(db.backend, PostgresStore)
    assert repr(db) == f"<PostgresStore {pg!r}: open>"
    dcache.close_db()
    assert repr(db) == "<SerializedSqliteDatabase: no store open; call sift.dcache.open_db(path)>"
    with pytest.raises(dcache.StoreNotOpen):
        dcache.batch_job("x")


def test_postgres_scheme_is_the_same_store(pg: str) -> None:
    dcache.create_batch_job(make_job("job-1"))
    dcache.open_db(pg.replace("postgresql://", "postgres://", 1))
    assert isinstance(db.backend, PostgresStore)
    assert dcache.batch_job("job-1") is not None


@pytest.mark.parametrize("form", ["sqlite:///{rel}", "sqlite:///{abs}"])
def test_sqlite_url_opens_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    monkeypatch.chdir(tmp_path)
    dcache.open_db(form.format(rel="store.db", abs=str(tmp_path / "store.db")))
    try:
        assert isinstance(db.backend, dcache.SerializedSqliteDatabase)
        dcache.create_batch_job(make_job("job-1"))
    finally:
        dcache.close_db()
    assert (tmp_path / "store.db").is_file()


def test_switching_backends_keeps_db_the_object_models_use(pg: str, tmp_path: Path) -> None:
    dcache.create_batch_job(make_job("in-postgres"))
    dcache.open_db(tmp_path / "store.db")
    dcache.create_batch_job(make_job("in-sqlite"))
    assert [j.id for j in dcache.BatchJob.select()] == ["in-sqlite"]
    with db.atomic():  # the SQLite store's own atomic: it holds the store's lock
        assert db.backend.lock._is_owned()  # type: ignore[attr-defined]
    dcache.open_db(pg)
    assert [j.id for j in dcache.BatchJob.select()] == ["in-postgres"]
    with db:
        dcache.create_batch_job(make_job("in-block"))
    assert dcache.batch_job("in-block") is not None


@pytest.mark.parametrize(
    ("target", "field"),
    [
        (POSTGRES_URL + "?schema=Bad-Name", "schema"),
        (POSTGRES_URL + "?schema=", "schema"),
    ],
)
def test_bad_schema_names_are_refused(target: str, field: str) -> None:
    with pytest.raises(dcache.StoreUnavailable, match=rf"^{field}:"):
        dcache.open_db(target)
    assert repr(db).startswith("<SerializedSqliteDatabase: no store open")


def test_max_connections_is_postgres_only(tmp_path: Path, postgres_schema: str) -> None:
    with pytest.raises(dcache.StoreUnavailable, match=r"^max_connections:"):
        dcache.open_db(tmp_path / "store.db", max_connections=4)
    with pytest.raises(dcache.StoreUnavailable, match=r"^max_connections:"):
        dcache.open_db(postgres_target(postgres_schema), max_connections=0)
    dcache.open_db(postgres_target(postgres_schema), max_connections=3)
    assert db.backend._max_connections == 3  # type: ignore[attr-defined]
    dcache.close_db()


def test_no_server_is_store_unavailable_naming_it() -> None:
    with pytest.raises(dcache.StoreUnavailable, match=r"^path: cannot open .*127\.0\.0\.1:1/") as info:
        dcache.open_db("postgresql://postgres@127.0.0.1:1/test", timeout=2)
    assert isinstance(info.value.__cause__, psycopg.Error)
    assert repr(db).startswith("<SerializedSqliteDatabase: no store open")


def test_no_such_database_is_store_unavailable() -> None:
    with pytest.raises(dcache.StoreUnavailable, match="no_such_database_for_sift"):
        dcache.open_db(POSTGRES_URL.rsplit("/", 1)[0] + "/no_such_database_for_sift")


@pytest.mark.parametrize("where", ["user-part", "query", "sslpassword"])
def test_password_is_not_shown(postgres_schema: str, where: str) -> None:
    if where == "user-part":
        url = POSTGRES_URL.replace("postgresql://postgres@", "postgresql://postgres:secret@", 1) + "?"
    else:  # the trust-auth test server ignores both
        url = f"{POSTGRES_URL}?{'password' if where == 'query' else 'sslpassword'}=secret&"
    dcache.open_db(f"{url}schema={postgres_schema}")
    assert "secret" not in repr(db) and "secret" not in str(db.path)
    dcache.close_db()


@pytest.mark.parametrize(
    "netloc",
    [
        "postgres:s3cr%ZZet@127.0.0.1:5432",  # libpq quotes the malformed token, password and all
        "postgres:s3cret@[::1:5432",  # not a URL at all (urllib's ValueError)
    ],
)
def test_a_malformed_url_is_store_unavailable_without_its_password(netloc: str) -> None:
    with pytest.raises(dcache.StoreUnavailable) as info:
        dcache.open_db(f"postgresql://{netloc}/test?schema=never_made")
    shown = "".join(traceback.format_exception(info.value))  # what a log of the error prints
    assert "s3cr" not in shown, shown
    assert dcache.db.deferred


# -- Schema ---------------------------------------------------------------------------------------------


def _open_new(target: str, barrier: Any, results: Any) -> None:
    barrier.wait()
    try:
        dcache.open_db(target)
        dcache.create_batch_job(make_job(f"job-{os.getpid()}"))
        results.put("ok")
    except Exception as exc:
        results.put(f"{type(exc).__name__}: {exc}")


def open_from_8_processes(target: str) -> list[str]:
    """What each of 8 spawned processes, released at once, got from opening ``target`` and writing a job."""
    barrier, results = ctx.Barrier(8), ctx.Queue()
    processes = [ctx.Process(target=_open_new, args=(target, barrier, results)) for _ in range(8)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=120)
    return outcomes


@pytest.mark.slow
def test_eight_processes_create_a_new_schema_at_once(fresh_schema: str) -> None:
    target = postgres_target(fresh_schema)
    assert open_from_8_processes(target) == ["ok"] * 8
    dcache.open_db(target)
    assert db.execute_sql("SELECT id, version FROM sift_schema").fetchall() == [(0, SCHEMA_VERSION)]
    assert db.execute_sql("SELECT COUNT(*) FROM batch_job").fetchone()[0] == 8
    assert db.execute_sql("SELECT COUNT(*), COUNT(DISTINCT slot) FROM batch_totals").fetchone() == (16, 16)


#: The index of pending targets by idx that versions 2 to 4 made, and version 5 drops.
PENDING_BY_IDX = "CREATE INDEX batch_target_pending ON batch_target(job_id, idx) WHERE status = 'pending'"


def make_version_4(target: str) -> None:
    """Turn the store at ``target`` into what sift's schema version 4 made: with its index of pending
    targets by idx."""
    dcache.open_db(target)
    db.execute_sql(PENDING_BY_IDX)
    db.execute_sql("UPDATE sift_schema SET version = 4")
    dcache.close_db()


def make_version_3(target: str) -> None:
    """Turn the store at ``target`` into what sift's schema version 3 made: without version 4's host column,
    the ring's indexes and its cursor table."""
    dcache.open_db(target)
    db.execute_sql(PENDING_BY_IDX)
    db.execute_sql("DROP INDEX batch_job_ring, batch_target_host")
    db.execute_sql("DROP TABLE batch_claim_ring")
    db.execute_sql("ALTER TABLE batch_target DROP COLUMN host")
    db.execute_sql("UPDATE sift_schema SET version = 3")
    dcache.close_db()


def make_version_1(target: str) -> None:
    """Turn the store at ``target`` into what sift's schema version 1 made: without version 2's indexes,
    version 3's claim columns and version 4's host and ring."""
    make_version_3(target)
    dcache.open_db(target)
    # this open migrated the version 3 store to the current version, which drops batch_target_pending,
    # version 2's third index, and adds again version 4's host and ring
    db.execute_sql("DROP INDEX batch_job_claim, batch_job_live_lease, batch_job_ring, batch_target_host")
    db.execute_sql("DROP TABLE batch_claim_ring")
    db.execute_sql(
        "ALTER TABLE batch_target DROP COLUMN runner, DROP COLUMN heartbeat, DROP COLUMN attempts, "
        "DROP COLUMN host"
    )
    db.execute_sql("UPDATE sift_schema SET version = 1")
    dcache.close_db()


def claim_indexes() -> set[str]:
    rows = db.execute_sql(
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
        "AND indexname IN ('batch_job_claim', 'batch_target_pending', 'batch_job_live_lease')"
    )
    return {row[0] for row in rows.fetchall()}


def test_opening_a_version_1_store_migrates_it(pg: str) -> None:
    assert SCHEMA_VERSION == 11
    stored_job(make_job("job-1", targets_total=2), make_targets(2), nbytes=5)  # bytes of pending targets
    make_version_1(pg)
    dcache.open_db(pg, readonly=True)  # an older store reads as it is, its targets unclaimed
    assert [(t.idx, t.attempts, t.runner) for t in dcache.batch_targets("job-1") or []] == [
        (0, 0, None),
        (1, 0, None),
    ]
    with pytest.raises(dcache.StoreReadOnly):
        dcache.claim_batch_targets(1)
    dcache.open_db(pg)
    assert db.execute_sql("SELECT id, version FROM sift_schema").fetchall() == [(0, SCHEMA_VERSION)]
    assert claim_indexes() == {"batch_job_claim", "batch_job_live_lease"}
    assert [(t.job_id, t.idx) for t in dcache.claim_batch_targets(5, now=9)] == [("job-1", 0), ("job-1", 1)]
    assert dcache.batch_nbytes() == 5
    dcache.open_db(pg, readonly=True)  # now current: a read-only open works


@pytest.mark.slow
def test_opening_a_version_3_store_fills_in_the_hosts(pg: str) -> None:
    """Version 4's upgrade, in one transaction: the host column, every stored target's host computed from
    its URL in chunks (more targets than one chunk here), the ring's indexes and cursor; claims then work."""
    from sift.dcache.hosts import BACKFILL_CHUNK

    count = BACKFILL_CHUNK + 7 - (BACKFILL_CHUNK + 7) % 3  # a third of them on each host
    urls = [f"https://H{i % 3}.Example:80/{i}" for i in range(count)]
    targets = [dcache.BatchTarget(idx=i, url=url, options="{}") for i, url in enumerate(urls)]
    dcache.create_batch_job(make_job("job-1", targets_total=count), targets)
    make_version_3(pg)
    dcache.open_db(pg, readonly=True)  # a version 3 store reads as it is; its check skips the hosts
    assert dcache.batch_job("job-1") is not None
    assert {v.kind for v in dcache.check_store().violations} == {"schema_version", "schema"}
    dcache.open_db(pg)
    assert db.execute_sql("SELECT id, version FROM sift_schema").fetchall() == [(0, SCHEMA_VERSION)]
    hosts = db.execute_sql("SELECT host, COUNT(*) FROM batch_target GROUP BY host ORDER BY host").fetchall()
    assert hosts == [(f"h{i}.example", count // 3) for i in range(3)]
    assert dcache.check_store().ok
    assert len(dcache.claim_batch_targets(10, per_host=2, now=9)) == 6


def test_opening_a_version_4_store_drops_its_index_of_pending_targets_by_idx(pg: str) -> None:
    """Version 5's upgrade: claims read batch_target_host alone, so version 4's index of pending targets by
    idx goes; a read-only open reads the version 4 store as it is, hosts and all."""
    urls = ["https://b.example/0", "https://a.example/1", "https://b.example/2", "https://a.example/3"]
    targets = [dcache.BatchTarget(idx=i, url=url, options="{}") for i, url in enumerate(urls)]
    dcache.create_batch_job(make_job("job-1", targets_total=4), targets)
    make_version_4(pg)
    dcache.open_db(pg, readonly=True)
    assert {v.kind for v in dcache.check_store().violations} == {"schema_version"}
    assert db.execute_sql("SELECT 1 FROM pg_indexes WHERE indexname = 'batch_target_pending'").fetchall()
    dcache.open_db(pg)
    assert db.execute_sql("SELECT id, version FROM sift_schema").fetchall() == [(0, SCHEMA_VERSION)]
    assert not db.execute_sql("SELECT 1 FROM pg_indexes WHERE indexname = 'batch_target_pending'").fetchall()
    assert dcache.check_store().ok
    claimed = dcache.claim_batch_targets(3, now=9)
    assert [(t.job_id, t.idx) for t in claimed] == [("job-1", 1), ("job-1", 3), ("job-1", 0)]


def test_opening_a_version_10_store_makes_the_claims_function(pg: str) -> None:
    """Version 11's upgrade: the claim's server function. A read-only open reads the version 10 store as it
    is, its check naming the function missing; the first writable open makes it, and claims work."""
    dcache.create_batch_job(make_job("job-1", targets_total=2), make_targets(2))
    db.execute_sql("DROP FUNCTION sift_claim_batch")
    db.execute_sql("UPDATE sift_schema SET version = 10")
    dcache.close_db()
    dcache.open_db(pg, readonly=True)
    assert {v.kind for v in dcache.check_store().violations} == {"schema_version", "schema"}
    assert [t.status for t in dcache.batch_targets("job-1") or []] == ["pending", "pending"]
    with pytest.raises(dcache.StoreReadOnly):
        dcache.claim_batch_targets(1)
    dcache.open_db(pg)
    assert db.execute_sql("SELECT id, version FROM sift_schema").fetchall() == [(0, SCHEMA_VERSION)]
    assert dcache.check_store().ok
    claimed = dcache.claim_batch_targets(5, runner="r", now=9)
    assert [(t.job_id, t.idx, t.runner, t.attempts) for t in claimed] == [
        ("job-1", 0, "r", 1),
        ("job-1", 1, "r", 1),
    ]


@pytest.mark.slow
def test_eight_processes_open_a_version_1_store_at_once(pg: str) -> None:
    make_version_1(pg)
    assert open_from_8_processes(pg) == ["ok"] * 8
    dcache.open_db(pg)
    assert db.execute_sql("SELECT id, version FROM sift_schema").fetchall() == [(0, SCHEMA_VERSION)]
    assert claim_indexes() == {"batch_job_claim", "batch_job_live_lease"}
    assert db.execute_sql("SELECT COUNT(*) FROM batch_job").fetchone()[0] == 8


def test_a_newer_schema_version_is_refused(pg: str) -> None:
    db.execute_sql(f"UPDATE sift_schema SET version = {SCHEMA_VERSION + 1}")
    newer = rf"schema version {SCHEMA_VERSION + 1}; this sift knows version {SCHEMA_VERSION}$"
    with pytest.raises(dcache.StoreUnavailable, match=newer):
        dcache.open_db(pg)
    dcache.close_db()
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:  # leave the worker's schema current
        conn.execute(f"UPDATE {pg.rsplit('=', 1)[1]}.sift_schema SET version = {SCHEMA_VERSION}")


def test_columns_are_bigint_and_options_json(pg: str) -> None:
    types = dict(
        db.execute_sql(
            "SELECT table_name || '.' || column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name IN ('batch_job', 'batch_target')"
        ).fetchall()
    )
    ints = {name for name, kind in types.items() if kind in ("integer", "bigint", "smallint")}
    assert ints and all(types[name] == "bigint" for name in ints)
    assert types["batch_target.options"] == "json"


def test_largest_int_and_options_text_round_trip(pg: str) -> None:
    big = 2**63 - 1
    options = '{"b": 1,  "a":2, "a":3, "s":"\\u0000é"}'  # jsonb would rewrite this; json keeps it
    stored_job(make_job("job-1", lease=big, created_at=big, targets_total=big), nbytes=big)  # nbytes by SQL
    dcache.put_batch_targets("job-1", [dcache.BatchTarget(idx=0, url="u", options=options)])
    job = dcache.batch_job("job-1")
    assert job is not None and (job.lease, job.created_at, job.targets_total, job.nbytes) == (big,) * 4
    targets = dcache.batch_targets("job-1")
    assert targets is not None and targets[0].options == options
    assert dcache.batch_nbytes() == big


def test_byte_total_spreads_over_slots_and_sums(pg: str) -> None:
    dcache.create_batch_job(make_job("job-1", targets_total=2), make_targets(2))
    dcache.update_batch_target("job-1", 0, "done", result="é" * 10, now=5)
    assert dcache.batch_nbytes() == 20
    assert db.execute_sql("SELECT SUM(nbytes) FROM batch_totals").fetchone()[0] == 20


# -- Driver errors by SQLSTATE --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sqlstate", "error"),
    [
        ("40P01", dcache.StoreConflict),
        ("40001", dcache.StoreConflict),
        ("53100", dcache.StoreFull),
        ("57P01", dcache.StoreUnavailable),
        ("08006", dcache.StoreUnavailable),
        ("XX001", dcache.StoreCorrupt),
        ("25006", dcache.StoreReadOnly),
        ("55P03", dcache.StoreUnavailable),
    ],
)
def test_server_errors_become_package_errors(pg: str, sqlstate: str, error: type[Exception]) -> None:
    raise_it = f"DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '{sqlstate}'; END $$"
    with pytest.raises(error) as info:
        db.backend.run_sql(raise_it, ())
    assert type(info.value) is error
    assert str(info.value).startswith("database: ")
    assert getattr(info.value.__cause__, "sqlstate", None) == sqlstate


def _conflicts(times: int) -> Any:
    """A write_target_run (a run of a call's writes, in its transaction) that meets a deadlock the first
    ``times`` calls."""
    calls = {"n": 0}
    original = db.backend.write_target_run

    def write_target_run(*args: Any) -> bool:
        calls["n"] += 1
        if calls["n"] <= times:
            db.backend.run_sql("DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$", ())
        return original(*args)

    return write_target_run, calls


def _conflicting_writes(times: int) -> Any:
    """A write_targets (a call's writes in one statement) that meets a deadlock the first ``times`` calls."""
    calls = {"n": 0}
    original = db.backend.write_targets

    def write_targets(*args: Any) -> bool:
        calls["n"] += 1
        if calls["n"] <= times:
            db.backend.run_sql("DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$", ())
        return original(*args)

    return write_targets, calls


@pytest.mark.parametrize("path", ["one statement", "in a transaction"])
def test_a_deadlock_is_retried_and_counts_once(pg: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    if path == "one statement":
        write_targets, calls = _conflicting_writes(CONFLICT_RETRIES)
        monkeypatch.setattr(db.backend, "write_targets", write_targets)
    else:
        monkeypatch.setattr(db.backend, "write_targets", lambda *args: False)
        write_target_run, calls = _conflicts(CONFLICT_RETRIES)
        monkeypatch.setattr(db.backend, "write_target_run", write_target_run)
    dcache.update_batch_target("job-1", 0, "done", result="abc", now=5)
    assert calls["n"] == CONFLICT_RETRIES + 1
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes) == (1, 3)


@pytest.mark.parametrize("path", ["one statement", "in a transaction"])
def test_a_deadlock_past_the_retries_is_store_conflict(
    pg: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    if path == "one statement":
        write_targets, calls = _conflicting_writes(CONFLICT_RETRIES + 1)
        monkeypatch.setattr(db.backend, "write_targets", write_targets)
    else:
        monkeypatch.setattr(db.backend, "write_targets", lambda *args: False)
        write_target_run, calls = _conflicts(CONFLICT_RETRIES + 1)
        monkeypatch.setattr(db.backend, "write_target_run", write_target_run)
    before = snapshot()
    with pytest.raises(dcache.StoreConflict) as info:
        dcache.update_batch_target("job-1", 0, "done", result="abc", now=5)
    assert isinstance(info.value, dcache.StoreUnavailable)
    assert calls["n"] == CONFLICT_RETRIES + 1
    assert snapshot() == before


def test_no_retry_inside_a_callers_transaction(pg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    write_target_run, calls = _conflicts(1)
    monkeypatch.setattr(db.backend, "write_target_run", write_target_run)
    with pytest.raises(dcache.StoreConflict), db.atomic():
        dcache.update_batch_target("job-1", 0, "done", result="abc", now=5)
    assert calls["n"] == 1


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
def test_renew_skips_a_claim_whose_row_another_transaction_holds_and_waits_for_none(
    pg: str, postgres_schema: str
) -> None:
    """Target 1's row is held by another session (a write ending its claim, say): the renewal renews the
    runner's other claims at once, and leaves that one as it was; it never waits for a row, and so never
    deadlocks with a write of many of the runner's targets, which locks them in its own order."""
    dcache.create_batch_job(make_job("job-1", targets_total=3), make_targets(3))
    dcache.claim_batch_targets(3, runner="r1", now=1_000)
    renewed: list[int] = []
    renewal = threading.Thread(
        target=lambda: renewed.append(dcache.renew_claims("r1", now=2_000)), daemon=True
    )
    with psycopg.connect(POSTGRES_URL) as other:
        other.execute(f'SET search_path TO "{postgres_schema}"')
        other.execute("SELECT 1 FROM batch_target WHERE job_id = 'job-1' AND idx = 1 FOR UPDATE")
        renewal.start()
        renewal.join(60)  # a renewal that waited for the row would wait until the rollback below
        waited = renewal.is_alive()
        other.rollback()
    renewal.join()
    assert not waited and renewed == [2]
    assert [(t.status, t.runner, t.heartbeat) for t in dcache.batch_targets("job-1") or []] == [
        ("running", "r1", 2_000),
        ("running", "r1", 1_000),
        ("running", "r1", 2_000),
    ]
    assert dcache.renew_claims("r1", now=2_001) == 3  # the row let go of: renewed again


class _FirstRunDeadlocks:
    """A statement whose first run meets a deadlock (its transaction fails, to be run again); its later runs
    are the statement's own."""

    def __init__(self, statement: Any) -> None:
        self.statement, self.runs = statement, 0

    def run(self, **params: Any) -> Any:
        self.runs += 1
        if self.runs == 1:
            db.backend.run_sql("DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$", ())
        return self.statement.run(**params)


@pytest.mark.slow  # the fast lane holds at most 4,000 cases
@pytest.mark.parametrize("call", ["update_batch_targets", "retry_batch_targets", "submit"])
def test_a_call_given_a_generator_runs_only_its_transaction_again_after_a_deadlock(
    pg: str, call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generator is read once: the transaction run again writes every entry, not none."""
    dcache.create_batch_job(make_job("job-1", targets_total=3), make_targets(3))
    dcache.claim_batch_targets(3, runner="r1", now=5)
    if call == "update_batch_targets":
        write_targets, calls = _conflicting_writes(1)
        monkeypatch.setattr(db.backend, "write_targets", write_targets)
        results = ({"idx": idx, "status": "done", "result": "abc"} for idx in range(3))
        assert dcache.update_batch_targets("job-1", results, runner="r1", now=6) == 3
        job = dcache.batch_job("job-1")
        assert job is not None and (job.targets_done, job.nbytes) == (3, 9)
        assert calls["n"] == 2
    elif call == "retry_batch_targets":
        lease = _FirstRunDeadlocks(retries._LEASE_RETRIED)
        monkeypatch.setattr(retries, "_LEASE_RETRIED", lease)
        put_back = ({"idx": idx, "error": "busy"} for idx in range(3))
        assert dcache.retry_batch_targets("job-1", put_back, runner="r1", now=6) == 3
        targets = dcache.batch_targets("job-1") or []
        assert [(t.status, t.error, t.runner) for t in targets] == [("pending", "busy", None)] * 3
        assert lease.runs == 2
    else:
        runs = {"n": 0}
        lock_key = db.backend.lock_key

        def deadlocks_first(caller: str, idem_key: str) -> None:
            runs["n"] += 1
            if runs["n"] == 1:
                db.backend.run_sql(
                    "DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$", ()
                )
            lock_key(caller, idem_key)

        monkeypatch.setattr(db.backend, "lock_key", deadlocks_first)
        urls = (f"https://example.com/{idx}" for idx in range(2))
        job_id, created = dcache.submit("caller-1", urls, idem_key="key-1", now=6)
        assert created
        assert [t.url for t in dcache.batch_targets(job_id) or []] == [
            f"https://example.com/{i}" for i in range(2)
        ]
        assert runs["n"] == 2
    assert dcache.check_store().ok


# -- Connections ----------------------------------------------------------------------------------------


def test_a_broken_connection_fails_one_call_and_the_next_reconnects(pg: str) -> None:
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    pid = db.execute_sql("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(dcache.StoreUnavailable) as info:
        dcache.update_batch_target("job-1", 0, "done", result="abc", now=5)
    assert isinstance(info.value.__cause__, psycopg.Error)
    dcache.update_batch_target("job-1", 0, "done", result="abc", now=5)
    assert db.execute_sql("SELECT pg_backend_pid()").fetchone()[0] != pid
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes) == (1, 3)


def test_threads_in_transactions_get_their_own_connections(pg: str) -> None:
    import threading

    pids: list[int] = []
    together = threading.Barrier(4)

    def work() -> None:
        with db.atomic():
            pids.append(db.execute_sql("SELECT pg_backend_pid()").fetchone()[0])
            together.wait(timeout=30)  # all four hold their connections at once

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(pids)) == 4


def test_calls_from_many_threads_run_as_prepared_statements(postgres_schema: str) -> None:
    """8 threads share 2 pooled connections, each thread taking one per call: past psycopg's
    prepare_threshold on each connection, every call runs the statement prepared there."""
    import threading

    dcache.open_db(postgres_target(postgres_schema), max_connections=2)
    db.execute_sql("TRUNCATE batch_job, batch_target")
    dcache.create_batch_job(make_job("job-1"), make_targets(3))
    threads, calls = 8, 30

    def work() -> None:
        for _ in range(calls):
            assert dcache.batch_job("job-1") is not None

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    prepared: list[int] = []
    together = threading.Barrier(2)

    def count() -> None:  # each of the two, inside a transaction, is on a connection of its own
        with db.atomic():
            together.wait(timeout=30)
            threshold = db.connection().prepare_threshold
            (runs,) = db.execute_sql(
                "SELECT COALESCE(SUM(generic_plans + custom_plans), 0) FROM pg_prepared_statements "
                "WHERE statement LIKE %s",
                ('%FROM "batch_job"%',),
            ).fetchone()
            prepared.append(int(runs))
            db.close()
        assert threshold is not None
        prepared.append(-threshold)

    counters = [threading.Thread(target=count) for _ in range(2)]
    for thread in counters:
        thread.start()
    for thread in counters:
        thread.join()
    runs = sum(n for n in prepared if n >= 0)
    threshold = -min(prepared)
    assert len(prepared) == 4
    # At most `threshold` plain runs on each connection before psycopg prepares the statement there.
    assert threads * calls - 2 * threshold <= runs <= threads * calls, prepared
    dcache.close_db()


@pytest.mark.slow
def test_ended_threads_give_their_connections_back(postgres_schema: str) -> None:
    """A thread that ends holding a connection (db.connect() without db.close()) gives it back."""
    import gc
    import threading

    dcache.open_db(postgres_target(postgres_schema), max_connections=2, timeout=1)
    failures: list[BaseException] = []

    def work() -> None:
        try:
            db.connect()
            dcache.batch_job("x")
        except BaseException as exc:
            failures.append(exc)

    for _ in range(6):  # more threads than connections, one after another
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        gc.collect()
    assert failures == []
    dcache.close_db()


@pytest.mark.slow
def test_an_exhausted_pool_is_store_unavailable(
    postgres_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import threading

    caplog.set_level(logging.INFO, logger="sift.dcache.pool")

    dcache.open_db(postgres_target(postgres_schema), max_connections=1, timeout=1)
    failures: list[BaseException] = []

    def other() -> None:
        try:
            dcache.batch_job("x")
        except BaseException as exc:
            failures.append(exc)

    with db.atomic():  # this thread holds the one connection until the transaction ends
        dcache.batch_job("x")
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert len(failures) == 1 and isinstance(failures[0], dcache.StoreUnavailable), failures
    assert "max_connections" in str(failures[0])
    waits = [record.getMessage() for record in caplog.records if record.name == "sift.dcache.pool"]
    assert len(waits) == 1 and "all 1 pooled connections" in waits[0] and "max_connections" in waits[0]
    thread = threading.Thread(target=other)  # the transaction ended: its connection serves the next call
    thread.start()
    thread.join()
    assert len(failures) == 1
    dcache.close_db()


def _child_uses_the_store(target: str, results: Any) -> None:
    results.put(dcache.batch_job("job-1") is not None)
    dcache.create_batch_job(make_job("from-child"))
    results.put(db.execute_sql("SELECT pg_backend_pid()").fetchone()[0])


def test_a_forked_child_never_uses_the_parents_connection(pg: str) -> None:
    dcache.create_batch_job(make_job("job-1"))
    pid = db.execute_sql("SELECT pg_backend_pid()").fetchone()[0]
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    child = fork.Process(target=_child_uses_the_store, args=(pg, results))
    child.start()
    assert results.get(timeout=60) is True
    assert results.get(timeout=60) != pid  # the child's own session
    child.join(timeout=60)
    assert child.exitcode == 0
    # The parent's session survived the child's use and exit.
    assert db.execute_sql("SELECT pg_backend_pid()").fetchone()[0] == pid
    assert dcache.batch_job("from-child") is not None


def test_read_only_open_reads_and_refuses_writes(pg: str) -> None:
    dcache.create_batch_job(make_job("job-1"))
    dcache.open_db(pg, readonly=True)
    assert dcache.batch_job("job-1") is not None
    before = snapshot()
    with pytest.raises(dcache.StoreReadOnly):
        dcache.touch_batch_job("job-1", now=5)
    with pytest.raises(dcache.StoreReadOnly):
        db.execute_sql("DELETE FROM batch_job")
    assert snapshot() == before


def test_read_only_sweep_and_evict_with_nothing_to_do_only_read(pg: str) -> None:
    dcache.create_batch_job(make_job("job-1", status="done", lease=100, nbytes=0))
    dcache.open_db(pg, readonly=True)
    before = snapshot()
    assert dcache.sweep_batch(10, now=105) == 0  # nothing due: one read, no lock, no write
    assert dcache.evict_batch_oldest(0) == 0  # within budget
    with pytest.raises(dcache.StoreReadOnly):
        dcache.sweep_batch(10, now=110)
    assert snapshot() == before


def test_read_only_open_of_a_missing_store_is_refused(fresh_schema: str) -> None:
    with pytest.raises(dcache.StoreUnavailable, match="no batch store"):
        dcache.open_db(postgres_target(fresh_schema), readonly=True)


# -- A client killed mid-transaction --------------------------------------------------------------------


def _killed_mid_transaction(target: str, inside: Any) -> None:
    import time

    dcache.open_db(target)
    with db.atomic():
        dcache.update_batch_target("job-1", 0, "done", result="partial", now=7)  # holds job and target
        dcache.submit_batch_job(make_job("job-2", idem_key="k"), make_targets(3), 60, now=7)  # holds the key
        inside.set()
        time.sleep(120)  # SIGKILLed here


def test_a_client_killed_mid_transaction_leaves_nothing_and_no_lock(pg: str) -> None:
    import signal

    dcache.create_batch_job(make_job("job-1", status="running", lease=5), make_targets(3))
    before = snapshot()
    inside = ctx.Event()
    child = ctx.Process(target=_killed_mid_transaction, args=(pg, inside))
    child.start()
    assert inside.wait(timeout=60)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    assert snapshot() == before  # nothing of the killed transaction
    # Its locks went with it: the same target, job and key can be written at once.
    dcache.update_batch_target("job-1", 0, "done", result="whole", now=8)
    assert dcache.submit_batch_job(make_job("job-3", idem_key="k"), None, 60, now=8) == ("job-3", True)
    job = dcache.batch_job("job-1")
    assert job is not None and (job.targets_done, job.nbytes) == (1, 5)
    assert dcache.batch_nbytes() == 5


# -- SQLite file housekeeping: refused on PostgreSQL, and left out of sweep, eviction and metrics ----------


@pytest.mark.parametrize(
    "call",
    [
        lambda tmp: dcache.store_space(),
        lambda tmp: dcache.vacuum_store(),
    ],
    ids=["store_space", "vacuum_store"],
)
def test_file_housekeeping_is_refused(pg: str, tmp_path: Path, call: Any) -> None:
    dcache.create_batch_job(make_job("job-1"))
    before = snapshot()
    with pytest.raises(dcache.StoreUnavailable, match="PostgreSQL"):
        call(tmp_path)
    assert snapshot() == before
    assert list(tmp_path.iterdir()) == []


def test_metrics_replace_the_file_gauges_with_table_bytes(pg: str) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from sift.dcache.metrics import register

    create_partial(make_job("job-1", status="running"), make_targets(1))
    dcache.update_batch_target("job-1", 0, "done", result="abcd", now=5)
    registry = CollectorRegistry()
    register(registry)
    text = generate_latest(registry).decode()
    assert "sift_batch_nbytes 4.0" in text and "sift_live_batch_jobs 1.0" in text
    assert "sift_store_file_bytes" not in text and "sift_store_reclaimable_bytes" not in text
    (table_bytes,) = [line for line in text.splitlines() if line.startswith("sift_store_table_bytes ")]
    assert float(table_bytes.split()[1]) == dcache.relation_space().total_bytes > 0


# -- Peewee's idioms from 8 threads (tests/test_idioms.py's, each thread on its own connection) ----------

IDIOM_USES = 100


@pytest.mark.slow
@pytest.mark.parametrize(
    "idiom", ["flask-hooks", "reuse-if-open", "with-db", "connection-context", "atomic", "session"]
)
def test_idiom_from_8_threads(pg: str, idiom: str) -> None:
    from test_idioms import IDIOMS, THREADS, run_threads

    for t in range(THREADS):
        dcache.create_batch_job(make_job(f"job-{t}", targets_total=IDIOM_USES), make_targets(IDIOM_USES))
    use = IDIOMS[idiom]
    pids: list[int] = []

    def work(t: int) -> None:
        pids.append(db.execute_sql("SELECT pg_backend_pid()").fetchone()[0])
        job_id = f"job-{t}"
        for i in range(IDIOM_USES):
            with use(Path(pg)):  # only open-per-request reads its argument, and it is not run here
                dcache.update_batch_target(job_id, i, "done", result="é" * (i % 7), now=2_000 + i)
                job = dcache.BatchJob.get_by_id(job_id)  # an ad-hoc model read inside the same use
                assert job.targets_done >= i + 1
                assert (
                    dcache.BatchTarget.select().where(dcache.BatchTarget.job_id == job_id).count()
                    == IDIOM_USES
                )

    assert run_threads(work) == []
    assert not db.in_transaction()
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:  # no session of ours left in a transaction
        left = admin.execute(
            "SELECT COUNT(*) FROM pg_stat_activity "
            "WHERE pid = ANY(%s) AND state LIKE 'idle in transaction%%'",
            (pids,),
        ).fetchone()
    assert left == (0,)
    rows = db.execute_sql(
        "SELECT j.id, j.targets_done, j.nbytes, (SELECT COUNT(*) FROM batch_target t "
        "WHERE t.job_id = j.id AND t.status = 'done') FROM batch_job j"
    ).fetchall()
    expected = (IDIOM_USES, sum(2 * (i % 7) for i in range(IDIOM_USES)), IDIOM_USES)
    assert {row[0]: tuple(row[1:]) for row in rows} == {f"job-{t}": expected for t in range(THREADS)}
    assert dcache.batch_nbytes() == THREADS * expected[1]
