"""The bench's tail group times the store, not the bench: its writers fork with the bench's objects frozen
out of the collector, so that a writer's first collection is never a full one over (and a copy of) the
objects it inherited."""

from __future__ import annotations

import gc
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture
def tail(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The bench's tail group (the bench is a script's package: found on the path for this test)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("bench.cases.tail")


def frozen_objects(
    path: str, queued: bool, tag: str, calls: int, workload: str, barrier: Any, out: Any
) -> None:
    """A writer that only reports how many objects it inherited frozen, as its one latency (or its error,
    as the bench's writers do, so that the parent never waits for it)."""
    try:
        barrier.wait(60)
        out.put((0, 1, [float(gc.get_freeze_count())], None))
    except BaseException as exc:
        out.put((0, 0, [], repr(exc)))


def test_writers_fork_with_the_bench_objects_frozen(
    tail: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tail, "tail_writer", frozen_objects)
    assert gc.get_freeze_count() == 0

    inherited, _ = tail.tail_round(tmp_path / "tail.db", True, "t", 1, "update_batch_target")

    assert len(inherited) == tail.TAIL_PROCESSES
    assert min(inherited) > 1000  # the test process's own objects, at least: pytest's and the package's
    assert gc.get_freeze_count() == 0  # the parent collects its objects again once the writers are forked
