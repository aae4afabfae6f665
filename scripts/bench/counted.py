"""One counted run of the instructions group: ``python -m bench.counted CASE PATH WARM STEPS [RECORDED]``,
under callgrind. It opens PATH as CASE's side does, makes WARM calls, then STEPS more, and exits: the bench
runs it with STEPS 0 and with STEPS N, and the difference of the two totals over N is one call's instructions
(the start, the imports and the warm-up cancel out).

The claim's statements sent plainly replay RECORDED, the statements the package's claims sent on a copy of
the same store (``python -m bench.counted record PATH CALLS RECORDED``, not counted): a claim's statements
depend on what the ones before it returned, and replayed in order on the same store they return the same."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sift import dcache
from sift.dcache.backends.sqlite.transactions import DirectWrite
from sift.dcache.database import db

from .cases.hot_paths import RUNNER_JOB, claim, evict_noop, runner_step, sweep_noop
from .cases.raw import Baseline, CarefulRunner
from .fixtures import raw_connect
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


#: One claim's statements, in the order sent: (SQL, parameters).
Claim = list[tuple[str, tuple[Any, ...]]]


def record_claims(path: Path, calls: int, out: Path) -> None:
    """The statements of ``calls`` package claims (``hot_paths.claim``) on the store at ``path``, pickled to
    ``out``: each statement as the package hands it to the driver, on its own (``run_sql``) or in a hot
    path's write transaction (the ``execute`` of ``DirectWrite``), but for that transaction's BEGIN and
    COMMIT, which the replay sends itself."""
    claims: list[Claim] = []

    def recording(send: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
        def recorded(sql: str, params: Any = ()) -> Any:
            claims[-1].append((sql, tuple(params)))
            return send(sql, params)

        return recorded

    enter = DirectWrite.__enter__
    DirectWrite.__enter__ = lambda self: recording(enter(self))  # type: ignore[method-assign]
    dcache.open_db(path)
    backend = db.backend
    backend.run_sql = recording(backend.run_sql)  # type: ignore[method-assign,assignment]
    op = claim(NOW)
    try:
        for i in range(calls):
            claims.append([])
            op(i)
    finally:
        del backend.run_sql
        DirectWrite.__enter__ = enter  # type: ignore[method-assign]
        dcache.close_db()
    out.write_bytes(pickle.dumps(claims))


def side(case: str, path: Path, recorded: Path | None = None) -> Callable[[int], object]:
    """CASE's call on the file at ``path``, opened as that side opens it."""
    if case == "claim_batch_targets/package_sql":
        assert recorded is not None, "the claim's statements come recorded"
        conn = raw_connect(path)
        claims: list[Claim] = pickle.loads(recorded.read_bytes())  # all of them, in both runs

        def claim_sql(i: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in claims[i]:
                    conn.execute(sql, params).fetchall()
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        return claim_sql
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


def main(case: str, path: Path, warm: int, steps: int, recorded: Path | None) -> None:
    op = side(case, path, recorded)
    for i in range(warm + steps):
        op(i)


if __name__ == "__main__":
    if sys.argv[1] == "record":
        record_claims(Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
    else:
        recorded = Path(sys.argv[5]) if len(sys.argv) > 5 else None
        main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), recorded)
