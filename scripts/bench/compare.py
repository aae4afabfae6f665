"""The hot paths of this tree's ``sift`` against another commit's, side by side in one run.

The other commit is checked out into a temporary git worktree. Each side is a process of its own
(``bench.side``) whose ``sift`` is its tree's, since two versions of one package cannot share a process; both
run this tree's case code. Each side creates its store with its own ``sift`` (a SQLite file, or a PostgreSQL
schema), then the same rows go into both. Each round times one batch of each case on each side, the sides'
order alternating, so that drift in the machine hits both. A case's ratio is this tree's median over the
other's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import IO

from .cases.claims import CLAIM_JOB_TARGETS
from .cases.hot_paths import CLAIM_LIMIT, COMPARED_CASES, RUNNER_JOB
from .fixtures import Builder, PgBuilder
from .harness import BENCH_DIR, Report, alternate, log
from .sizes import T0, Sizes
from .stores import POSTGRES, SQLITE, PgServer, StoreUnderTest

#: The repository the bench belongs to: "this tree".
REPO = BENCH_DIR.parents[1]
#: A comparison's goal: this tree within 10% of the other, the noise between the two interleaved sides
#: of one run on a shared machine.
NO_WORSE = 1.1


def resolve(parser: argparse.ArgumentParser, rev: str) -> str:
    """The commit ``rev`` names in this repository; a usage error if none."""
    got = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if got.returncode != 0:
        parser.error(f"--compare-with {rev}: not a commit of {REPO}")
    return got.stdout.strip()


def git(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A git command in this repository, its output captured."""
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=check)


def run(
    rev: str,
    commit: str,
    sizes: Sizes,
    run_sqlite: bool,
    pg_url: str | None,
    report: Report,
    info: dict[str, object],
) -> list[str]:
    """Compare on each kind of store chosen; the kinds measured. The worktree is gone afterwards."""
    with tempfile.TemporaryDirectory(prefix="sift-bench-compare-") as tmp_name:
        tmp = Path(tmp_name)
        other = tmp / "tree"
        info["worktree"] = str(other)
        git("worktree", "add", "--detach", "--quiet", str(other), commit)
        try:
            trees = {"this": REPO, rev: other}
            if run_sqlite:
                paths = {side: tmp / f"hot-{k}.db" for k, side in enumerate(trees)}
                builders = {side: partial(Builder, path) for side, path in paths.items()}
                measure(SQLITE, trees, {s: str(p) for s, p in paths.items()}, builders, sizes, report, tmp)
            if pg_url is not None:
                server = PgServer(pg_url)
                info["postgresql"] = server.version
                info["postgresql_schemas"] = f"{server.tag}_*"  # all dropped at the end
                try:
                    schemas = {side: server.new_schema(f"compare{k}") for k, side in enumerate(trees)}
                    targets = {side: server.target(schema) for side, schema in schemas.items()}
                    pg_builders = {
                        side: partial(PgBuilder, server, schema, create=False)
                        for side, schema in schemas.items()
                    }
                    measure(POSTGRES, trees, targets, pg_builders, sizes, report, tmp)
                finally:
                    server.close()
        finally:
            git("worktree", "remove", "--force", str(other), check=False)
    return ["sqlite"] * run_sqlite + ["postgresql"] * (pg_url is not None)


def build(b: Builder | PgBuilder, sizes: Sizes) -> None:
    """The compared store: retained history, queued jobs with a quarter more pending targets than every
    claim takes, and the runner's job, created after them so that no claim takes its targets."""
    calls = sizes.warmup + sizes.compare_rounds * sizes.compare_ops
    b.jobs(
        "job-", sizes.flat_small, targets=sizes.targets_per_job, result_bytes=sizes.retained_result, lease0=T0
    )
    jobs = calls * CLAIM_LIMIT * 5 // 4 // CLAIM_JOB_TARGETS + 1
    b.jobs("claim-", jobs, targets=CLAIM_JOB_TARGETS, result_bytes=None, lease0=T0 + 1, statuses=("queued",))
    lease = T0 + sizes.flat_small + jobs + 1
    b.one_job(RUNNER_JOB, caller="caller-0", status="running", targets=calls, result_bytes=None, lease=lease)
    b.close()


class Side:
    """A running ``bench.side`` process: one tree's ``sift`` on one store."""

    def __init__(self, tree: Path, target: str, warmup: int, cwd: Path) -> None:
        """Start the process; it returns once the process has created its store."""
        # This tree's bench, the measured tree's sift; cwd holds neither, so no other sift comes first.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(BENCH_DIR.parent)]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.side", target, str(tree), str(warmup)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        self.answer()  # "created"

    def open(self) -> None:
        """Open the store, now filled, and warm up."""
        self.send("open")
        self.answer()  # "ready"

    def send(self, line: str) -> None:
        """One command line to the process."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n")
        self.proc.stdin.flush()

    def answer(self) -> str:
        """The process's next line; an error if it stopped instead."""
        out: IO[str] | None = self.proc.stdout
        line = out.readline() if out is not None else ""
        if not line:
            raise RuntimeError(f"bench.side stopped (exit {self.proc.wait()})")
        return line.strip()

    def time(self, case: str, count: int) -> float:
        """µs per call of the next ``count`` calls of ``case``."""
        self.send(f"{case} {count}")
        return float(self.answer())

    def close(self) -> None:
        """End its input (it closes its store) and wait for it to exit."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.proc.wait(timeout=60) != 0:
            raise RuntimeError(f"bench.side failed (exit {self.proc.returncode})")


def measure(
    store: StoreUnderTest,
    trees: dict[str, Path],
    targets: dict[str, str],
    builders: Mapping[str, Callable[[], Builder | PgBuilder]],
    sizes: Sizes,
    report: Report,
    cwd: Path,
) -> None:
    """Fill each side's store once its process created it, then time the compared cases on both sides,
    interleaved; add each side's case and this tree's ratio."""
    this, rev = trees
    sides: dict[str, Side] = {}
    samples: dict[tuple[str, str], list[float]] = {(s, c): [] for s in trees for c in COMPARED_CASES}
    try:
        for name, tree in trees.items():
            sides[name] = Side(tree, targets[name], sizes.warmup, cwd)
            build(builders[name](), sizes)
            sides[name].open()
        for rnd in range(sizes.compare_rounds):
            for case in COMPARED_CASES:
                for name in alternate(rnd, (this, rev)):
                    samples[name, case].append(sides[name].time(case, sizes.compare_ops))
    finally:
        for side in sides.values():
            side.close()
    log(f"compare: {store.name}: {sizes.compare_rounds} rounds of {sizes.compare_ops} calls of each case")
    for case in COMPARED_CASES:
        name = f"{store.prefix}compare/{case}"
        mine = report.case(f"{name}/this", sizes.flat_small, samples[this, case])
        theirs = report.case(f"{name}/base", sizes.flat_small, samples[rev, case])
        ratio = report.pair(mine, theirs)
        report.goal(
            f"{store.goal_prefix}no slower than {rev}: {case}, this tree / {rev}", ratio, NO_WORSE, "x"
        )
