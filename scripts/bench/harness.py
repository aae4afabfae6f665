"""The bench's harness: timing in batches, interleaved rounds, the cases and goals of a run, and its report
as text and JSON. Standard library only (and peewee's version), so that any tree's ``sift`` can run
beside it."""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

perf_ns = time.perf_counter_ns
#: The bench's directory: ``python <BENCH_DIR>`` runs it.
BENCH_DIR = Path(__file__).resolve().parent

T = TypeVar("T")

#: One timed operation: ``op(i)`` is its i-th call.
Op = Callable[[int], object]


@dataclass
class Case:
    """One measured case: the median of its samples (µs per call) at size ``n``, and what else it
    measured; ``ratio`` is against the case it is paired with."""

    name: str
    n: int
    median_us: float
    ratio: float | None = None
    samples_us: list[float] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Goal:
    """A figure judged against its limit (at most ``limit``); with no limit it is only reported."""

    name: str
    value: float
    limit: float | None
    unit: str

    @property
    def verdict(self) -> str:
        if self.limit is None:
            return "INFO"
        return "PASS" if self.value <= self.limit else "FAIL"


@dataclass
class Report:
    """The cases and goals of one run, in the order they were measured."""

    cases: list[Case] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)

    def case(self, name: str, n: int, samples: list[float], **extra: float) -> Case:
        """Add the case whose figure is the median of ``samples``; return it."""
        c = Case(name, n, statistics.median(samples), None, [round(s, 3) for s in samples], extra)
        self.cases.append(c)
        return c

    def pair(self, case: Case, base: Case) -> float:
        """Set ``case``'s ratio to its median over ``base``'s (whose ratio is 1); return it."""
        case.ratio, base.ratio = case.median_us / base.median_us, 1.0
        return case.ratio

    def goal(self, name: str, value: float, limit: float | None, unit: str) -> None:
        """Add a goal: ``value`` judged against at most ``limit`` (None: reported only)."""
        self.goals.append(Goal(name, value, limit, unit))


def log(message: str) -> None:
    """A progress line on stderr; stdout holds the report."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def time_batch(op: Op, start: int, count: int) -> float:
    """Run ``op(start) .. op(start + count - 1)``; µs per call."""
    t0 = perf_ns()
    for i in range(start, start + count):
        op(i)
    return (perf_ns() - t0) / count / 1000


def interleave(
    rounds: int, first: Op, second: Op, start: Callable[[int], int], count: int
) -> tuple[list[float], list[float]]:
    """One batch of each side per round, alternating which goes first, so that drift in the machine hits
    both; µs per call of each batch."""
    a, b = interleave_all(rounds, (first, second), start, count)
    return a, b


def interleave_all(
    rounds: int, ops: tuple[Op, ...], start: Callable[[int], int], count: int
) -> list[list[float]]:
    """:func:`interleave` of any number of sides: one batch of each per round, in the order
    :func:`alternate` gives; µs per call of each batch, a list per side."""
    samples: list[list[float]] = [[] for _ in ops]
    for rnd in range(rounds):
        for side in alternate(rnd, tuple(range(len(ops)))):
            samples[side].append(time_batch(ops[side], start(rnd), count))
    return samples


def alternate(rnd: int, sides: tuple[T, ...]) -> tuple[T, ...]:
    """The sides in the order round ``rnd`` runs them: as given on even rounds, reversed on odd ones."""
    return sides if rnd % 2 == 0 else sides[::-1]


def rotate(rnd: int, sides: tuple[T, ...]) -> tuple[T, ...]:
    """The sides in the order round ``rnd`` runs them: each round starts one side further on, so that over
    as many rounds as sides each side runs in each place once."""
    turn = rnd % len(sides)
    return sides[turn:] + sides[:turn]


def checkpoints_settled() -> None:
    """Wait for the store's checkpoint running on a thread of its own (``sift-checkpoint``): a batch's
    checkpoints then count in its own time, not in the side's measured after it."""
    for thread in threading.enumerate():
        if thread.name == "sift-checkpoint":
            thread.join()


def p99(values: list[int]) -> float:
    """The 99th percentile of ``values`` (nearest rank), 0 for none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import peewee

    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "peewee": getattr(peewee, "__version__", "unknown"),
        "platform": platform.platform(),
    }


def print_report(report: Report, info: dict[str, Any]) -> None:
    """The machine, a table of the cases, each case's extra figures, and a verdict line per goal."""
    server = f", PostgreSQL {info['postgresql']}" if "postgresql" in info else ""
    print(
        f"machine: {info['nproc']} CPUs, {info['cpu']}; Python {info['python']}, "
        f"SQLite {info['sqlite']}{server}, peewee {info['peewee']}"
    )
    print()
    width = max([34, *(len(c.name) for c in report.cases)])
    print(f"{'case':<{width}} {'N':>9} {'median µs/op':>13} {'ratio':>7}")
    print("-" * (width + 32))
    for c in report.cases:
        ratio = "" if c.ratio is None else f"{c.ratio:.2f}"
        print(f"{c.name:<{width}} {c.n:>9} {c.median_us:>13.1f} {ratio:>7}")
    print()
    for c in report.cases:
        if c.extra:
            figures = ", ".join(f"{k}={v:.3g}" for k, v in c.extra.items())
            print(f"{c.name}: {figures}")
    print()
    for g in report.goals:
        limit = "" if g.limit is None else f" (goal <= {g.limit:g} {g.unit})"
        print(f"{g.verdict}  {g.name}: {g.value:.2f} {g.unit}{limit}")


def write_json(path: Path, report: Report, **head: Any) -> None:
    """The report as JSON: ``head`` (the command, the machine, ...), then its cases and goals."""
    body = {
        **head,
        "cases": [asdict(c) for c in report.cases],
        "goals": [dict(asdict(g), verdict=g.verdict) for g in report.goals],
    }
    path.write_text(json.dumps(body, indent=2) + "\n")
