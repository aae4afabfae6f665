"""sift.testing, the pytest plugin for apps built on the store, tested the way its users meet it: sample
projects run by pytest's own ``pytester``."""

from __future__ import annotations

import datetime
import importlib.metadata
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

import sift.testing
from sift import dcache
from sift.dcache import clock
from sift.testing import SiftClock, check_store_invariants, make_job, make_targets

OPT_IN = 'from sift.testing import make_job\n\npytest_plugins = ["sift.testing"]\n'

SAMPLE = """
    import datetime
    import sqlite3

    import pytest

    from sift import dcache
    from sift.testing import check_store_invariants, make_job as plain_make_job


    def test_store_is_fresh_empty_and_in_memory(sift_store):
        assert sift_store is dcache.db and not sift_store.is_closed()
        assert sift_store.database == ":memory:"
        assert dcache.BatchJob.select().count() == 0 and dcache.batch_nbytes() == 0
        dcache.create_batch_job(plain_make_job(id="left-behind"))


    def test_the_next_store_is_fresh_again(sift_store):
        assert set(dcache.stats().values()) == {0}  # the counters start again
        assert dcache.batch_job("left-behind") is None


    @pytest.mark.sift_store(file=True)
    def test_file_store_is_wal_in_tmp_path(sift_store, tmp_path):
        assert sift_store.database == str(tmp_path / "sift.db")
        assert sift_store.execute_sql("PRAGMA journal_mode").fetchone() == ("wal",)
        dcache.create_batch_job(plain_make_job(id="on-disk"))
        with sqlite3.connect(tmp_path / "sift.db") as other:
            assert other.execute("SELECT id FROM batch_job").fetchall() == [("on-disk",)]


    def test_factories(sift_store, sift_clock, make_job, make_targets):
        sift_clock.advance(100)
        job = make_job(targets_total=3, caller="bob")
        targets = make_targets(3)
        assert (job.created_at, job.lease, job.caller) == (sift_clock.now, sift_clock.now, "bob")
        assert [t.idx for t in targets] == [0, 1, 2]
        dcache.create_batch_job(job, targets)
        dcache.create_batch_job(make_job())
        assert dcache.BatchJob.select().count() == 2
        stored = dcache.batch_targets(job.id)
        assert [t.status for t in stored] == ["pending"] * 3


    def test_clock_drives_every_default_now(sift_store, sift_clock, make_job, make_targets):
        start = sift_clock.now
        job = make_job(targets_total=2)
        dcache.create_batch_job(job, make_targets(2))
        assert sift_clock.advance(30) == start + 30
        dcache.update_batch_target(job.id, 0, "done", result="ok")
        assert dcache.batch_job(job.id).lease == start + 30
        sift_clock.advance(datetime.timedelta(minutes=59, seconds=59))
        assert dcache.unix_now() == start + 3629
        assert dcache.sweep_batch(3600) == 0  # lease + ttl is one second after now
        sift_clock.advance(1)
        assert dcache.sweep_batch(3600) == 1


    @pytest.mark.sift_store(check=True)
    def test_checked_after_the_test(sift_store, make_job, make_targets):
        job = make_job(targets_total=2)
        dcache.create_batch_job(job, make_targets(2))
        dcache.update_batch_target(job.id, 1, "failed", error="timeout")
        check_store_invariants()
"""


def run(pytester: pytest.Pytester, *args: str, **files: str) -> pytest.RunResult:
    pytester.makeconftest(OPT_IN)
    pytester.makepyfile(**files)
    # as a user's conftest may do: import from the plugin, then enable it
    return pytester.runpytest("--strict-markers", "-W", "error", "-p", "no:cacheprovider", *args)


def test_sample_project_passes(pytester: pytest.Pytester) -> None:
    result = run(pytester, test_sample=SAMPLE)
    result.assert_outcomes(passed=6)
    assert dcache.db.is_closed()
    assert clock._test_clock is None


def test_a_corrupted_count_fails_naming_the_job(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under CI=true pytest prints summary lines whole, so the message would be counted there too.
    monkeypatch.delenv("CI", raising=False)
    result = run(
        pytester,
        test_corrupt="""
        import pytest
        from sift import dcache
        from sift.testing import check_store_invariants


        def corrupt(make_job, make_targets):
            dcache.create_batch_job(make_job(id="job-42", targets_total=2), make_targets(2))
            dcache.db.execute_sql("UPDATE batch_job SET targets_done = 2 WHERE id = 'job-42'")


        def test_explicit_check(sift_store, make_job, make_targets):
            corrupt(make_job, make_targets)
            check_store_invariants()


        @pytest.mark.sift_store(check=True)
        def test_marked(sift_store, make_job, make_targets):
            corrupt(make_job, make_targets)
        """,
    )
    result.assert_outcomes(failed=1, passed=1, errors=1)  # the marked test passes, then errs in tear-down
    assert (
        result.stdout.str().count(
            "targets_done (job 'job-42'): targets_done is 2, but 0 targets are done or failed"
        )
        == 2
    )
    result.stdout.fnmatch_lines(["*AssertionError: the store breaks 1 invariant(s):*"])
    assert dcache.db.is_closed()


@pytest.mark.parametrize("marker", ["", "@pytest.mark.sift_store(file=True)"])
def test_a_failing_test_still_closes_its_store(pytester: pytest.Pytester, marker: str) -> None:
    result = run(
        pytester,
        test_fails=f"""
        import pytest
        from sift import dcache

        {marker}
        def test_fails(sift_store, sift_clock, make_job):
            dcache.create_batch_job(make_job())
            with open("where.txt", "w") as f:
                f.write(sift_store.database)
            sift_clock.advance(5)
            assert False, "the test's own failure"
        """,
    )
    result.assert_outcomes(failed=1)
    assert dcache.db.is_closed()
    assert clock._test_clock is None
    where = (pytester.path / "where.txt").read_text()
    if where != ":memory:":
        assert Path(where).exists() and not Path(where + "-wal").exists()  # the last connection closed


def test_a_failing_check_in_tear_down_still_closes_the_store(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        test_fails="""
        import pytest
        from sift import dcache

        @pytest.mark.sift_store(file=True, check=True)
        def test_breaks_the_total(sift_store):
            dcache.db.execute_sql("UPDATE batch_totals SET nbytes = 5")
        """,
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*total: batch_totals holds 5, but SUM(nbytes) is 0*"])
    assert dcache.db.is_closed()


@pytest.mark.slow
def test_without_the_opt_in_there_are_no_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_plain="""
        def test_wants_the_store(sift_store):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'sift_store' not found*"])
    listing = pytester.runpytest_subprocess("--fixtures", "-p", "no:cacheprovider").stdout.str()
    assert "tmp_path" in listing
    for name in ("sift_store", "sift_clock", "make_job", "make_targets"):
        assert name not in listing
    assert not [ep for ep in importlib.metadata.entry_points(group="pytest11") if "sift" in ep.value]


def test_with_the_opt_in_the_fixtures_are_listed(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(OPT_IN)
    listing = pytester.runpytest("--fixtures", "-p", "no:cacheprovider").stdout.str()
    for name in ("sift_store", "sift_clock", "make_job", "make_targets"):
        assert name in listing
    markers = pytester.runpytest("--markers").stdout.str()
    assert "@pytest.mark.sift_store(file=False, check=False)" in markers


def test_freezegun_and_sift_clock_together(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        test_both="""
        import datetime

        import pytest
        from freezegun import freeze_time

        from sift import dcache
        from sift.dcache import clock


        @pytest.fixture
        def frozen():
            with freeze_time("2021-06-01 12:00:00") as frozen:
                yield frozen


        def test_the_store_follows_sift_clock_inside_a_freeze(sift_store, sift_clock, make_job):
            start = sift_clock.now
            with freeze_time("2020-01-01 00:00:00"):
                assert datetime.datetime.now().year == 2020  # the app's time is freezegun's
                assert dcache.unix_now() == start  # the store's is sift_clock's
                job = make_job()
                dcache.create_batch_job(job)
                sift_clock.advance(60)
                dcache.touch_batch_job(job.id)
            assert dcache.batch_job(job.id).lease == start + 60


        def test_sift_clock_starts_at_the_frozen_time(frozen, sift_store, sift_clock):
            assert sift_clock.now == 1622548800
            frozen.tick(100)
            assert dcache.unix_now() == 1622548800
            sift_clock.advance(1)
            assert dcache.unix_now() == 1622548801


        @freeze_time("2022-03-04")
        def test_a_freeze_decorator_beside_sift_clock(sift_store, sift_clock):
            assert datetime.date.today() == datetime.date(2022, 3, 4)
            assert dcache.unix_now() == sift_clock.now


        def test_after_them_freezegun_drives_the_store_again(sift_store):
            assert clock._test_clock is None
            with freeze_time("2030-01-01 00:00:00"):
                assert dcache.unix_now() == 1893456000
        """,
    )
    result.assert_outcomes(passed=4)


def test_in_memory_store_is_what_open_db_creates(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[object] = []
    real_open_db = dcache.open_db

    def counting_open_db(path: Any, **kwargs: Any) -> dcache.StoreDatabase:
        opened.append(path)
        return real_open_db(path, **kwargs)

    monkeypatch.setattr(dcache, "open_db", counting_open_db)
    monkeypatch.setattr(sift.testing, "_template", None)
    state = """
        def state(db):
            pragmas = ["journal_mode", "synchronous", "busy_timeout", "journal_size_limit", "cache_size",
                       "wal_autocheckpoint", "recursive_triggers", "foreign_keys", "user_version"]
            return {
                "schema": db.execute_sql("SELECT * FROM sqlite_master ORDER BY name").fetchall(),
                "pragmas": [db.execute_sql(f"PRAGMA {p}").fetchone() for p in pragmas],
                "totals": db.execute_sql("SELECT * FROM batch_totals").fetchall(),
                "jobs": db.execute_sql("SELECT COUNT(*) FROM batch_job").fetchone(),
                "stats": dcache.stats(),
            }
    """
    tests = "".join(
        textwrap.dedent(f"""
        def test_{i}(sift_store, make_job):
            if {i} == 0:
                REFERENCE.update(state(sift_store))  # open_db(":memory:") made this one
            assert state(sift_store) == REFERENCE
            dcache.create_batch_job(make_job())
            dcache.batch_job("missing")  # a counter moves
        """)
        for i in range(4)
    )
    result = run(
        pytester, test_same=f"from sift import dcache\nREFERENCE = {{}}\n{textwrap.dedent(state)}{tests}"
    )
    result.assert_outcomes(passed=4)
    assert opened == [":memory:"]  # the first store; the others are copies of it


def test_markers_combine_and_the_closest_wins(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        test_markers="""
        import pytest
        from sift import dcache

        pytestmark = pytest.mark.sift_store(check=True)


        @pytest.mark.sift_store(file=True, check=False)
        class TestFileStores:
            def test_from_the_class(self, sift_store, tmp_path):
                assert sift_store.database == str(tmp_path / "sift.db")
                dcache.db.execute_sql("UPDATE batch_totals SET nbytes = 1")  # check=False: not checked

            @pytest.mark.sift_store(check=True)
            def test_checked_again(self, sift_store, tmp_path):
                assert sift_store.database == str(tmp_path / "sift.db")
                dcache.db.execute_sql("UPDATE batch_totals SET nbytes = 2")


        def test_from_the_module(sift_store):
            assert sift_store.database == ":memory:"
            dcache.db.execute_sql("UPDATE batch_totals SET nbytes = 3")
        """,
    )
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(["ERROR*::test_checked_again - *", "ERROR*::test_from_the_module - *"])
    output = result.stdout.str()
    assert "batch_totals holds 2" in output and "batch_totals holds 3" in output
    assert "holds 1" not in output


def test_unknown_marker_argument_is_named(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        test_marker="""
        import pytest

        @pytest.mark.sift_store(files=True)
        def test_typo(sift_store):
            pass
        """,
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*sift_store marker: unknown argument(s) files; it takes file= and check=*"])


# -- On PostgreSQL: SIFT_TEST_DB or sift_test_db, a schema of each test's own ------------------------------

PG_SAMPLE = """
    import pytest

    from sift import dcache
    from sift.dcache.backends.postgres.connection import PostgresStore


    def test_a_store_of_its_own(sift_store, make_job, make_targets):
        assert isinstance(dcache.db.backend, PostgresStore) and sift_store is dcache.db
        assert dcache.db.backend.schema.startswith("sift_test_")
        assert dcache.BatchJob.select().count() == 0
        job = make_job(id="same-id", targets_total=2)
        dcache.create_batch_job(job, make_targets(2))
        dcache.update_batch_target(job.id, 0, "done", result="héllo")
        assert dcache.batch_nbytes() == 6


    def test_the_next_one_is_fresh_again(sift_store, make_job):
        assert dcache.BatchJob.select().count() == 0 and dcache.batch_nbytes() == 0
        dcache.create_batch_job(make_job(id="same-id"))


    @pytest.mark.sift_store(check=True)
    def test_checked_after_the_test(sift_store):
        dcache.db.execute_sql("UPDATE batch_totals SET nbytes = 5 WHERE slot = 3")


    @pytest.mark.sift_store(file=True)
    def test_a_file_marker_still_gets_a_file(sift_store, tmp_path):
        assert dcache.db.path == str(tmp_path / "sift.db")
"""


def _sift_test_schemas() -> set[str]:
    import psycopg
    from conftest import POSTGRES_URL

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (f"{sift.testing._schema_prefix}%",)
        ).fetchall()
    return {row[0] for row in rows}


@pytest.mark.parametrize("where", ["env", "ini"])
def test_on_postgresql_each_test_gets_a_schema_dropped_after(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, postgres_schema: str, where: str
) -> None:
    from conftest import POSTGRES_URL

    if where == "env":
        monkeypatch.setenv("SIFT_TEST_DB", POSTGRES_URL)
    else:
        monkeypatch.delenv("SIFT_TEST_DB", raising=False)
        pytester.makeini(f"[pytest]\nsift_test_db = {POSTGRES_URL}\n")
    result = run(pytester, "--strict-config", test_pg=PG_SAMPLE)
    result.assert_outcomes(passed=4, errors=1)  # the broken total, found in tear-down
    result.stdout.fnmatch_lines(["*the store breaks 1 invariant(s):*", "*total: batch_totals holds 5*"])
    assert dcache.db.is_closed()  # none left open
    assert _sift_test_schemas() == set()  # every schema dropped, the failing test's too


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("sqlite:///x.db", "*SIFT_TEST_DB: must be a postgresql:// URL*"),
        ("/tmp/x.db", "*SIFT_TEST_DB: must be a postgresql:// URL*"),
        ("postgresql://localhost/test?schema=mine", "*SIFT_TEST_DB: sift_store makes a schema per test*"),
    ],
)
def test_a_test_db_that_is_not_a_postgresql_url_is_refused(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("SIFT_TEST_DB", value)
    result = run(pytester, test_x="def test_x(sift_store):\n    pass\n")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_an_unreachable_server_fails_the_test_naming_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIFT_TEST_DB", "postgresql://postgres@127.0.0.1:1/test")
    result = run(pytester, test_x="def test_x(sift_store):\n    pass\n")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*StoreUnavailable*127.0.0.1:1*"])


# -- The plain functions --------------------------------------------------------------------------------


def test_make_job_is_valid_unique_and_on_the_clock(store: Any) -> None:
    with freeze_time("2024-01-02 03:04:05"):
        jobs = [make_job() for _ in range(50)]
    assert len({job.id for job in jobs}) == 50
    assert {(job.created_at, job.lease) for job in jobs} == {(1704164645, 1704164645)}
    for job in jobs:
        dcache.create_batch_job(job)
    stored = dcache.batch_job(jobs[0].id)
    assert stored is not None
    assert (stored.status, stored.targets_total, stored.targets_done, stored.nbytes) == ("queued", 1, 0, 0)


def test_make_job_overrides_any_field(store: Any) -> None:
    fields = {
        "id": "mine",
        "caller": "c",
        "caller_class": "restricted",
        "idem_key": "k",
        "status": "done",
        "error": "e",
        "targets_total": 9,
        "targets_done": 2,
        "created_at": 5,
        "lease": 6,
        "nbytes": 7,
    }
    assert make_job(**fields).__data__ == fields
    # stored, a new job's counts are 0: they follow its targets
    stored_fields = {**fields, "targets_done": 0, "nbytes": 0}
    dcache.create_batch_job(make_job(**stored_fields))
    stored = dcache.batch_job("mine")
    assert stored is not None and stored.__data__ == stored_fields


def test_make_targets_are_valid_and_distinct(store: Any) -> None:
    targets = make_targets(4)
    assert [t.idx for t in targets] == [0, 1, 2, 3]
    assert len({t.url for t in targets}) == 4
    dcache.create_batch_job(make_job(id="j", targets_total=4), targets)
    dcache.create_batch_job(
        make_job(id="k", targets_total=2), make_targets(2, url="https://x.example/", job_id="k")
    )
    stored = dcache.batch_targets("k")
    assert stored is not None and [t.url for t in stored] == ["https://x.example/"] * 2
    assert make_targets(0) == []


@pytest.mark.sqlite_only  # check_store reads SQLite files only, so far
def test_check_store_invariants_passes_on_a_clean_store(store: Any) -> None:
    dcache.create_batch_job(make_job(targets_total=2), make_targets(2))
    check_store_invariants()


@pytest.mark.sqlite_only  # check_store reads SQLite files only, so far
def test_check_store_invariants_names_every_violation(store: Any) -> None:
    dcache.create_batch_job(make_job(id="a", targets_total=2), make_targets(2))
    dcache.create_batch_job(make_job(id="b"), make_targets(1))
    dcache.db.execute_sql("UPDATE batch_job SET targets_done = 1 WHERE id = 'a'")
    dcache.db.execute_sql("UPDATE batch_target SET status = 'gone' WHERE job_id = 'b'")
    with pytest.raises(AssertionError) as raised:
        check_store_invariants()
    assert str(raised.value).splitlines() == [
        "the store breaks 2 invariant(s):",
        "  targets_done (job 'a'): targets_done is 1, but 0 targets are done or failed",
        "  target_status (job 'b'): 1 target with a status not in pending, running, done, failed: 'gone'",
    ]


def test_sift_clock_moves_by_seconds_fractions_and_timedeltas() -> None:
    test_clock = SiftClock(1_000)
    assert test_clock.advance(0.6) == 1_000
    assert test_clock.advance(0.4) == 1_001  # fractions add up
    assert test_clock.advance(datetime.timedelta(minutes=2)) == 1_121
    assert test_clock.advance(0) == 1_121
    test_clock.now = 50
    assert test_clock.now == 50


@pytest.mark.parametrize(
    ("by", "error", "message"),
    [
        (-1, ValueError, "by: the clock only moves forward"),
        (datetime.timedelta(seconds=-1), ValueError, "by: the clock only moves forward"),
        (float("nan"), TypeError, "by: must be a number of seconds or a timedelta"),
        ("5", TypeError, "by: must be a number of seconds or a timedelta"),
        (True, TypeError, "by: must be a number of seconds or a timedelta"),
    ],
)
def test_sift_clock_rejects_bad_moves(by: Any, error: type[Exception], message: str) -> None:
    test_clock = SiftClock(1_000)
    with pytest.raises(error, match=message):
        test_clock.advance(by)
    assert test_clock.now == 1_000


def test_sift_clock_now_must_be_an_int() -> None:
    with pytest.raises(TypeError, match="now: must be an int"):
        SiftClock(1).now = 1.5  # type: ignore[assignment]


def test_importing_the_store_never_imports_pytest_or_the_plugin() -> None:
    code = "import sys, sift.dcache; print(sorted(m for m in ('pytest', 'sift.testing') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
