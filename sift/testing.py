"""Testing support for apps built on :mod:`sift.dcache`: a pytest plugin, factories, a test clock and the
store's invariant check.

Enable it in your ``conftest.py`` (it is never loaded on its own)::

    pytest_plugins = ["sift.testing"]

Fixtures:

- ``sift_store``: a fresh, empty store opened for the test (in memory) and closed after it, even when the
  test fails; it yields the opened database. ``@pytest.mark.sift_store(file=True)`` opens a WAL file in
  ``tmp_path`` instead, and ``@pytest.mark.sift_store(check=True)`` runs :func:`check_store_invariants`
  after the test. The store is the process's one database (``sift.dcache.db``): opening it closes any
  store opened before, and after the test none is open. With ``SIFT_TEST_DB`` (or the ini option
  ``sift_test_db``) set to a ``postgresql://`` URL, each test's store is a new schema of its own in that
  database instead of memory (created by ``open_db(url?schema=...)``, dropped after the test); a marker's
  ``file=True`` still gets a SQLite file.
- ``sift_clock``: the store's clock under the test's control (see :class:`SiftClock`).
- ``make_job`` and ``make_targets``: the functions of the same names.

This module imports pytest; :mod:`sift.dcache` never imports this module. Its asserts are not rewritten
(PYTEST_DONT_REWRITE), so a conftest may import from it before or after enabling it, without a warning.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import secrets
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, clock, db, jsontext
from sift.dcache.backends import SQLITE
from sift.dcache.counters import counters

__all__ = ["SiftClock", "check_store_invariants", "make_job", "make_targets"]

_MARKER = "sift_store"
_MARKER_ARGS = frozenset({"file", "check"})


def make_job(**fields: Any) -> BatchJob:
    """A valid unsaved queued job of one target, with a unique id and the store clock's now (a running
    ``sift_clock``'s, else the system time) as ``created_at`` and ``lease``; ``fields`` override any
    column."""
    now = clock.unix_now()
    values: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "caller": "test-caller",
        "caller_class": dcache.CallerClass.FLEET.value,
        "idem_key": "",
        "status": dcache.JobStatus.QUEUED.value,
        "error": "",
        "targets_total": 1,
        "targets_done": 0,
        "created_at": now,
        "lease": now,
        "nbytes": 0,
    }
    values.update(fields)
    return BatchJob(**values)


def make_targets(n: int, **fields: Any) -> list[BatchTarget]:
    """``n`` valid unsaved pending targets, idx ``0..n-1``, each with its own URL; ``fields`` override any
    column of every target (set ``job_id`` or leave it to ``create_batch_job``). ``options`` follows the
    store's rule: a dict or list becomes compact JSON text, other text must be JSON, anything else is
    ``InvalidBatchInput`` (field ``options``)."""
    if "options" in fields:
        fields = {**fields, "options": jsontext.checked_options(fields["options"])}
    targets = []
    for idx in range(n):
        values: dict[str, Any] = {
            "idx": idx,
            "url": f"https://example.com/{idx}",
            "options": "{}",
            "status": dcache.TargetStatus.PENDING.value,
        }
        values.update(fields)
        targets.append(BatchTarget(**values))
    return targets


def check_store_invariants() -> None:
    """Raise ``AssertionError`` naming every violation :func:`sift.dcache.check_store` finds in the open
    store (counts, bytes, byte total, orphan targets, statuses, idx ranges); it changes nothing."""
    report = dcache.check_store()
    if not report.ok:
        lines = "\n".join(f"  {violation}" for violation in report.violations)
        raise AssertionError(f"the store breaks {len(report.violations)} invariant(s):\n{lines}")


class SiftClock:
    """The store's clock under a test's control: while the ``sift_clock`` fixture runs, every default
    ``now`` of the store (and :func:`sift.dcache.unix_now`) is ``now``, which moves only when the test
    moves it. It starts at the time the fixture was set up.

    With freezegun: the fixture starts at freezegun's frozen time if time is frozen when it is set up,
    and from then on the store follows this clock, not freezegun (freezegun still controls ``time`` and
    ``datetime`` for the rest of the code). After the test the store reads the system time again.
    """

    def __init__(self, now: int) -> None:
        self._micros = now * 1_000_000  # whole seconds show in now; fractions of advance() add up

    @property
    def now(self) -> int:
        """The store's current unix second."""
        return self._micros // 1_000_000

    @now.setter
    def now(self, value: int) -> None:
        if type(value) is not int:
            raise TypeError(f"now: must be an int of unix seconds, got {type(value).__name__}")
        self._micros = value * 1_000_000

    def time(self) -> float:
        """The store's current unix time with its fraction of a second (what pacing reads)."""
        return self._micros / 1_000_000

    def advance(self, by: float | datetime.timedelta) -> int:
        """Move the clock forward by ``by`` seconds (a number or a timedelta); return the new ``now``."""
        if isinstance(by, datetime.timedelta):
            micros = by // datetime.timedelta(microseconds=1)
        elif isinstance(by, (int, float)) and not isinstance(by, bool) and math.isfinite(by):
            micros = round(by * 1_000_000)
        else:
            raise TypeError(f"by: must be a number of seconds or a timedelta, got {by!r}")
        if micros < 0:
            raise ValueError(f"by: the clock only moves forward, got {by!r}")
        self._micros += micros
        return self.now


# -- The plugin ----------------------------------------------------------------------------------------

# The in-memory store as open_db(":memory:") creates it, made once per session: each test copies it into
# a connection opened with open_db's own settings (SQLite's backup API), which costs a fraction of
# creating the schema again. Valid while db keeps the settings it had when the template was made.
_template: sqlite3.Connection | None = None
_template_params: object = None

#: The PostgreSQL database the session's stores go in (``SIFT_TEST_DB`` or ``sift_test_db``), or None.
_postgres_url: str | None = None
#: What makes each test's schema name unique, across processes and machines sharing the server.
_schema_prefix = f"sift_test_{os.getpid()}_{secrets.token_hex(4)}"
_schemas = 0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "sift_test_db",
        "a postgresql:// URL: sift_store makes each test's store a new schema of its own in that database",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "sift_store(file=False, check=False): sift_store on a WAL file in tmp_path (file=True); "
        "check_store_invariants() after the test (check=True)",
    )
    global _postgres_url
    _postgres_url = None
    for name, value in (
        ("SIFT_TEST_DB", os.environ.get("SIFT_TEST_DB")),
        ("sift_test_db", config.getini("sift_test_db")),
    ):
        if not value:
            continue
        if not value.startswith(("postgresql://", "postgres://")):
            raise pytest.UsageError(
                f"{name}: must be a postgresql:// URL (sift_store is in memory without it), got {value!r}"
            )
        if "schema=" in value.partition("?")[2]:
            raise pytest.UsageError(f"{name}: sift_store makes a schema per test; leave ?schema= out")
        _postgres_url = value
        return  # the environment wins over the ini file


@pytest.fixture
def sift_store(request: pytest.FixtureRequest) -> Iterator[dcache.StoreDatabase]:
    """A fresh, empty store for the test, in memory, closed after it even when the test fails; yields the
    opened database. ``@pytest.mark.sift_store(file=True)``: a WAL file in ``tmp_path`` instead;
    ``check=True``: ``check_store_invariants()`` after the test. The closest marker's arguments win."""
    options = _marker_options(request)
    schema = None
    if options.get("file"):
        tmp_path = request.getfixturevalue("tmp_path")
        opened = dcache.open_db(tmp_path / "sift.db")
    elif _postgres_url is not None:
        schema, opened = _open_postgres(_postgres_url)
    else:
        opened = _open_in_memory()
    try:
        yield opened
        if options.get("check"):
            check_store_invariants()
    finally:
        dcache.close_db()
        if schema is not None:
            _drop_schema(_postgres_url or "", schema)


@pytest.fixture
def sift_clock() -> Iterator[SiftClock]:
    """The store's clock under the test's control (:class:`SiftClock`); reset after the test."""
    test_clock = SiftClock(clock.unix_now())
    previous = clock.set_test_clock(test_clock.time)
    try:
        yield test_clock
    finally:
        clock.set_test_clock(previous)


@pytest.fixture(name="make_job")
def _make_job_fixture() -> Callable[..., BatchJob]:
    """:func:`make_job`."""
    return make_job


@pytest.fixture(name="make_targets")
def _make_targets_fixture() -> Callable[..., list[BatchTarget]]:
    """:func:`make_targets`."""
    return make_targets


def _marker_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for marker in reversed(list(request.node.iter_markers(_MARKER))):  # the closest marker wins
        if marker.args or set(marker.kwargs) - _MARKER_ARGS:
            unknown = [repr(a) for a in marker.args] + sorted(set(marker.kwargs) - _MARKER_ARGS)
            pytest.fail(
                f"sift_store marker: unknown argument(s) {', '.join(unknown)}; it takes file= and check=",
                pytrace=False,
            )
        options.update(marker.kwargs)
    return options


def _open_in_memory() -> dcache.StoreDatabase:
    global _template, _template_params
    dcache.close_db()
    if _template is None or db.database != ":memory:" or db.connect_params is not _template_params:
        dcache.open_db(":memory:")
        template = sqlite3.connect(":memory:", check_same_thread=False)
        _connection().backup(template)
        _template, _template_params = template, db.connect_params
        return db
    SQLITE.open_memory_copy(_template)
    counters.reset()
    return db


def _open_postgres(url: str) -> tuple[str, dcache.StoreDatabase]:
    """A new schema of the test's own in the database at ``url``, opened as the store."""
    global _schemas
    _schemas += 1
    schema = f"{_schema_prefix}_{_schemas}"
    try:
        return schema, dcache.open_db(f"{url}{'&' if '?' in url else '?'}schema={schema}")
    except BaseException:
        with contextlib.suppress(Exception):  # the error raised says more (no server, say)
            _drop_schema(url, schema)
        raise


def _drop_schema(url: str, schema: str) -> None:
    import psycopg  # sift[postgres]'s: only a PostgreSQL run gets here

    from sift.dcache.backends import parse_target

    with psycopg.connect(parse_target(url)[0], autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _connection() -> sqlite3.Connection:
    return db.connection()  # type: ignore[no-any-return]
