"""What the pytest plugin's ``sift_store`` fixture costs a test."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from ..harness import Report, perf_ns
from ..sizes import Sizes

PLUGIN_CONFTEST = """
import json
import os

pytest_plugins = ["sift.testing"]
durations = []


def pytest_runtest_logreport(report):
    if report.when in ("setup", "teardown"):
        durations.append(report.duration)


def pytest_sessionfinish(session):
    with open(os.environ["SIFT_BENCH_DURATIONS"], "w") as f:
        json.dump(sum(durations), f)
"""


def bench_testing(tmp: Path, sizes: Sizes, report: Report) -> None:
    """What sift_store costs a test: pytest runs of N tests that use it (in memory) against N empty tests,
    in the same project, alternating; the difference per test is its set-up and tear-down."""
    project = tmp / "plugin-project"
    project.mkdir()
    (project / "conftest.py").write_text(PLUGIN_CONFTEST)
    parametrize = f"import pytest\n\n\n@pytest.mark.parametrize('i', range({sizes.plugin_tests}))\n"
    (project / "test_empty.py").write_text(parametrize + "def test_empty(i):\n    pass\n")
    (project / "test_store.py").write_text(parametrize + "def test_store(sift_store, i):\n    pass\n")
    out = tmp / "durations.json"
    env = dict(os.environ, SIFT_BENCH_DURATIONS=str(out))
    wall: dict[str, list[float]] = {"test_empty.py": [], "test_store.py": []}
    hooks: dict[str, list[float]] = {"test_empty.py": [], "test_store.py": []}
    for rnd in range(sizes.plugin_rounds):
        for name in sorted(wall, reverse=rnd % 2 == 1):
            t0 = perf_ns()
            subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name],
                cwd=project,
                env=env,
                check=True,
                capture_output=True,
            )
            wall[name].append((perf_ns() - t0) / 1e3 / sizes.plugin_tests)
            hooks[name].append(json.loads(out.read_text()) * 1e6 / sizes.plugin_tests)
    n = sizes.plugin_tests
    empty = report.case("testing/empty_tests", n, wall["test_empty.py"])
    store = report.case("testing/sift_store_tests", n, wall["test_store.py"])
    paired = [s - e for s, e in zip(wall["test_store.py"], wall["test_empty.py"], strict=True)]
    store.extra = {
        "per_test_us": statistics.median(paired),
        "setup_teardown_us": statistics.median(hooks["test_store.py"]),
        "setup_teardown_empty_us": statistics.median(hooks["test_empty.py"]),
    }
    report.pair(store, empty)
    report.goal(
        f"cheap fixture: sift_store set-up+tear-down per test, {n} tests with it - {n} empty tests",
        statistics.median(paired) / 1e3,
        1,
        "ms",
    )
