"""open_db(path, durable=True): every connection the store opens writes with synchronous=FULL; the default
stays NORMAL. (What it costs: "Durability" in docs/explanation/performance.md, by the bench.)"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sift import dcache
from sift.testing import make_job, make_targets

#: PRAGMA synchronous as SQLite reports it.
NORMAL, FULL = 1, 2
STORE_NAME = "store.db"


class Recorded(sqlite3.Connection):
    """A connection that notes its own settings when it closes (the store closes some at once)."""

    seen: list[tuple[int, int]]  # the settings of those closed
    closed: list[Recorded]
    watched: list[Recorded]

    def settings(self) -> tuple[int, int]:
        """(query_only, synchronous) of this connection."""
        return (
            self.execute("PRAGMA query_only").fetchone()[0],
            self.execute("PRAGMA synchronous").fetchone()[0],
        )

    def close(self) -> None:
        if self in self.watched and self not in self.closed:
            self.seen.append(self.settings())
            self.closed.append(self)
        super().close()


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Recorded]]:
    """Every sqlite3 connection opened while the test runs, recording its settings as it closes."""
    opened: list[Recorded] = []
    Recorded.seen, Recorded.closed, Recorded.watched = [], [], opened
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real(*args, **kwargs, factory=Recorded)
        assert isinstance(conn, Recorded)
        # the store file's (not a new file's header being written), and not a read-only open
        if str(args[0]).endswith(STORE_NAME):
            opened.append(conn)
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    yield opened
    dcache.close_db()


@pytest.mark.sqlite_only
@pytest.mark.parametrize(("durable", "expected"), [(False, NORMAL), (True, FULL)])
def test_every_writing_connection_has_the_store_synchronous_setting(
    tmp_path: Path, connections: list[Recorded], durable: bool, expected: int
) -> None:
    path = tmp_path / STORE_NAME
    kwargs = {"durable": True} if durable else {}
    dcache.open_db(path, **kwargs)
    assert dcache.db.execute_sql("PRAGMA synchronous").fetchone()[0] == expected
    dcache.create_batch_job(make_job(id="a", targets_total=3), make_targets(3))
    dcache.update_batch_target("a", 0, "done", result="x" * 100)
    dcache.db.checkpoint()  # the checkpoints' own connection
    dcache.close_db()  # the shared connection closes; the next call opens a new one on the same file
    dcache.update_batch_target("a", 1, "done", result="y")
    assert dcache.db.execute_sql("PRAGMA synchronous").fetchone()[0] == expected
    dcache.check_store()  # reads the whole file beside the shared connection
    still_open = [conn.settings() for conn in connections if conn not in Recorded.closed]
    writing = [sync for query_only, sync in [*Recorded.seen, *still_open] if not query_only]
    # the first shared connection, its successor, the checkpoints' connection
    assert len(writing) >= 3
    assert writing == [expected] * len(writing)


@pytest.mark.sqlite_only
def test_durable_is_a_setting_of_one_open(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path, durable=True)
    assert dcache.db.execute_sql("PRAGMA synchronous").fetchone()[0] == FULL
    dcache.open_db(path)
    try:
        assert dcache.db.execute_sql("PRAGMA synchronous").fetchone()[0] == NORMAL
    finally:
        dcache.close_db()


@pytest.mark.parametrize("flag", ["readonly", "create", "durable"])
@pytest.mark.parametrize("value", ["yes", "no", 1, 0, None])
def test_a_flag_that_is_not_a_bool_is_refused_naming_it(tmp_path: Path, flag: str, value: Any) -> None:
    path = tmp_path / "store.db"
    with pytest.raises(dcache.InvalidBatchInput) as info:
        dcache.open_db(path, **{flag: value})
    assert info.value.field == flag
    assert not path.exists()  # nothing opened, nothing made
