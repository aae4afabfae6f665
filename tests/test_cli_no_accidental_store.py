"""Only ``sift init``, ``restore`` and ``simulate`` make a store. Every other command, writing or not, refuses
a missing SQLite file or a PostgreSQL schema without the store's tables: exit 1, one line naming it and
saying how to make one, and nothing created (no file, no -wal/-shm/-lock, no schema, no table). A failed
restore removes the store it created. ``open_db(..., create=False)`` is the library's side of the rule."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from cli_helpers import populate, run, snapshot_of
from conftest import POSTGRES_URL

from sift import dcache

COMMANDS = [
    ["sweep", "--ttl", "1h"],
    ["sweep", "--ttl", "1h", "--dry-run"],
    ["evict", "--max-bytes", "1MiB"],
    ["evict", "--max-bytes", "1MiB", "--dry-run"],
    ["reconcile", "--reason", "typo"],
    ["check"],
    ["check", "--repair"],
    ["backup", "BACKUP"],
    ["vacuum"],
    ["shell"],
    ["stats"],
    ["stats", "--json"],
    ["jobs"],
    ["show", "job-a"],
]


def schema_facts(schema: str) -> tuple[int, int]:
    """How many schemas named ``schema`` the server has (0 or 1), and how many tables are in it."""
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = %s),"
            " (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s)",
            (schema, schema),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def create_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')


def schema_of(target: str) -> str:
    return target.rsplit("schema=", 1)[1]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An empty directory for the store, apart from the test's other files."""
    path = tmp_path / "stores"
    path.mkdir()
    return path


def refused(err: str, shown: str) -> bool:
    return err == f"sift: path: no store at {shown!r}; `sift init` creates one\n"


def argv_of(command: list[str], backup_to: Path) -> list[str]:
    return [str(backup_to) if arg == "BACKUP" else arg for arg in command]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_missing_file_is_refused_and_nothing_is_made(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, folder: Path, command: list[str]
) -> None:
    target = folder / "typo.db"
    assert run(capsys, *argv_of(command, tmp_path / "backup.db"), "--db", target) == (
        1,
        "",
        f"sift: path: no store at {str(target)!r}; `sift init` creates one\n",
    )
    assert os.listdir(folder) == []
    assert not (tmp_path / "backup.db").exists()


@pytest.mark.postgres
@pytest.mark.parametrize("schema_exists", [False, True], ids=["no schema", "empty schema"])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_missing_schema_is_refused_and_nothing_is_made(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    pg_target: str,
    command: list[str],
    schema_exists: bool,
) -> None:
    schema = schema_of(pg_target)
    if schema_exists:  # a schema without the store's tables (say, the public schema of another database)
        create_schema(schema)
    before = schema_facts(schema)
    assert before == (int(schema_exists), 0)
    code, out, err = run(capsys, *argv_of(command, tmp_path / "backup.db"), "--db", pg_target)
    assert (code, out) == (1, "")
    assert refused(err, pg_target)
    assert schema_facts(schema) == before
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("named_by", ["$SIFT_DB", "default"])
def test_the_default_store_is_not_made_either(
    capsys: pytest.CaptureFixture[str], folder: Path, monkeypatch: pytest.MonkeyPatch, named_by: str
) -> None:
    monkeypatch.chdir(folder)
    monkeypatch.delenv("SIFT_DB", raising=False)
    if named_by == "$SIFT_DB":
        monkeypatch.setenv("SIFT_DB", "typo.db")
    shown = "typo.db" if named_by == "$SIFT_DB" else "sift.db"
    code, out, err = run(capsys, "reconcile", "--reason", "typo")
    assert (code, out) == (1, "") and refused(err, shown)
    assert os.listdir(folder) == []


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_an_existing_store_still_works(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "store.db"
    assert run(capsys, "init", "--db", target)[0] == 0
    with open(os.devnull) as nothing:
        monkeypatch.setattr("sys.stdin", nothing)  # shell reads its statements from stdin
        code, _, err = run(capsys, *argv_of(command, tmp_path / "backup.db"), "--db", target)
    assert code == (1 if command == ["show", "job-a"] else 0)  # an empty store has no job-a
    assert "no store" not in err


@pytest.mark.parametrize("backend", ["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_init_creates_a_store_once_and_then_leaves_it_unchanged(
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest, folder: Path, backend: str
) -> None:
    target = str(folder / "new.db") if backend == "file" else request.getfixturevalue("pg_target")
    assert run(capsys, "init", "--db", target) == (0, f"created a new store at {target}\n", "")
    if backend == "file":
        assert sorted(os.listdir(folder)) == ["new.db", "new.db-lock"]
    else:
        assert schema_facts(schema_of(target)) == (1, len(dcache.tables.STORE_TABLES))
    assert run(capsys, "jobs", "--db", target)[0] == 0
    populate(target)
    before = snapshot_of(target)
    dcache.close_db()
    assert run(capsys, "init", "--db", target) == (
        0,
        f"a store already exists at {target}; left unchanged\n",
        "",
    )
    assert snapshot_of(target) == before
    dcache.close_db()
    code, out, _ = run(capsys, "init", "--db", target, "--json")
    assert (code, json.loads(out)) == (0, {"db": target, "created": False})


def test_init_json_says_it_created_the_store(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    code, out, _ = run(capsys, "init", "--db", folder / "new.db", "--json")
    assert (code, json.loads(out)) == (0, {"db": str(folder / "new.db"), "created": True})


def test_init_refuses_a_file_that_is_not_a_store(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    other = folder / "other.db"
    with closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    content = other.read_bytes()
    code, out, err = run(capsys, "init", "--db", other)
    assert (code, out) == (1, "") and err.startswith("sift: path: ") and "other.db" in err
    assert other.read_bytes() == content
    assert os.listdir(folder) == ["other.db"]


def bad_sources(tmp_path: Path) -> dict[str, Path]:
    """A source restore refuses: missing, not a store, and a store with a row the rules refuse."""
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    refused_rows = tmp_path / "refused.db"
    populate(refused_rows)
    dcache.close_db()
    with closing(sqlite3.connect(refused_rows)) as conn:
        conn.execute("UPDATE batch_job SET status = 'paused' WHERE id = 'job-b'")
        conn.commit()
    return {"missing": tmp_path / "missing.db", "bad": text, "refused": refused_rows}


@pytest.mark.parametrize("source", ["missing", "bad", "refused"])
@pytest.mark.parametrize("backend", ["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_failed_restore_leaves_no_new_store_behind(
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    folder: Path,
    backend: str,
    source: str,
) -> None:
    path = bad_sources(tmp_path)[source]
    target = str(folder / "r2.db") if backend == "file" else request.getfixturevalue("pg_target")
    code, out, err = run(capsys, "restore", path, "--db", target)
    assert (code, out) == (1, "") and err.startswith("sift: source: ")
    if backend == "file":
        assert os.listdir(folder) == []
    else:
        assert schema_facts(schema_of(target)) == (0, 0)


@pytest.mark.postgres
def test_a_failed_restore_keeps_a_schema_it_did_not_make(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, pg_target: str
) -> None:
    schema = schema_of(pg_target)
    create_schema(schema)
    code, _, _ = run(capsys, "restore", tmp_path / "missing.db", "--db", pg_target)
    assert code == 1
    assert schema_facts(schema)[0] == 1


@pytest.mark.parametrize("backend", ["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_failed_restore_keeps_the_store_that_was_there(
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    target = str(tmp_path / "r2.db") if backend == "file" else request.getfixturevalue("pg_target")
    populate(target)
    before = snapshot_of(target)
    dcache.close_db()
    assert run(capsys, "restore", tmp_path / "missing.db", "--db", target)[0] == 1
    assert snapshot_of(target) == before


@pytest.mark.parametrize("backend", ["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_restore_into_a_missing_store_creates_it(
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    source = tmp_path / "source.db"
    populate(source)
    before = snapshot_of(source)
    dcache.close_db()
    target = str(tmp_path / "r2.db") if backend == "file" else request.getfixturevalue("pg_target")
    assert run(capsys, "restore", source, "--db", target)[0] == 0
    restored = snapshot_of(target)
    for table in ("batch_job", "batch_target"):  # a PostgreSQL row also has its seq column at the end
        rows = [row[: len(mine)] for row, mine in zip(restored[table], before[table], strict=True)]
        assert rows == before[table]


# -- The library: open_db(..., create=False) ---------------------------------------------------------------


@pytest.fixture
def closed() -> Iterator[None]:
    yield
    dcache.close_db()


@pytest.mark.usefixtures("closed")
def test_open_db_create_false_refuses_a_missing_file(folder: Path) -> None:
    with pytest.raises(dcache.StoreMissing, match=r"^path: no store at .*typo\.db'$") as caught:
        dcache.open_db(folder / "typo.db", create=False)
    assert caught.value.field == "path"
    assert os.listdir(folder) == []
    with pytest.raises(dcache.StoreMissing, match="':memory:' is always a new store"):
        dcache.open_db(":memory:", create=False)


@pytest.mark.postgres
@pytest.mark.usefixtures("closed")
@pytest.mark.parametrize("schema_exists", [False, True], ids=["no schema", "empty schema"])
def test_open_db_create_false_refuses_a_missing_schema(pg_target: str, schema_exists: bool) -> None:
    schema = schema_of(pg_target)
    if schema_exists:
        create_schema(schema)
    with pytest.raises(dcache.StoreMissing, match=f"^path: no store at .*schema={schema}'$"):
        dcache.open_db(pg_target, create=False)
    assert schema_facts(schema) == (int(schema_exists), 0)


@pytest.mark.usefixtures("closed")
@pytest.mark.parametrize("backend", ["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_open_db_create_false_opens_an_existing_store(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    target = str(tmp_path / "store.db") if backend == "file" else request.getfixturevalue("pg_target")
    populate(target)
    before = snapshot_of(target)
    dcache.open_db(target, create=False)
    dcache.touch_batch_job("job-a")  # open for writing
    assert dcache.BatchJob.select().count() == len(before["batch_job"])


def test_a_read_only_open_of_a_missing_store_is_store_missing(folder: Path) -> None:
    with pytest.raises(dcache.StoreMissing):
        dcache.open_db(folder / "typo.db", readonly=True)
    assert os.listdir(folder) == []


@pytest.mark.parametrize("flag", [[], ["--counters"]])
def test_stats_shows_this_process_counters_only_when_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: list[str]
) -> None:
    target = tmp_path / "store.db"
    populate(target)
    dcache.close_db()
    code, out, _ = run(capsys, "stats", "--db", target, *flag)
    assert code == 0 and "Jobs by status" in out
    assert ("Counters (stats(): this process" in out) == bool(flag)
    code, out, _ = run(capsys, "stats", "--db", target, "--json", *flag)
    counters = json.loads(out)["counters"]
    assert code == 0 and counters == dict.fromkeys(dcache.stats(), 0)
