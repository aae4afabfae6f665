"""``sift simulate`` never changes a store holding jobs it did not make: by default it works on a new file of
its own, and a store named by ``--db`` or ``$SIFT_DB`` that holds jobs is refused and left byte-for-byte
unchanged, also when its jobs are only in the -wal file. On PostgreSQL it makes a schema of its own and
leaves every other schema as it was; a named schema holding jobs is refused, unchanged."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cli_helpers import EXPECTED, job_ids, populate, run, sift_script
from conftest import POSTGRES_URL, drop_schema, postgres_target
from helpers import make_job, make_targets
from test_cli_simulate import SMALL, independent_view

from sift import dcache

REFUSAL = (
    "already holds jobs; simulate runs only on a new or empty store, so it never changes real data "
    "(without --db and $SIFT_DB it makes a new file of its own)\n"
)


def files_of(path: Path) -> dict[str, bytes | None]:
    """The bytes of the store file and of its -wal file (None when there is none)."""
    found: dict[str, bytes | None] = {}
    for suffix in ("", "-wal"):
        candidate = Path(f"{path}{suffix}")
        found[suffix or "db"] = candidate.read_bytes() if candidate.exists() else None
    return found


def assert_unchanged(path: Path, before: dict[str, bytes | None]) -> None:
    after = files_of(path)
    assert after["db"] == before["db"]
    if before["-wal"] is not None:
        assert after["-wal"] == before["-wal"]
    else:  # a read-only open may leave SQLite's empty -wal file, never one with content
        assert after["-wal"] in (None, b"")


def jobs_in_main_file(path: Path) -> int:
    """Jobs in the main database file alone, ignoring any -wal file."""
    with closing(sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM batch_job").fetchone()[0])


@pytest.fixture(params=["in the file", "only in the wal"])
def populated(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A store holding jobs, made with the package: checkpointed into the file, or (while this process
    keeps its connection open) committed only to the -wal file."""
    path = tmp_path / "work" / "sift.db"
    path.parent.mkdir()
    if request.param == "in the file":
        populate(path)
        assert jobs_in_main_file(path) == len(EXPECTED)
        yield path
        return
    dcache.open_db(path)
    dcache.close_db()  # the schema, checkpointed; no job yet
    dcache.open_db(path)
    try:
        for n in range(3):
            dcache.create_batch_job(make_job(f"live-{n}", targets_total=2), make_targets(2))
        assert jobs_in_main_file(path) == 0 and Path(f"{path}-wal").stat().st_size > 0
        yield path
    finally:
        dcache.close_db()


def sift(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, with ``$SIFT_DB`` only if given and temporary files under cwd/tmp."""
    environ = {k: v for k, v in os.environ.items() if k != "SIFT_DB"}
    (cwd / "tmp").mkdir(exist_ok=True)
    environ.update(TMPDIR=str(cwd / "tmp"), **env)
    return subprocess.run(
        [str(sift_script()), *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
@pytest.mark.parametrize("named_by", ["--db", "$SIFT_DB"])
def test_a_named_store_holding_jobs_is_refused_and_unchanged(populated: Path, named_by: str) -> None:
    before, ids = files_of(populated), job_ids(populated)
    if named_by == "--db":
        proc = sift(["simulate", "--db", str(populated), *SMALL], populated.parent)
    else:
        proc = sift(["simulate", *SMALL], populated.parent, SIFT_DB=str(populated))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"sift: {named_by}: {populated} {REFUSAL}"
    assert_unchanged(populated, before)
    assert job_ids(populated) == ids
    assert list((populated.parent / "tmp").iterdir()) == []  # no new store either


@pytest.mark.slow
def test_sift_db_in_the_working_directory_is_not_used(populated: Path) -> None:
    before, ids = files_of(populated), job_ids(populated)
    proc = sift(["simulate", "--json", *SMALL], populated.parent)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["ok"] is True
    assert Path(summary["db"]).parent.parent == populated.parent / "tmp"
    assert_unchanged(populated, before)
    assert job_ids(populated) == ids


@pytest.mark.slow
def test_the_default_store_is_a_new_file_whose_path_is_printed(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SIFT_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    paths = []
    for _ in range(2):  # a second run makes another new file
        code, out, _ = run(capsys, "simulate", *SMALL)
        assert code == 0
        lines = out.splitlines()
        assert lines[-1] == "All invariants hold."
        store = [line.split(None, 1)[1] for line in lines if line.startswith("  store ")]
        assert len(store) == 1
        path = Path(store[0])
        assert path.name == "sim.db" and path.parent.name.startswith("sift-simulate-")
        assert path.parent.parent == tmp_path / "tmp"
        view = independent_view(path)  # the file is kept, and holds what the run left
        assert view["bad_done"] == [] and view["bad_bytes"] == [] and view["jobs"] > 0
        paths.append(path)
    assert paths[0] != paths[1]
    assert not (tmp_path / "sift.db").exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["missing", "empty store", "empty file"])
def test_a_named_store_without_jobs_is_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = tmp_path / "new.db"
    if kind == "empty store":
        dcache.open_db(path)
        dcache.close_db()
    elif kind == "empty file":
        path.touch()
    code, out, _ = run(capsys, "simulate", "--db", path, "--json", *SMALL)
    assert code == 0
    summary = json.loads(out)
    assert summary["ok"] is True and summary["db"] == str(path)
    assert independent_view(path)["jobs"] > 0


def test_only_the_restarted_runner_reconciles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """requeue_in_flight is called once, by the restart that stands for the new runner process; never from a
    caller thread (a web worker); and mark_in_flight_failed, which would fail the jobs, never."""
    calls: list[tuple[str, str]] = []

    def recording(name: str) -> Any:
        real = getattr(dcache, name)

        def call(*args: Any, **kwargs: Any) -> int:
            calls.append((name, threading.current_thread().name))
            return int(real(*args, **kwargs))

        return call

    for name in ("requeue_in_flight", "mark_in_flight_failed"):
        monkeypatch.setattr(dcache, name, recording(name))
    code, out, _ = run(capsys, "simulate", "--db", tmp_path / "sim.db", *SMALL)
    assert code == 0
    assert calls == [("requeue_in_flight", "MainThread")]
    restart = next(line for line in out.splitlines() if line.startswith("  runner restart "))
    assert "the new runner alone requeued at its start (requeue_in_flight) " in restart


def test_help_names_the_store_it_uses(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", "--help")
    text = " ".join(out.split())
    assert code == 0
    assert (
        "a new file sim.db in a new directory sift-simulate-* under $TMPDIR or /tmp; never ./sift.db" in text
    )
    assert "one holding jobs is refused, unchanged" in text
    assert (
        "only the new runner requeues what it held (requeue_in_flight) at its start, never the callers"
        in text
    )


@pytest.mark.slow
def test_another_programs_database_is_refused_and_unchanged(tmp_path: Path) -> None:
    """A mistyped --db naming an app's own SQLite database: no job there, but tables that are not the
    store's, so simulate writes nothing into it."""
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ann')")
        conn.commit()
    before = path.read_bytes()
    proc = sift(["simulate", "--db", str(path), *SMALL], tmp_path)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        f"sift: --db: {path} is a database with other tables (users), not an empty store; simulate never "
        "writes into it (without --db and $SIFT_DB it makes a new file of its own)\n"
    )
    assert path.read_bytes() == before


# -- PostgreSQL: a schema of its own -----------------------------------------------------------------------


def schemas(conn: Any) -> set[str]:
    return {row[0] for row in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


def store_contents(conn: Any, schema: str) -> dict[str, str | None]:
    """A digest of every row of a schema's batch tables, read as text (JSON is not parsed)."""
    tables = {
        row[0]
        for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
    }
    return {
        table: conn.execute(
            f'SELECT md5(string_agg(t::text, chr(10) ORDER BY t::text)) FROM "{schema}".{table} t'
        ).fetchone()[0]
        for table in sorted(tables)
    }


@pytest.fixture
def neighbour(postgres_schema: str) -> Iterator[str]:
    """A store holding jobs in a schema of this test's own, beside which simulate runs."""
    schema = f"{postgres_schema}_nb"
    dcache.open_db(postgres_target(schema))
    try:
        for n in range(3):
            dcache.create_batch_job(make_job(f"live-{n}", targets_total=2), make_targets(2))
        dcache.update_batch_target("live-0", 0, "done", result="café")
        dcache.close_db()
        yield schema
    finally:
        dcache.close_db()
        drop_schema(schema)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("named_by", ["--db", "$SIFT_DB"])
def test_on_postgres_simulate_makes_a_schema_of_its_own(
    neighbour: str,
    named_by: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with psycopg.connect(POSTGRES_URL) as conn:
        before, neighbour_before = schemas(conn), store_contents(conn, neighbour)
    # A budget no run reaches, so that the schema keeps its jobs: at SMALL's 64 KiB, a last job of large
    # results, over the budget alone, is evicted with every other, and the schema is left empty.
    small = [*SMALL, "--budget", "64MiB"]
    if named_by == "--db":
        code, out, err = run(capsys, "simulate", "--db", POSTGRES_URL, "--json", *small)
    else:
        monkeypatch.setenv("SIFT_DB", POSTGRES_URL)
        code, out, err = run(capsys, "simulate", "--json", *small)
    summary = json.loads(out)
    made = summary["schema_made"]
    try:
        assert (code, err, summary["ok"]) == (0, "", True)
        assert re.fullmatch(rf"sift_sim_\d{{8}}_\d{{6}}_{os.getpid()}(_\d+)?", made)
        assert summary["db"] == f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}schema={made}"
        with psycopg.connect(POSTGRES_URL) as conn:
            after = schemas(conn)
            row = conn.execute(f'SELECT COUNT(*) FROM "{made}".batch_job').fetchone()
            jobs = row[0] if row else 0
            # The store beside it, holding jobs, is as it was; and no other schema of this process's
            # simulations appeared (other sessions may add and drop schemas of their own meanwhile).
            assert store_contents(conn, neighbour) == neighbour_before
        assert made not in before and jobs > 0
        assert {name for name in after - before if name.endswith(f"_{os.getpid()}")} == {made}
        text_summary = run(
            capsys, "simulate", "--db", f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}schema={made}"
        )
        assert text_summary[0] == 1 and f"schema {made} already holds jobs" in text_summary[2]
    finally:
        drop_schema(made)


@pytest.mark.slow
@pytest.mark.postgres
def test_on_postgres_the_summary_says_how_to_drop_the_schema(
    postgres_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "simulate", "--db", POSTGRES_URL, *SMALL)
    store = next(line for line in out.splitlines() if line.startswith("  store "))
    made = store.split("schema=")[1].split()[0]
    try:
        assert code == 0 and out.splitlines()[-1] == "All invariants hold."
        assert store.endswith(f"(kept; to drop it: DROP SCHEMA {made} CASCADE)")
    finally:
        drop_schema(made)


@pytest.mark.postgres
def test_a_named_postgres_schema_holding_jobs_is_refused_and_unchanged(
    neighbour: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(POSTGRES_URL) as conn:
        before = store_contents(conn, neighbour)
    code, out, err = run(capsys, "simulate", "--db", postgres_target(neighbour), *SMALL)
    assert (code, out) == (1, "")
    assert err == (
        f"sift: --db: schema {neighbour} already holds jobs; simulate runs only on a new or empty store, so "
        "it never changes real data (without ?schema= it makes a new schema of its own)\n"
    )
    with psycopg.connect(POSTGRES_URL) as conn:
        assert store_contents(conn, neighbour) == before


@pytest.mark.postgres
def test_a_named_postgres_schema_with_other_tables_is_refused(
    postgres_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = f"{postgres_schema}_app"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".users (id int)')
    try:
        code, out, err = run(capsys, "simulate", "--db", postgres_target(schema), *SMALL)
        assert (code, out) == (1, "")
        assert err.startswith(f"sift: --db: schema {schema} holds other tables (users), not an empty store")
        with psycopg.connect(POSTGRES_URL) as conn:
            assert store_contents(conn, schema) == {"users": None}  # no store table was made there
    finally:
        drop_schema(schema)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("kind", ["missing", "empty store"])
def test_a_named_postgres_schema_without_jobs_is_used(
    postgres_schema: str, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    schema = f"{postgres_schema}_new"
    if kind == "empty store":
        dcache.open_db(postgres_target(schema))
        dcache.close_db()
    try:
        code, out, _ = run(capsys, "simulate", "--db", postgres_target(schema), "--json", *SMALL)
        summary = json.loads(out)
        assert (code, summary["ok"], summary["schema_made"]) == (0, True, None)
        assert summary["db"] == postgres_target(schema)
    finally:
        drop_schema(schema)


@pytest.mark.slow
@pytest.mark.postgres
def test_on_postgres_the_password_is_never_shown(
    postgres_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The test server trusts its clients, so a password in the URL is accepted and ignored; the summary,
    whose store line names the URL, shows it without the password."""
    parts = urllib.parse.urlsplit(POSTGRES_URL)
    user, _, host = parts.netloc.rpartition("@")
    with_password = urllib.parse.urlunsplit(parts._replace(netloc=f"{user.partition(':')[0]}:s3cret@{host}"))
    code, out, err = run(capsys, "simulate", "--db", with_password, *SMALL)
    made = (
        next(line for line in out.splitlines() if line.startswith("  store ")).split("schema=")[1].split()[0]
    )
    try:
        assert code == 0 and "s3cret" not in out + err
    finally:
        drop_schema(made)
