"""A damaged file: random bytes over pages of a copy of a populated store. Every public function either
works or raises StoreCorrupt, with the sqlite3 error as ``__cause__``; none leaks a driver exception. The
``sift`` command says so in one line, and exits 1."""

from __future__ import annotations

import random
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from faults import PUBLIC_CALLS, damage, populate, public_functions

from sift import dcache
from sift.cli import main

pytestmark = pytest.mark.sqlite_only


def make_store(directory: Path, kind: str) -> Path:
    """A closed store to copy and damage: 40 jobs whose results fill most pages (about 500 KB), or 3,000
    jobs without results, whose table and index pages fill the file (about 900 KB)."""
    path = directory / "store.db"
    dcache.open_db(path)
    if kind == "results":
        populate(40)
    else:
        populate(3_000, results=False)
    dcache.close_db()
    return path


@pytest.fixture(scope="module", params=["results", "rows"])
def pristine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tmp_path_factory.mktemp("pristine"), request.param)


@pytest.fixture(scope="module")
def with_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tmp_path_factory.mktemp("pristine"), "results")


def damaged_copy(pristine: Path, directory: Path, at: float, seed: int = 13) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / "damaged.db"
    shutil.copy(pristine, path)
    damage(path, at, seed)
    return path


def assert_corrupt(exc: dcache.StoreCorrupt) -> None:
    assert isinstance(exc.__cause__, sqlite3.DatabaseError), repr(exc.__cause__)
    assert exc.__cause__.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


@pytest.mark.slow
@pytest.mark.parametrize("at", [0.1, 0.25, 0.5, 0.75, 0.95])
@pytest.mark.parametrize("seed", [1, 2])
def test_every_function_works_or_raises_store_corrupt(
    pristine: Path, tmp_path: Path, at: float, seed: int
) -> None:
    """8 KiB of random bytes from a page at fraction ``at`` of the file: each function runs on its own
    damaged copy, opened afresh; opening may fail too, with StoreCorrupt."""
    met: list[str] = []
    for name in public_functions():
        path = damaged_copy(pristine, tmp_path / name, at, seed)
        try:
            dcache.open_db(path)
            PUBLIC_CALLS[name](path)
        except dcache.StoreCorrupt as exc:
            assert_corrupt(exc)
            met.append(name)
        finally:
            dcache.close_db()
    assert met  # every spot damaged is met by some function (sweep_batch reads every page it frees)


def test_the_middle_of_the_file_is_met_by_sweep_not_by_open(with_results: Path, tmp_path: Path) -> None:
    """As the issue found by hand: open, a read by id and a create work; sweep_batch meets the damage."""
    dcache.open_db(damaged_copy(with_results, tmp_path, 0.5))
    try:
        assert dcache.batch_job("job-1") is not None
        PUBLIC_CALLS["create_batch_job"](tmp_path)
        with pytest.raises(dcache.StoreCorrupt, match=r"run `sift check --db .*` to see the damage") as info:
            dcache.sweep_batch(0, now=10**6)
        assert_corrupt(info.value)
    finally:
        dcache.close_db()


def test_a_damaged_header(pristine: Path, tmp_path: Path) -> None:
    path = damaged_copy(pristine, tmp_path, 0)
    with pytest.raises(
        dcache.StoreCorrupt, match=r"^path: cannot open .* as a batch store: database"
    ) as info:
        dcache.open_db(path)
    assert_corrupt(info.value)
    with pytest.raises(dcache.StoreNotOpen):
        dcache.batch_job("job-1")


def test_the_cli_prints_one_line(
    with_results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = damaged_copy(with_results, tmp_path, 0.5)
    assert main(["sweep", "--ttl", "0", "--db", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"sift: database: {str(path)!r} is damaged (SQLITE_CORRUPT")


@pytest.mark.slow
def test_damage_met_after_the_first_row(tmp_path: Path) -> None:
    """sqlite3 runs a query to its first row in ``execute`` and reads the rest in ``fetchall``: a damaged
    page met there is StoreCorrupt too. Here: the second leaf page of batch_job, read by sweep_batch's
    first query (in lease order, by the lease index), after the rows of the first page."""
    path = make_store(tmp_path, "rows")
    with closing(sqlite3.connect(path)) as conn:
        leaves = conn.execute(
            "SELECT pageno FROM dbstat WHERE name = 'batch_job' AND pagetype = 'leaf' ORDER BY pageno"
        ).fetchall()
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    dcache.open_db(path)
    try:
        dcache.close_db()  # the next call connects again, without open_db's read of every job
        with open(path, "r+b") as f:
            f.seek((leaves[1][0] - 1) * page_size)
            f.write(random.Random(1).randbytes(page_size))
        with pytest.raises(dcache.StoreCorrupt) as info:
            dcache.sweep_batch(0, now=10**6)
        assert_corrupt(info.value)
    finally:
        dcache.close_db()
