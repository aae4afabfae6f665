"""Why ``update_batch_targets`` writes each target on its own on SQLite: 256 results a call, at three result
sizes, written as the package writes them (the job moved once for the set, then the one target's statement
run for each by ``executemany``) against one ``UPDATE … FROM (VALUES …)`` for the set (the same move first);
both sent plainly on copies of one file, interleaved call by call. The one statement writes done results
only: it leaves out the ``CASE`` that ended the claims of pending and failed ones, to its advantage.

SQLite runs an ``UPDATE … FROM`` by first copying the joined rows, new values and all, and then writing
them: the copy costs more as the results grow."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

from sift import dcache
from sift.dcache.backends.sqlite import writes as sqlite_writes
from sift.testing import make_job, make_targets

from ..fixtures import raw_connect
from ..harness import Report, interleave
from ..sizes import T0, Sizes

#: Results a call, as many as one statement of the package's set write carries.
SET = sqlite_writes.SET_ROWS
#: The result sizes compared (bytes): an error's, a small page's, a page's.
RESULT_SIZES = {"10b": 10, "1k": 1024, "10k": 10 * 1024}
_NOW = T0 + 10


def _one_update(rows: int) -> str:
    """The alternative: the set's targets written by one UPDATE … FROM (VALUES …) of ``rows`` rows."""
    values = ", ".join(
        f"(?{2 + 5 * r}, ?{3 + 5 * r}, ?{4 + 5 * r}, ?{5 + 5 * r}, ?{6 + 5 * r})" for r in range(rows)
    )
    return (
        f"WITH w(idx, status, result, error, hint) AS (VALUES {values}) "
        "UPDATE batch_target SET status = w.status, result = w.result, error = w.error, hint = w.hint "
        "FROM w WHERE batch_target.job_id = ?1 AND batch_target.idx = w.idx"
    )


class SetWriter:
    """One copy of the file, written plainly: the package's move of the job, then the targets' write."""

    def __init__(self, path: Path, job_id: str, result: str, one_update: bool) -> None:
        self.conn = raw_connect(path)
        self.job_id, self.result, self.one_update = job_id, result, one_update
        self.size = len(result.encode())

    def write(self, call: int) -> None:
        idxs = range(call * SET, call * SET + SET)
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            move = [
                self.job_id,
                None,
                _NOW,
                SET,
                *itertools.chain.from_iterable((i, 1, self.size) for i in idxs),
            ]
            if conn.execute(sqlite_writes._move_sql(SET, False), move).rowcount != 1:
                raise LookupError(f"not every one of the targets {idxs} may be written")
            if self.one_update:
                params: list[Any] = [self.job_id]
                for idx in idxs:
                    params += (idx, "done", self.result, None, None)
                conn.execute(_one_update(SET), params)
            else:
                rows = [(self.job_id, idx, "done", self.result, None, None) for idx in idxs]
                conn.executemany(sqlite_writes._WRITE_ONE, rows)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.conn.close()


def bench_set_writes(tmp: Path, sizes: Sizes, report: Report) -> None:
    """Each result size: a job of pending targets on one file, copied; each side writes 256 of them a call
    on its copy, a batch of ``raw_ops // 100`` calls a round (at least 1)."""
    per_batch = max(1, sizes.raw_ops // 100)
    calls = (sizes.raw_rounds + 1) * per_batch
    for name, size in RESULT_SIZES.items():
        path = tmp / f"set-writes-{name}.db"
        dcache.open_db(path)
        job_id = f"set-{name}"
        dcache.create_batch_job(
            make_job(id=job_id, status="running", targets_total=calls * SET, created_at=T0, lease=T0),
            make_targets(calls * SET),
        )
        dcache.close_db()
        other = tmp / f"set-writes-{name}-one-update.db"
        shutil.copyfile(path, other)
        each = SetWriter(path, job_id, "r" * size, one_update=False)
        one = SetWriter(other, job_id, "r" * size, one_update=True)
        each.write(0)  # warm-up: the statements prepared, the first pages read
        one.write(0)
        try:
            a, b = interleave(sizes.raw_rounds, each.write, one.write, lambda r: 1 + r * per_batch, per_batch)
        finally:
            each.close()
            one.close()
        base = report.case(f"raw/set_write_{name}/each", SET, [s / SET for s in a])
        ratio = report.pair(report.case(f"raw/set_write_{name}/one_update", SET, [s / SET for s in b]), base)
        report.goal(
            f"close to raw: {SET} results of {size} bytes in one UPDATE … FROM (VALUES …)/each target's "
            "statement (report only)",
            ratio,
            None,
            "x",
        )
