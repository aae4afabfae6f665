"""The bench's claim as its statements sent plainly (``python -m bench.counted``, the instructions group's
plain side of the claim) does the package's work: the statements recorded from the package's claims,
replayed through plain sqlite3 on a copy of the same store, leave it exactly as the package's claims left
theirs. So the ratio the bench reports compares the package with its own statements, not with less work.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_job, make_targets

from sift import dcache

pytestmark = pytest.mark.slow  # two Python processes and a store of its own

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
#: Claims recorded, then replayed: the first WARM as the bench's warm-up, the rest as its counted calls.
WARM, CALLS = 2, 6


def counted(*argv: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPTS), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "bench.counted", *argv], check=True, env=env, timeout=120)


def tables(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every table's rows, in rowid order."""
    conn = sqlite3.connect(path)
    try:
        names = [
            n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        ]
        return {name: conn.execute(f'SELECT * FROM "{name}" ORDER BY rowid').fetchall() for name in names}
    finally:
        conn.close()


def test_replayed_statements_leave_the_store_as_the_package_claims_do(tmp_path: Path) -> None:
    source = tmp_path / "source.db"
    dcache.open_db(source)
    try:  # two callers, so each claim walks the ring; more pending targets than the claims take
        for job_id, caller, created in (("one", "caller-0", 1), ("two", "caller-1", 2)):
            job = make_job(job_id, caller=caller, targets_total=100, created_at=created, lease=created)
            dcache.create_batch_job(job, make_targets(100))
    finally:
        dcache.close_db()
    package, plain = tmp_path / "package.db", tmp_path / "plain.db"
    shutil.copyfile(source, package)
    shutil.copyfile(source, plain)
    recorded = tmp_path / "claims.pickle"

    counted("record", str(package), str(WARM + CALLS), str(recorded))
    counted("claim_batch_targets/package_sql", str(plain), str(WARM), str(CALLS), str(recorded))

    conn = sqlite3.connect(package)
    claimed = conn.execute("SELECT job_id, count(*) FROM batch_target WHERE status = 'running' GROUP BY 1")
    assert dict(claimed.fetchall()) == {"one": 5 * (WARM + CALLS), "two": 5 * (WARM + CALLS)}  # ten a claim
    conn.close()
    after = tables(package)
    assert tables(plain) == after
    assert after != tables(source)
