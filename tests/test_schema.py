"""The schema: the issue's DDL, files written by other programs, pragmas and the database lifecycle."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from helpers import create_partial, job_with_bytes, make_job, make_targets

from sift import dcache
from sift.dcache.tables import CLAIM_COLUMNS, SCHEMA_VERSION

# The DDL, verbatim.
DDL = """
CREATE TABLE IF NOT EXISTS batch_job (
    id TEXT PRIMARY KEY, caller TEXT NOT NULL, caller_class TEXT NOT NULL, idem_key TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', targets_total INTEGER NOT NULL,
    targets_done INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, lease INTEGER NOT NULL,
    nbytes INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS batch_target (
    job_id TEXT NOT NULL, idx INTEGER NOT NULL, url TEXT NOT NULL, options TEXT NOT NULL,
    status TEXT NOT NULL, result TEXT, error TEXT, hint TEXT, PRIMARY KEY (job_id, idx));
CREATE INDEX IF NOT EXISTS batch_job_idem  ON batch_job(caller, idem_key);
CREATE INDEX IF NOT EXISTS batch_job_lease ON batch_job(lease);
"""

TABLES = ("batch_job", "batch_target")


def ddl_file(path: Path, statements: str = "") -> Path:
    """A file made by plain sqlite3 with exactly the DDL, as another program would, and ``statements``."""
    conn = sqlite3.connect(path)
    conn.executescript(DDL + statements)
    conn.commit()
    conn.close()
    return path


def describe(path: Path) -> dict[str, Any]:
    """Columns of both tables, and every index on them with its columns, read by plain sqlite3."""
    conn = sqlite3.connect(path)
    try:
        out: dict[str, Any] = {}
        for table in TABLES:
            out[f"columns:{table}"] = conn.execute(f"PRAGMA table_info({table})").fetchall()
            for _seq, name, unique, origin, partial in conn.execute(f"PRAGMA index_list({table})"):
                out[f"index:{table}:{name}"] = (
                    unique,
                    origin,
                    partial,
                    conn.execute(f'PRAGMA index_info("{name}")').fetchall(),
                    conn.execute(f'PRAGMA index_xinfo("{name}")').fetchall(),
                )
        return out
    finally:
        conn.close()


def schema_objects(path: Path) -> set[tuple[str, str]]:
    conn = sqlite3.connect(path)
    try:
        return set(conn.execute("SELECT type, name FROM sqlite_master"))
    finally:
        conn.close()


def test_package_schema_matches_ddl_column_for_column(tmp_path: Path) -> None:
    reference = describe(ddl_file(tmp_path / "ddl.db"))
    dcache.open_db(tmp_path / "package.db")
    dcache.close_db()
    made = describe(tmp_path / "package.db")
    # Every column of both tables: name, type, NOT NULL, SQL-side default, primary key position; the
    # targets' claim columns, host and not_before follow the DDL's, each with a SQL-side default (or NULL).
    assert made["columns:batch_job"] == reference["columns:batch_job"]
    assert made["columns:batch_target"] == reference["columns:batch_target"] + [
        (8, "runner", "TEXT", 0, None, 0),
        (9, "heartbeat", "INTEGER", 0, None, 0),
        (10, "attempts", "INTEGER", 1, "0", 0),
        (11, "host", "TEXT", 1, "''", 0),
        (12, "not_before", "INTEGER", 0, None, 0),
    ]
    # Every index of the DDL (the two named ones and both primary keys) with the same name and columns.
    assert {k for k in reference if k.startswith("index:")} == {
        "index:batch_job:batch_job_idem",
        "index:batch_job:batch_job_lease",
        "index:batch_job:sqlite_autoindex_batch_job_1",
        "index:batch_target:sqlite_autoindex_batch_target_1",
    }
    for key, value in reference.items():
        if key.startswith("index:"):
            assert made.get(key) == value, key


def test_package_adds_its_speed_schema(tmp_path: Path) -> None:
    dcache.open_db(tmp_path / "package.db")
    dcache.close_db()
    objects = schema_objects(tmp_path / "package.db")
    assert ("index", "batch_job_live") in objects
    assert ("index", "batch_job_evictable") in objects
    assert ("index", "batch_job_claim") in objects
    assert ("index", "batch_target_host") in objects
    assert ("index", "batch_job_live_lease") not in objects  # retired: every result write moved it
    assert ("index", "batch_target_pending") not in objects  # retired: claims read batch_target_host
    assert ("table", "batch_totals") in objects


def test_a_new_files_schema_is_what_open_db_makes(tmp_path: Path) -> None:
    """NEW_FILE_SCHEMA (what a copy written from scratch runs, as a PostgreSQL store's backup) makes the
    tables, columns, indexes and triggers a new store's open makes, with the same text, and its version."""
    from sift.dcache.backends.sqlite.schema import NEW_FILE_SCHEMA

    dcache.open_db(tmp_path / "package.db")
    dcache.close_db()
    with closing(sqlite3.connect(tmp_path / "copy.db")) as conn:
        for statement in NEW_FILE_SCHEMA:
            conn.execute(statement)
        conn.commit()
    assert describe(tmp_path / "copy.db") == describe(tmp_path / "package.db")
    master = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name"
    with (
        closing(sqlite3.connect(tmp_path / "copy.db")) as copy,
        closing(sqlite3.connect(tmp_path / "package.db")) as made,
    ):
        assert copy.execute(master).fetchall() == made.execute(master).fetchall()
        version = "PRAGMA user_version"
        assert copy.execute(version).fetchone() == made.execute(version).fetchone() == (SCHEMA_VERSION,)


#: Every index of a store: the original DDL's two, then sift's own.
INDEXES = [
    "batch_job_idem",
    "batch_job_lease",
    "batch_job_claim",
    "batch_job_evictable",
    "batch_job_live",
    "batch_job_ring",
    "batch_target_host",
    "batch_target_running",
    "batch_target_delayed",
    "batch_target_pending_host",
]


def test_the_indexes_are_these(tmp_path: Path) -> None:
    dcache.open_db(tmp_path / "package.db")
    dcache.close_db()
    made = {name for kind, name in schema_objects(tmp_path / "package.db") if kind == "index"}
    assert {name for name in made if not name.startswith("sqlite_autoindex")} == set(INDEXES)


@pytest.mark.parametrize("index", INDEXES)
def test_a_writable_open_makes_again_an_index_another_program_dropped(tmp_path: Path, index: str) -> None:
    path = tmp_path / "package.db"
    dcache.open_db(path)
    dcache.close_db()
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"DROP INDEX {index}")
        conn.commit()
    assert ("index", index) not in schema_objects(path)
    dcache.open_db(path)
    dcache.close_db()
    assert ("index", index) in schema_objects(path)


def test_models_are_named_after_the_columns(tmp_path: Path) -> None:
    conn = sqlite3.connect(ddl_file(tmp_path / "ddl.db"))
    for model, table in ((dcache.BatchJob, "batch_job"), (dcache.BatchTarget, "batch_target")):
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        assert model._meta.table_name == table
        claims = set(CLAIM_COLUMNS) if model is dcache.BatchTarget else set()
        assert {f.column_name for f in model._meta.sorted_fields} == columns | claims
        # every column is a model attribute of its own name (BatchTarget.job_id is the id of the job FK)
        assert {getattr(model, column).column_name for column in columns} == columns
    conn.close()


def test_ddl_file_works_with_the_package(tmp_path: Path) -> None:
    path = ddl_file(tmp_path / "ddl.db")
    dcache.open_db(path)
    try:
        create_partial(make_job("job-1", idem_key="k"), make_targets(2))
        dcache.put_batch_targets("job-1", make_targets(1, start=2))
        dcache.update_batch_target("job-1", 1, "done", result="ab€", now=2_000)
        dcache.set_batch_job_status("job-1", "running", now=2_001)
        job = dcache.batch_job("job-1")
        assert job is not None
        assert (job.status, job.targets_done, job.nbytes, job.lease) == ("running", 1, 5, 2_001)
        targets = dcache.batch_targets("job-1")
        assert targets is not None
        assert [(t.idx, t.status, t.result) for t in targets] == [
            (0, "pending", None),
            (1, "done", "ab€"),
            (2, "pending", None),
        ]
        assert dcache.batch_job_by_idem("alice", "k", 100, now=2_050) == "job-1"
        assert dcache.live_batch_jobs("alice") == 1
        assert dcache.batch_nbytes() == 5
        dcache.set_batch_job_status("job-1", "done", now=2_002)
        assert dcache.evict_batch_oldest(0) == 1
        assert dcache.batch_nbytes() == 0
    finally:
        dcache.close_db()
    # What the package wrote is plain rows in the original tables, readable by any other program.
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM batch_job").fetchone() == (0,)
    assert conn.execute("SELECT COUNT(*) FROM batch_target").fetchone() == (0,)
    conn.close()


EXISTING_ROWS = """
INSERT INTO batch_job VALUES ('old-1', 'alice', 'fleet', 'k1', 'done', '', 2, 2, 100, 100, 7);
INSERT INTO batch_job VALUES ('old-2', 'bob', 'restricted', '', 'partial', 'x', 1, 1, 200, 200, 1000);
INSERT INTO batch_job VALUES ('old-3', 'alice', 'fleet', '', 'running', '', 2, 1, 300, 300, 3);
INSERT INTO batch_job (id, caller, caller_class, idem_key, status, targets_total, created_at, lease)
    VALUES ('old-4', 'carol', 'fleet', '', 'queued', 1, 400, 400);
INSERT INTO batch_target VALUES ('old-1', 0, 'u0', '{}', 'done', 'abcd', NULL, NULL);
INSERT INTO batch_target VALUES ('old-1', 1, 'u1', '{}', 'done', 'xyz', NULL, NULL);
INSERT INTO batch_target VALUES ('old-3', 0, 'u0', '{}', 'done', 'abc', NULL, NULL);
INSERT INTO batch_target VALUES ('old-3', 1, 'u1', '{}', 'pending', NULL, NULL, NULL);
"""


def test_existing_rows_get_the_running_total_on_open(tmp_path: Path) -> None:
    path = ddl_file(tmp_path / "ddl.db", EXISTING_ROWS)
    dcache.open_db(path)
    try:
        assert dcache.batch_nbytes() == 7 + 1000 + 3
        job = dcache.batch_job("old-4")
        assert job is not None and (job.error, job.targets_done, job.nbytes) == ("", 0, 0)
        # The rules continue from the stored counts.
        dcache.update_batch_target("old-3", 1, "done", result="éé", now=500)
        dcache.update_batch_target("old-3", 0, "done", result="a", now=501)
        job = dcache.batch_job("old-3")
        assert job is not None and (job.targets_done, job.nbytes, job.lease) == (2, 4 + 1, 501)
        assert dcache.batch_nbytes() == 7 + 1000 + 5
        assert dcache.evict_batch_oldest(1_005) == 1  # old-1 (lease 100) goes first
        assert dcache.batch_job("old-1") is None
        assert dcache.batch_nbytes() == 1_005
    finally:
        dcache.close_db()


def test_total_follows_rows_written_by_another_program(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path)
    job_with_bytes("mine", 10)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("INSERT INTO batch_job VALUES ('theirs', 'bob', 'fleet', '', 'done', '', 1, 1, 5, 5, 32)")
    assert dcache.batch_nbytes() == 42
    other.execute("UPDATE batch_job SET nbytes = 2 WHERE id = 'theirs'")
    assert dcache.batch_nbytes() == 12
    dcache.close_db()
    other.execute("INSERT INTO batch_job VALUES ('closed', 'bob', 'fleet', '', 'done', '', 1, 1, 5, 5, 100)")
    other.execute("DELETE FROM batch_job WHERE id = 'mine'")
    other.close()
    dcache.open_db(path)
    try:
        assert dcache.batch_nbytes() == 102
    finally:
        dcache.close_db()


def test_reopen_keeps_data_and_total(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path)
    job_with_bytes("a", 5)
    dcache.create_batch_job(make_job("b"), make_targets(3))
    dcache.update_batch_target("b", 2, "done", result="hello")
    dcache.open_db(path)
    try:
        assert dcache.batch_nbytes() == 10
        targets = dcache.batch_targets("b")
        assert targets is not None and [t.status for t in targets] == ["pending", "pending", "done"]
    finally:
        dcache.close_db()


def test_file_store_pragmas(file_store: Path) -> None:
    assert dcache.db.execute_sql("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert dcache.db.execute_sql("PRAGMA synchronous").fetchone()[0] == 1
    assert dcache.db.execute_sql("PRAGMA busy_timeout").fetchone()[0] >= 5_000
    # WAL is a property of the file: another program opening it sees it too.
    conn = sqlite3.connect(file_store)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_open_db_again_closes_the_previous_connection(tmp_path: Path) -> None:
    first = dcache.open_db(tmp_path / "a.db")
    conn = first.connection()
    dcache.open_db(tmp_path / "b.db")
    try:
        with pytest.raises(sqlite3.ProgrammingError):
            conn.execute("SELECT 1")
        dcache.create_batch_job(make_job("job-b"))
    finally:
        dcache.close_db()
    a = sqlite3.connect(tmp_path / "a.db")
    b = sqlite3.connect(tmp_path / "b.db")
    assert a.execute("SELECT id FROM batch_job").fetchall() == []
    assert b.execute("SELECT id FROM batch_job").fetchall() == [("job-b",)]
    a.close()
    b.close()


def test_close_db_twice_is_fine(tmp_path: Path) -> None:
    dcache.open_db(tmp_path / "store.db")
    dcache.close_db()
    assert dcache.db.is_closed()
    dcache.close_db()
    assert dcache.db.is_closed()


@pytest.mark.parametrize("where", ["memory", "file"])
def test_open_db_resets_stats(tmp_path: Path, where: str) -> None:
    path = ":memory:" if where == "memory" else tmp_path / "store.db"
    dcache.open_db(path)
    dcache.create_batch_job(make_job(), make_targets(3))
    dcache.batch_job("job-1")
    dcache.batch_job("nope")
    dcache.batch_targets("nope")
    dcache.batch_job_by_idem("alice", "k", 10)
    with pytest.raises(dcache.JobNotFound):
        dcache.touch_batch_job("nope")
    assert any(dcache.stats().values())
    dcache.open_db(path)
    try:
        values = dcache.stats()
        assert values and set(values.values()) == {0}
    finally:
        dcache.close_db()


def run_python(code: str, cwd: Path) -> Any:
    """Run ``code`` in a fresh interpreter in ``cwd``; it prints one JSON value, which is returned."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_every_function_before_open_db_raises_store_not_open(tmp_path: Path) -> None:
    code = """
        import json, sys
        sys.path.insert(0, HELPERS_DIR)
        from helpers import make_job, make_targets
        from sift import dcache
        calls = {
            "create_batch_job": lambda: dcache.create_batch_job(make_job()),
            "create_batch_job+targets": lambda: dcache.create_batch_job(make_job(), make_targets(1)),
            "batch_job": lambda: dcache.batch_job("job-1"),
            "batch_job_by_idem": lambda: dcache.batch_job_by_idem("alice", "k", 10, now=5),
            "live_batch_jobs": lambda: dcache.live_batch_jobs("alice"),
            "live_batch_jobs_total": lambda: dcache.live_batch_jobs_total(),
            "put_batch_targets": lambda: dcache.put_batch_targets("job-1", make_targets(1)),
            "batch_targets": lambda: dcache.batch_targets("job-1"),
            "update_batch_target": lambda: dcache.update_batch_target("job-1", 0, "done", now=5),
            "set_batch_job_status": lambda: dcache.set_batch_job_status("job-1", "done", now=5),
            "touch_batch_job": lambda: dcache.touch_batch_job("job-1", now=5),
            "sweep_batch": lambda: dcache.sweep_batch(10, now=5),
            "evict_batch_oldest": lambda: dcache.evict_batch_oldest(0),
            "mark_in_flight_failed": lambda: dcache.mark_in_flight_failed("restart", now=5),
            "claim_batch_targets": lambda: dcache.claim_batch_targets(5, now=5),
            "rescue_stale_jobs": lambda: dcache.rescue_stale_jobs(60, "host lost", now=5),
            "batch_nbytes": lambda: dcache.batch_nbytes(),
        }
        out = {}
        for name, call in calls.items():
            try:
                call()
                out[name] = "returned"
            except Exception as exc:
                out[name] = type(exc).__name__
        print(json.dumps(out))
    """.replace("HELPERS_DIR", repr(str(Path(__file__).parent)))
    out = run_python(code, tmp_path)
    assert out == dict.fromkeys(out, "StoreNotOpen")
    assert len(out) == 17
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "content",
    [
        b"this is not a sqlite database, just some text\n" * 200,
        b"SQLite format 3\x00" + b"\xff" * 4080,
        bytes(range(256)) * 32,
    ],
    ids=["text", "bad-header", "binary"],
)
def test_opening_a_non_sqlite_file_raises_store_unavailable(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "not-a-db"
    path.write_bytes(content)
    with pytest.raises(dcache.StoreUnavailable, match="path"):
        dcache.open_db(path)
    dcache.close_db()
    assert path.read_bytes() == content


def test_store_not_open_and_store_unavailable_are_batch_errors() -> None:
    assert issubclass(dcache.StoreNotOpen, dcache.BatchError)
    assert issubclass(dcache.StoreUnavailable, dcache.BatchError)


def test_import_pulls_in_only_peewee_and_opens_nothing(tmp_path: Path) -> None:
    # Peewee itself imports psycopg when it is installed (sift[postgres]); sift may add nothing to that.
    code = """
        import json, sys
        before = set(sys.modules)
        import peewee
        with_peewee = set(sys.modules)
        import sift.dcache
        new = {name.partition(".")[0] for name in set(sys.modules) - with_peewee}
        new |= {"peewee"} & {name.partition(".")[0] for name in with_peewee - before}
        stdlib = sys.stdlib_module_names
        third_party = sorted(n for n in new if n not in stdlib and n not in ("sift", "peewee"))
        heavy = [n for n in ("tqdm", "freezegun", "hypothesis", "pytest", "playhouse") if n in sys.modules]
        db = sift.dcache.db
        print(json.dumps({
            "third_party": third_party,
            "heavy": heavy,
            "peewee": "peewee" in sys.modules,
            "deferred": db.deferred,
            "closed": db.is_closed(),
        }))
    """
    out = run_python(code, tmp_path)
    assert out == {"third_party": [], "heavy": [], "peewee": True, "deferred": True, "closed": True}
    assert list(tmp_path.iterdir()) == []


def test_a_relative_path_is_the_same_file_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections made later (after close_db, for a checkpoint, for check_store's whole-file reads) open
    the file open_db opened, not one of the same name in the new working directory."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    dcache.open_db("store.db")
    try:
        dcache.create_batch_job(make_job("j", targets_total=0))
        monkeypatch.chdir(tmp_path / "b")
        assert dcache.check_store().ok
        dcache.close_db()
        assert dcache.batch_job("j") is not None  # reconnected to the same file
        assert repr(dcache.db) == "<SerializedSqliteDatabase 'store.db': open>"
    finally:
        dcache.close_db()
    assert list((tmp_path / "b").iterdir()) == []
