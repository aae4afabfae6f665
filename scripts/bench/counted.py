"""One counted run of the instructions group: ``python -m bench.counted CASE PATH WARM STEPS``, under
callgrind. It opens PATH as CASE's side does, makes WARM calls, then STEPS more, and exits: the bench runs
it with STEPS 0 and with STEPS N, and the difference of the two totals over N is one call's instructions
(the start, the imports and the warm-up cancel out)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from sift import dcache

from .cases.hot_paths import RUNNER_JOB, claim, evict_noop, runner_step, sweep_noop
from .cases.raw import Baseline, CarefulRunner
from .sizes import BUDGET, RESULT_1K, T0

#: The counted calls' clock: after every lease of the fixture (see cases/instructions.py).
NOW = T0 + 10
#: The job whose targets update_batch_targets writes, ten a call.
BULK_JOB = "bulk"
BULK = 10


def bulk_write(i: int) -> None:
    results = [{"idx": BULK * i + k, "status": "done", "result": RESULT_1K} for k in range(BULK)]
    dcache.update_batch_targets(BULK_JOB, results, now=NOW)
    dcache.evict_batch_oldest(BUDGET)


def side(case: str, path: Path) -> Callable[[int], object]:
    """CASE's call on the file at ``path``, opened as that side opens it."""
    if case == "update_batch_targets_10/package_sql":
        bulk = Baseline(path)

        def bulk_sql(i: int) -> None:
            if i == 0:  # the job's lease becomes NOW, as the package's first write sets it
                bulk.update_target_done(BULK_JOB, 0, RESULT_1K, NOW)
                bulk.update_targets_done(BULK_JOB, range(1, BULK), RESULT_1K, NOW)
            else:
                bulk.update_targets_done(BULK_JOB, range(BULK * i, BULK * i + BULK), RESULT_1K, NOW)
            bulk.evict_noop(BUDGET)

        return bulk_sql
    if case.endswith("/package_sql"):
        base = Baseline(path)

        def sql_step(i: int) -> None:
            base.update_target_done(RUNNER_JOB, i, RESULT_1K, NOW, at_lease=i > 0)
            base.evict_noop(BUDGET)

        return sql_step
    if case.endswith("/sqlite3"):
        careful = CarefulRunner.opened(path)

        def careful_step(i: int) -> None:
            careful.update_target_done(RUNNER_JOB, i, RESULT_1K, NOW)
            careful.evict_noop(BUDGET)

        return careful_step
    dcache.open_db(path)
    return {
        "runner_step/package": runner_step(NOW),
        "claim_batch_targets/package": claim(NOW),
        "update_batch_targets_10/package": bulk_write,
        "sweep_batch_noop/package": sweep_noop(NOW),
        "evict_batch_oldest_noop/package": evict_noop,
    }[case]


def main(case: str, path: Path, warm: int, steps: int) -> None:
    op = side(case, path)
    for i in range(warm + steps):
        op(i)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
