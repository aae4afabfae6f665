"""A fair claim's cost with most pending work held back: the large store of the fair claims (1M pending
targets of 1,000 callers on 10,000 hosts), its claim of 50 with half the callers paused and 80% of the
hosts backed off (90% of the pending targets held), against the same claim on the same store with nothing
held, in alternating rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..harness import Report, alternate, log
from ..sizes import T0, Sizes
from ..stores import POSTGRES, SQLITE, PgServer, StoreUnderTest
from .fair import FAIR_CALLERS, FAIR_HOSTS, FAIR_LIMIT, _claims, build_postgres, build_sqlite

#: Callers paused (of FAIR_CALLERS) and hosts backed off (of FAIR_HOSTS): half and four fifths, so that a
#: tenth of the pending targets (the other callers' targets on the other hosts) can be claimed.
PAUSED_CALLERS = FAIR_CALLERS // 2
HELD_HOSTS = FAIR_HOSTS * 4 // 5
#: The goal: the claim with 90% held at most this many times the claim with nothing held.
POLITE_GOAL = 2.0
#: Far past every claim's clock (the claims run at T0 + i): backed off for the whole run.
HELD_UNTIL_MS = (T0 + 10**9) * 1000


def hold(execute: Any, execute_many: Any, mark: str) -> None:
    """Pause the first half of the callers and back off four fifths of the hosts, in plain SQL."""
    execute_many(
        f"INSERT INTO batch_paused_caller (caller, paused_at) VALUES ({mark}, {mark})",
        [(f"caller-{k:04d}", T0) for k in range(PAUSED_CALLERS)],
    )
    execute_many(
        f"INSERT INTO batch_host_policy (host, next_due_ms, backed_off_until_ms) VALUES ({mark}, 0, {mark})",
        [(f"h{h}.example", HELD_UNTIL_MS) for h in range(HELD_HOSTS)],
    )


def release(execute: Any) -> None:
    execute("DELETE FROM batch_paused_caller")
    execute("DELETE FROM batch_host_policy")


def run_polite(target: str, toggle: Any, sizes: Sizes, report: Report, store: StoreUnderTest) -> None:
    samples: dict[str, list[float]] = {"clear": [], "held": []}
    for rnd in range(sizes.fair_rounds):
        for side in alternate(rnd, ("clear", "held")):
            toggle(side == "held")
            median, _ = _claims(target, sizes.fair_claims, sizes.warmup // 5, None)
            samples[side].append(median)
    clear = report.case(f"{store.prefix}claims/polite_clear", sizes.fair_pending, samples["clear"])
    held = report.case(f"{store.prefix}claims/polite_held", sizes.fair_pending, samples["held"])
    report.goal(
        f"{store.goal_prefix}a fair claim of {FAIR_LIMIT} over {sizes.fair_pending:,} pending targets, 90% "
        f"held ({PAUSED_CALLERS} callers paused, {HELD_HOSTS:,} hosts backed off) / none held",
        report.pair(held, clear),
        POLITE_GOAL,
        "x",
    )


def bench_polite(tmp: Path, sizes: Sizes, report: Report) -> None:
    """On a SQLite file."""
    import sqlite3

    path = tmp / "polite.db"
    log(f"polite claims: building {sizes.fair_pending:,} pending targets (SQLite)")
    build_sqlite(path, sizes.fair_pending)

    def toggle(held: bool) -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            release(conn.execute)
            if held:
                hold(conn.execute, conn.executemany, "?")
            conn.execute("COMMIT")
        finally:
            conn.close()

    run_polite(str(path), toggle, sizes, report, SQLITE)


def pg_polite(server: PgServer, sizes: Sizes, report: Report) -> None:
    """On a PostgreSQL schema."""
    schema = server.new_schema("polite")
    log(f"polite claims: building {sizes.fair_pending:,} pending targets (PostgreSQL)")
    build_postgres(server, schema, sizes.fair_pending)

    def toggle(held: bool) -> None:
        conn = server.connect(schema)
        try:
            with conn.transaction(), conn.cursor() as cursor:
                release(cursor.execute)
                if held:
                    hold(cursor.execute, cursor.executemany, "%s")
            conn.execute("ANALYZE batch_paused_caller, batch_host_policy")
        finally:
            conn.close()

    run_polite(server.target(schema), toggle, sizes, report, POSTGRES)
    server.drop(schema)
