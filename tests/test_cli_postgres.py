"""The ``sift`` command on a PostgreSQL store (``--db postgresql://...`` and ``$SIFT_DB``): every command
but ``simulate`` gives what it gives on SQLite, each test in a schema of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cli_helpers import EXPECTED, FROZEN, NEWEST_FIRST, RESULT_A0, RESULT_A1, RESULT_A2, populate, run, utf8
from conftest import POSTGRES_URL
from freezegun import freeze_time
from helpers import create_partial, make_job, make_targets

from sift import dcache
from sift.dcache.tables import JOB_COLUMN_LIST as JOB_COLUMNS
from sift.dcache.tables import TARGET_COLUMN_LIST as TARGET_COLUMNS

pytestmark = pytest.mark.postgres

#: Every table of a PostgreSQL store, as the space report names them.
STORE_TABLES = {
    "batch_job",
    "batch_target",
    "batch_totals",
    "sift_schema",
    "batch_claim_ring",
    "batch_host_policy",
    "batch_paused_job",
    "batch_paused_caller",
}


def rows(target: str | Path) -> dict[str, list[tuple[Any, ...]]]:
    """The columns both backends share, of every job and target, in key order; and the byte total."""
    dcache.open_db(target)
    try:
        return {
            "batch_job": dcache.db.execute_sql(f"SELECT {JOB_COLUMNS} FROM batch_job ORDER BY id").fetchall(),
            "batch_target": dcache.db.execute_sql(
                f"SELECT {TARGET_COLUMNS} FROM batch_target ORDER BY job_id, idx"
            ).fetchall(),
            "total": [(dcache.batch_nbytes(),)],
        }
    finally:
        dcache.close_db()


def schema_exists(target: str) -> bool:
    schema = target.rpartition("schema=")[2]
    with psycopg.connect(POSTGRES_URL) as conn:
        return bool(conn.execute("SELECT to_regnamespace(%s) IS NOT NULL", (schema,)).fetchone()[0])  # type: ignore[index]


def one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("sift: ") and "Traceback" not in err
    return err


@pytest.fixture
def populated(pg_target: str) -> str:
    populate(pg_target)
    return pg_target


# -- The same command, the same answer on both backends -------------------------------------------------

SAME = [
    ["jobs", "--json", "--limit", "0"],
    ["jobs", "--json", "--caller", "alice"],
    ["jobs", "--json", "--status", "done"],
    ["show", "job-a", "--json"],
    ["show", "job-c", "--json"],
    ["show", "job-a", "--result", "1"],
    ["sweep", "--ttl", "2h", "--dry-run", "--json"],
    ["evict", "--max-bytes", "20", "--dry-run", "--json"],
    ["sweep", "--ttl", "2h", "--json"],
    ["evict", "--max-bytes", "20", "--json"],
    ["reconcile", "--reason", "runner restarted", "--json"],
    ["check", "--json"],
    ["check", "--repair", "--json"],
]


@pytest.mark.parametrize("argv", SAME, ids=[" ".join(a) for a in SAME])
def test_a_command_does_on_postgresql_what_it_does_on_sqlite(
    populated: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    sqlite_file = tmp_path / "store.db"
    populate(sqlite_file)
    with freeze_time(FROZEN):
        on_sqlite = run(capsys, "--db", sqlite_file, *argv)
        on_postgres = run(capsys, "--db", populated, *argv)
    assert on_sqlite[0] == 0 and on_sqlite[2] == ""
    assert on_postgres == on_sqlite
    assert rows(populated) == rows(sqlite_file)


def test_the_read_commands_change_nothing(populated: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = rows(populated)
    for argv in (
        ["stats"],
        ["jobs"],
        ["show", "job-a"],
        ["sweep", "--ttl", "0s", "--dry-run"],
        ["evict", "--max-bytes", "0", "--dry-run"],
        ["check"],
    ):
        code, _, err = run(capsys, "--db", populated, *argv)
        assert (code, err) == (0, ""), argv
    assert rows(populated) == before


def test_jobs_lists_newest_first_and_a_tie_goes_to_the_later_insert(
    pg_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    populate(pg_target)
    dcache.open_db(pg_target)
    create_partial(make_job("tie-z", created_at=1_900_000_000), make_targets(1))
    create_partial(make_job("tie-a", created_at=1_900_000_000), make_targets(1))
    dcache.close_db()
    code, out, _ = run(capsys, "--db", pg_target, "jobs", "--json", "--limit", "0")
    assert code == 0
    assert [job["id"] for job in json.loads(out)] == ["tie-a", "tie-z", *NEWEST_FIRST]


def test_stats_shows_the_tables_instead_of_files(populated: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--db", populated, "stats", "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["db"] == populated  # no password in it to hide
    assert report["nbytes"] == sum(e.nbytes for e in EXPECTED.values())
    assert report["jobs"]["done"] == 1 and sum(report["jobs"].values()) == len(EXPECTED)
    assert sum(report["targets"].values()) == sum(e.total for e in EXPECTED.values())
    assert "file_bytes" not in report and "wal_bytes" not in report and "free_pages" not in report
    dcache.open_db(populated, readonly=True)
    try:
        space = dcache.relation_space()
    finally:
        dcache.close_db()
    assert report["table_bytes"] == space.table_bytes and set(space.table_bytes) == STORE_TABLES
    assert report["total_table_bytes"] == space.total_bytes > 0
    code, out, _ = run(capsys, "--db", populated, "stats")
    assert code == 0
    assert "File size" not in out and "WAL size" not in out and "Free pages" not in out
    assert f"({space.total_bytes:,} bytes, with indexes)" in out


def test_show_counts_utf8_bytes(populated: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--db", populated, "show", "job-a", "--json")
    assert code == 0
    sizes = [t["result_bytes"] for t in json.loads(out)["targets"]]
    assert sizes == [utf8(RESULT_A0), utf8(RESULT_A1), utf8(RESULT_A2)] and sizes[1] != len(RESULT_A1)


def test_sift_db_names_the_store(
    populated: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setenv("SIFT_DB", populated)
    code, out, err = run(capsys, "jobs", "--json")
    assert (code, err) == (0, "")
    assert {job["id"] for job in json.loads(out)} == set(EXPECTED)


# -- check, shell, backup, vacuum ------------------------------------------------------------------------


def test_check_finds_repairs_and_then_passes(populated: str, capsys: pytest.CaptureFixture[str]) -> None:
    schema = populated.rpartition("schema=")[2]
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        conn.execute("UPDATE batch_job SET targets_done = 0 WHERE id = 'job-a'")
        conn.execute("DROP INDEX batch_job_live")
    code, out, err = run(capsys, "--db", populated, "check")
    assert (code, err) == (1, "")
    assert "targets_done (job 'job-a'): targets_done is 0, but 3 targets are done or failed" in out
    assert "batch_job_live (index) is missing" in out
    code, out, err = run(capsys, "--db", populated, "check", "--repair")
    assert (code, err) == (1, "")
    assert "targets_done (job 'job-a'): 0 -> 3" in out and "created batch_job_live (index)" in out
    assert run(capsys, "--db", populated, "check")[:2] == (
        0,
        f"ok: 5 jobs and 10 targets in {populated}, no problem found\n",
    )


def test_shell_runs_a_script_on_the_store(
    populated: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    import io

    monkeypatch.setattr(
        "sys.stdin", io.StringIO("print(batch_job('job-a').nbytes, live_batch_jobs_total())\n")
    )
    code, out, err = run(capsys, "--db", populated, "shell")
    assert code == 0 and out == f"{EXPECTED['job-a'].nbytes} 2\n"
    assert f"sift shell on {populated}: 5 jobs" in " ".join(err.split())


def test_backup_writes_a_sqlite_store_with_every_row(
    populated: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "copy.db"
    code, out, err = run(capsys, "--db", populated, "backup", dest, "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["dest"] == str(dest) and report["bytes"] == dest.stat().st_size
    assert rows(dest) == rows(populated)
    code, out, _ = run(capsys, "--db", dest, "check")
    assert code == 0, out


def test_vacuum_vacuums_and_analyzes_the_tables(populated: str, capsys: pytest.CaptureFixture[str]) -> None:
    schema = populated.rpartition("schema=")[2]

    def analyzed() -> int:
        with psycopg.connect(POSTGRES_URL) as conn:
            row = conn.execute(
                "SELECT COALESCE(SUM(vacuum_count + analyze_count), 0) FROM pg_stat_all_tables "
                "WHERE schemaname = %s",
                (schema,),
            ).fetchone()
        assert row is not None
        return int(row[0])

    before = rows(populated)
    count = analyzed()
    code, out, err = run(capsys, "--db", populated, "vacuum", "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert set(report["after"]["table_bytes"]) == STORE_TABLES
    assert analyzed() >= count + 8  # a VACUUM and an ANALYZE of each of the four tables
    assert rows(populated) == before


# -- Errors: one line, exit 1, nothing created ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["stats"],
        ["jobs"],
        ["show", "job-a"],
        ["sweep", "--ttl", "1h", "--dry-run"],
        ["check"],
        ["check", "--repair"],
    ],
)
def test_a_read_command_on_a_schema_without_a_store_creates_nothing(
    pg_target: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = run(capsys, "--db", pg_target, *argv)
    assert (code, out) == (1, "")
    assert one_line(err) == f"sift: path: no store at {pg_target!r}; `sift init` creates one\n"
    assert not schema_exists(pg_target)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("postgresql://postgres:secret@127.0.0.1:1/test?schema=s", "cannot connect to the PostgreSQL server"),
        (
            "postgresql://postgres:secret@127.0.0.1:5432/no_such_database_here?schema=s",
            "no_such_database_here",
        ),
    ],
    ids=["wrong-port", "wrong-database"],
)
@pytest.mark.parametrize("argv", [["stats"], ["sweep", "--ttl", "1h"], ["backup", "copy.db"], ["vacuum"]])
def test_a_server_that_cannot_be_used_is_one_line(
    postgres_schema: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: Any,
    url: str,
    why: str,
    argv: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "--db", url, *argv)
    assert (code, out) == (1, "")
    assert why in one_line(err) and "secret" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_backup_to_a_bad_dest_names_it_and_writes_nothing(
    populated: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = rows(populated)
    code, out, err = run(capsys, "--db", populated, "backup", tmp_path / "missing" / "copy.db")
    assert (code, out) == (1, "")
    assert one_line(err).startswith("sift: dest: the directory of")
    assert list(tmp_path.iterdir()) == []
    assert rows(populated) == before
