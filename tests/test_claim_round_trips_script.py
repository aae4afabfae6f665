"""scripts/claim_round_trips.py, the claim's round trips of docs/explanation/performance.md: it counts what
the store sends for each shape of claim, and leaves no schema behind."""

from __future__ import annotations

import psycopg
import pytest
from conftest import POSTGRES_URL, SUFFIX
from helpers import load_script

from sift import dcache

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

script = load_script("claim_round_trips")


def schemas(prefix: str) -> set[str]:
    with psycopg.connect(POSTGRES_URL) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,))
        return {row[0] for row in rows.fetchall()}


def test_each_claim_is_three_round_trips_and_no_schema_stays(
    postgres_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"sift_claims_{SUFFIX}"  # this process's own: other test runs make and drop schemas meanwhile
    script.main(["--server", POSTGRES_URL, "--claims", "2", "--schema-prefix", prefix])
    cells = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()]
    counted = {
        row[0].strip(): (int(row[1]), int(row[2]))
        for row in cells
        if len(row) == 3 and row[2].strip().isdigit()
    }
    assert counted == {
        "10 from 3 callers' jobs (fair)": (10, 3),
        "50 from 50 callers' jobs (fair)": (50, 3),
        "10 from 3 callers' jobs, per_host=2": (8, 3),
        "10 from 3 callers' jobs, fair=False": (10, 3),
    }
    assert schemas(prefix) == set()


def test_its_store_is_a_schema_of_its_own_dropped_afterwards(postgres_schema: str) -> None:
    prefix = f"sift_claims_{SUFFIX}"
    with script.store(POSTGRES_URL, prefix, 2, 3, 1):
        assert len(schemas(prefix)) == 1
        assert (dcache.live_batch_jobs("caller-01"), dcache.live_batch_jobs_total()) == (1, 2)
    assert schemas(prefix) == set()
