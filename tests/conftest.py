from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from sift import dcache

pytest_plugins = ["pytester"]

settings.register_profile("default", deadline=None)
settings.register_profile("deep", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dcache.StoreDatabase]:
    """The store opened in memory and on a real WAL file: every test using it runs on both."""
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
