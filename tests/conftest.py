from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import populate
from helpers import TargetWriter, write_in_bulk
from hypothesis import settings

from sift import dcache

pytest_plugins = ["pytester"]

settings.register_profile("default", deadline=None)
settings.register_profile("deep", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


#: The PostgreSQL server the postgres cases use (this project's machines run one there).
POSTGRES_URL = os.environ.get("SIFT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

#: This test process's own mark in schema names: other machines' test runs may share the server, and their
#: process ids may equal ours.
SUFFIX = f"{os.getpid()}_{secrets.token_hex(4)}"


def postgres_missing() -> str | None:
    """Why the postgres cases cannot run here (no server answers), or None; under CI always None, so that
    they run and fail rather than skip."""
    import psycopg

    if os.environ.get("CI") == "true":
        return None
    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"no PostgreSQL server answers at {POSTGRES_URL} (set SIFT_TEST_POSTGRES): {exc}"
    return None


@pytest.fixture(scope="session")
def postgres_schema() -> Iterator[str]:
    """This test process's own schema on the test server (dropped at the end); skips every postgres case
    with one reason when no server answers, except under CI (``CI=true``), where they fail."""
    import psycopg

    schema = f"sift_test_{SUFFIX}"
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    except psycopg.Error as exc:
        reason = f"no PostgreSQL server answers at {POSTGRES_URL} (set SIFT_TEST_POSTGRES): {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    try:
        yield schema
    finally:
        try:
            dcache.close_db()
        finally:
            drop_schema(schema)


def drop_schema(schema: str) -> None:
    """Drop a schema a test made on the test server, with what it holds (nothing if it is not there)."""
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def postgres_target(schema: str) -> str:
    return f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}schema={schema}"


@pytest.fixture
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new store for one run of a command, by the test's parameter (``indirect=True``): ``"sqlite"``, a
    file; ``"postgres"``, a schema of the test's own on the PostgreSQL server, dropped afterwards."""
    if request.param == "sqlite":
        yield str(tmp_path / "sim.db")
        return
    request.getfixturevalue("postgres_schema")  # skips (or fails, under CI) without a server
    schema = f"sift_{request.node.module.__name__.removeprefix('test_')}_{SUFFIX}"
    drop_schema(schema)
    try:
        yield postgres_target(schema)
    finally:
        dcache.close_db()
        drop_schema(schema)


def open_empty_postgres(schema: str) -> dcache.StoreDatabase:
    """The worker's schema, opened and emptied (TRUNCATE: a fresh schema per test costs three times as
    much)."""
    opened = dcache.open_db(postgres_target(schema))
    opened.execute_sql(
        "TRUNCATE batch_job, batch_target, batch_host_policy, batch_paused_job, batch_paused_caller"
    )
    opened.execute_sql("UPDATE batch_totals SET nbytes = 0 WHERE nbytes <> 0")
    opened.execute_sql("UPDATE batch_claim_ring SET caller = NULL, turns = 0")
    return opened


def store_kinds(node: pytest.Item) -> list[str]:
    """The stores a test using ``store`` runs on: SQLite in memory and PostgreSQL; a test about SQLite alone
    (``sqlite_only``) in memory and on a real WAL file. The rules are the same on a file as in memory, so
    the file adds cases only where the test is about SQLite; a test about the file uses ``file_store``, or
    ``shared_store`` to run on PostgreSQL too."""
    if node.get_closest_marker("sqlite_only"):
        return ["memory", "file"]
    return ["memory", "postgres"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store" in metafunc.fixturenames:
        kinds = store_kinds(metafunc.definition)
        params = [pytest.param(k, marks=pytest.mark.postgres) if k == "postgres" else k for k in kinds]
        metafunc.parametrize("store", params, indirect=True)


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dcache.StoreDatabase]:
    """The store opened in memory, on a real WAL file, or in a PostgreSQL schema, by the test's markers
    (see ``store_kinds``)."""
    if request.param == "postgres":
        yield open_empty_postgres(request.getfixturevalue("postgres_schema"))
    else:
        path = ":memory:" if request.param == "memory" else tmp_path / "store.db"
        yield dcache.open_db(path)
    dcache.close_db()


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[Path]:
    """The store opened on a real WAL file; yields the file's path."""
    path = tmp_path / "store.db"
    dcache.open_db(path)
    yield path
    dcache.close_db()


@pytest.fixture(params=["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store other processes can open too, open in this process and empty: a real WAL file, or the
    worker's PostgreSQL schema. Yields the target to give ``open_db`` in each process."""
    if request.param == "postgres":
        schema = request.getfixturevalue("postgres_schema")
        open_empty_postgres(schema)
        target = postgres_target(schema)
    else:
        target = str(tmp_path / "store.db")
        dcache.open_db(target)
    yield target
    dcache.close_db()


@pytest.fixture(params=["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where a new store goes, not made yet: a SQLite file, or a PostgreSQL schema of the test's own."""
    if request.param == "postgres":
        yield request.getfixturevalue("pg_target")
    else:
        yield str(tmp_path / "sift.db")
    dcache.close_db()


@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    """A SQLite store file holding what ``cli_helpers.populate`` stores (five jobs, ten targets)."""
    path = tmp_path / "store.db"
    populate(path)
    return path


@pytest.fixture
def pg_target(postgres_schema: str) -> Iterator[str]:
    """A PostgreSQL target in a schema of the test's own that does not exist yet (``open_db`` creates it;
    dropped after the test). Skips, or fails under CI, as ``postgres_schema`` does."""
    name = f"{postgres_schema}_{secrets.token_hex(3)}"
    yield postgres_target(name)
    dcache.close_db()
    drop_schema(name)


@pytest.fixture(params=["update_batch_target", "update_batch_targets"])
def write(request: pytest.FixtureRequest) -> TargetWriter:
    """A target's write, through either entry point: each rule of update_batch_target holds in both."""
    return dcache.update_batch_target if request.param == "update_batch_target" else write_in_bulk
