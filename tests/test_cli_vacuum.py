"""``sift vacuum`` and the free-space lines of ``sift stats``."""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from cli_helpers import connect_ro, dump, run
from space_helpers import fill, old_store

from sift import dcache


@pytest.fixture
def swept_old_store(tmp_path: Path) -> Path:
    """A store made before incremental auto-vacuum, most of it swept, closed."""
    path = tmp_path / "old.db"
    old_store(path)
    dcache.close_db()
    return path


def pragmas(path: Path) -> tuple[int, int, int, int]:
    """page_size, page_count, freelist_count, auto_vacuum, read with plain sqlite3."""
    with closing(connect_ro(path)) as conn:
        names = ("page_size", "page_count", "freelist_count", "auto_vacuum")
        a, b, c, d = (conn.execute(f"PRAGMA {name}").fetchone()[0] for name in names)
        return a, b, c, d


def test_stats_shows_free_pages_and_reclaimable_bytes(
    swept_old_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page_size, pages, free, auto_vacuum = pragmas(swept_old_store)
    assert free > 100 and auto_vacuum == 0
    code, out, _ = run(capsys, "--db", swept_old_store, "stats", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["page_size"] == page_size and report["pages"] == pages
    assert report["free_pages"] == free
    assert report["reclaimable_bytes"] == free * page_size
    assert report["auto_vacuum"] == "none"
    code, out, _ = run(capsys, "--db", swept_old_store, "stats")
    lines = out.splitlines()
    assert f"Free pages    {free:,} of {pages:,} 4.0 KiB pages (auto_vacuum none)" in lines
    reclaimable = next(line for line in lines if line.startswith("Reclaimable"))
    assert f"({free * page_size:,} bytes)" in reclaimable and "`sift vacuum`" in reclaimable


def test_vacuum_converts_an_old_store_once_with_a_warning(
    swept_old_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = dump(swept_old_store)
    big = os.path.getsize(swept_old_store)
    code, out, err = run(capsys, "--db", swept_old_store, "vacuum", "--json")
    assert code == 0
    assert "rewrites the whole file" in err
    report = json.loads(out)
    assert report["converted"] is True
    assert report["before"]["free_pages"] > 100 and report["after"]["free_pages"] == 0
    assert pragmas(swept_old_store)[2:] == (0, 2)
    assert os.path.getsize(swept_old_store) < big / 3
    assert dump(swept_old_store) == rows
    code, out, err = run(capsys, "--db", swept_old_store, "vacuum")  # converted: no warning, no rewrite
    assert (code, err) == (0, "")
    assert out.startswith(f"vacuumed {swept_old_store}: ")


def test_vacuum_of_a_new_store_warns_of_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "new.db"
    assert run(capsys, "init", "--db", path)[0] == 0
    code, out, err = run(capsys, "--db", path, "vacuum", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["converted"] is False
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)


def test_stats_on_an_incremental_store_says_sweeps_give_pages_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "new.db"
    dcache.open_db(path)
    fill(20)
    dcache.db.execute_sql("DELETE FROM batch_target")  # not through a sweep: the pages stay free
    dcache.close_db()
    page_size, pages, free, auto_vacuum = pragmas(path)
    assert free > 10 and auto_vacuum == 2
    code, out, _ = run(capsys, "--db", path, "stats")
    assert code == 0
    lines = out.splitlines()
    assert f"Free pages    {free:,} of {pages:,} 4.0 KiB pages (auto_vacuum incremental)" in lines
    reclaimable = next(line for line in lines if line.startswith("Reclaimable"))
    assert reclaimable.endswith(
        f"({free * page_size:,} bytes): the next sweep or eviction gives them back, or `sift vacuum`"
    )
