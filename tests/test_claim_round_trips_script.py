"""scripts/claim_round_trips.py, the claim's round trips of docs/explanation/performance.md: it counts what
the store sends for each shape of claim, and leaves no schema behind."""

from __future__ import annotations

import psycopg
import pytest
from conftest import POSTGRES_URL
from helpers import load_script

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

script = load_script("claim_round_trips")


def schemas() -> set[str]:
    with psycopg.connect(POSTGRES_URL) as conn:
        return {row[0] for row in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


def test_each_claim_is_three_round_trips_and_no_schema_stays(
    postgres_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = schemas()
    script.main(["--server", POSTGRES_URL, "--claims", "2"])
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
    assert schemas() == before
