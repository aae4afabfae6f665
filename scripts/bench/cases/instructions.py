"""Instructions per call, counted by callgrind (which a busy machine cannot move): the runner step of the
package, of its statements sent plainly through sqlite3, and of the seed (the careful runner on the
original schema); the package's claim of ten and write of ten results (each also as its statements sent
plainly), no-op sweep and no-op eviction (not in a quick run: each count runs Python under callgrind twice,
about 15 s a run on a 2-CPU machine). Each side runs twice in a process of its own (``bench.counted``),
with 0 and with N calls after the same warm-up; the difference over N is one call. Skipped, with a note,
when valgrind is not installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from sift import dcache

from ..fixtures import Builder
from ..harness import Report, log
from ..sizes import T0, Sizes
from .hot_paths import CLAIM_LIMIT, RUNNER_JOB
from .raw import CarefulRunner

BENCH_DIR = Path(__file__).resolve().parent.parent
#: Calls made before the counted ones, in both runs of a side.
WARM = 20
#: The runner step's sides: the package, its statements sent plainly, the seed.
STEP_SIDES = ("runner_step/package", "runner_step/package_sql", "runner_step/sqlite3")
#: The package's other paths, counted alone.
PACKAGE_PATHS = (
    "claim_batch_targets/package",
    "claim_batch_targets/package_sql",
    "update_batch_targets_10/package",
    "update_batch_targets_10/package_sql",
    "sweep_batch_noop/package",
    "evict_batch_oldest_noop/package",
)
#: The goal: the package's runner step, its claim and its write of ten results, each in at most this many
#: times its statements' instructions.
STEP_GOAL = 1.2
_TOTAL = re.compile(rb"^(?:summary|totals): (\d+)", re.M)


def valgrind() -> str | None:
    return shutil.which("valgrind")


def fresh_copy(source: Path, path: Path) -> Path:
    """``source`` copied to ``path``, with no -wal or -shm file of an earlier copy there."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(source, path)
    return path


def _counted_module(*argv: str, under: Sequence[str] = ()) -> None:
    """``python -m bench.counted ARGV``, under ``under`` (callgrind's command line) if given."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(BENCH_DIR.parent), os.environ.get("PYTHONPATH", "")])
    )
    env["PYTHONHASHSEED"] = "0"  # the same dicts and sets in every run
    subprocess.run(
        [*under, sys.executable, "-m", "bench.counted", *argv],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def counted(tool: str, case: str, source: Path, work: Path, steps: int, recorded: Path | None = None) -> int:
    """The instructions of one run of ``bench.counted`` on a fresh copy of ``source``."""
    path = fresh_copy(source, work / f"counted-{steps}.db")
    out = work / f"callgrind-{steps}.out"
    extra = [] if recorded is None else [str(recorded)]
    under = [tool, "--tool=callgrind", f"--callgrind-out-file={out}"]
    _counted_module(case, str(path), str(WARM), str(steps), *extra, under=under)
    match = _TOTAL.search(out.read_bytes())
    if match is None:
        raise RuntimeError(f"instructions: no total in {out}")
    return int(match.group(1))


def record_claims(source: Path, work: Path, calls: int) -> Path:
    """The statements of ``calls`` package claims on a fresh copy of ``source``, recorded (not counted)."""
    out = work / "claims.pickle"
    _counted_module("record", str(fresh_copy(source, work / "recorded.db")), str(calls), str(out))
    return out


def per_call(tool: str, case: str, source: Path, work: Path, steps: int) -> float:
    """One call's instructions: (the run with ``steps`` calls - the run with none) / ``steps``."""
    recorded = (
        record_claims(source, work, WARM + steps) if case == "claim_batch_targets/package_sql" else None
    )
    return (
        counted(tool, case, source, work, steps, recorded) - counted(tool, case, source, work, 0, recorded)
    ) / steps


def build(tmp: Path, steps: int) -> dict[str, Path]:
    """The fixture of each side: a store with the runner's job, the bulk job and a few finished jobs; the
    same file for the statements' side; the seed's copy on the original schema."""
    package = tmp / "instructions-package.db"
    b = Builder(package)
    b.jobs("job-", 100, targets=2, result_bytes=100, lease0=T0)
    calls = WARM + steps + 1
    b.one_job(
        RUNNER_JOB,
        caller="caller-0",
        status="running",
        targets=CLAIM_LIMIT * calls,
        result_bytes=None,
        lease=T0 + 1,
    )
    b.one_job(
        "bulk", caller="caller-1", status="running", targets=10 * calls, result_bytes=None, lease=T0 + 1
    )
    b.close()
    dcache.open_db(package)  # the speed schema, as the package leaves a file
    dcache.close_db()
    careful = CarefulRunner(tmp / "instructions-original.db", package)
    careful.close()
    return {"package": package, "package_sql": package, "sqlite3": tmp / "instructions-original.db"}


def bench_instructions(tmp: Path, sizes: Sizes, report: Report) -> None:
    """Instructions per call of the runner step (three sides) and of the package's other hot paths."""
    tool = valgrind()
    if tool is None:
        log("instructions: skipped, valgrind is not installed (apt-get install valgrind)")
        return
    steps = sizes.instruction_steps
    files = build(tmp, steps)
    work = tmp / "instructions"
    work.mkdir(exist_ok=True)
    counts: dict[str, float] = {}
    for case in STEP_SIDES + (PACKAGE_PATHS if sizes.instruction_paths else ()):
        counts[case] = per_call(tool, case, files[case.rsplit("/", 1)[1]], work, steps)
        log(f"instructions: {case}: {counts[case]:,.0f} per call")
    cases = {case: report.case(f"instructions/{case}", steps, [count]) for case, count in counts.items()}
    package, plain, seed = (cases[c] for c in STEP_SIDES)
    ratio = package.median_us / plain.median_us
    package.ratio, plain.ratio, seed.ratio = ratio, 1.0, seed.median_us / plain.median_us
    report.goal(
        "runner step in instructions (callgrind): the package / its statements sent plainly",
        ratio,
        STEP_GOAL,
        "x",
    )
    report.goal(
        "runner step in instructions (callgrind): the package / the seed (careful sqlite3, original schema)",
        package.median_us / seed.median_us,
        None,
        "x",
    )
    for path, what in (
        ("claim_batch_targets", "claim of 10"),
        ("update_batch_targets_10", "update_batch_targets of 10"),
    ):
        if f"{path}/package" in cases:
            mine, plain = cases[f"{path}/package"], cases[f"{path}/package_sql"]
            mine.ratio, plain.ratio = mine.median_us / plain.median_us, 1.0
            report.goal(
                f"{what} in instructions (callgrind): the package / its statements, plainly",
                mine.ratio,
                STEP_GOAL,
                "x",
            )
