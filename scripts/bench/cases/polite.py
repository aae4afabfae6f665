"""A fair claim's cost with most pending work held back: the large store of the fair claims (1M pending
targets of 1,000 callers on 10,000 hosts), its claim of 50 with half the callers paused and 80% of the
hosts backed off (90% of the pending targets held), against the same claim on the same store with nothing
held, in alternating rounds."""

from __future__ import annotations

from pathlib import Path

from sift import dcache

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
#: The back-off's end: past every claim's clock (the claims run at T0 + i), within back_off_host's cap.
HELD_UNTIL = T0 + 86_400


def toggle(target: str, held: bool) -> None:
    """Pause the first half of the callers and back off four fifths of the hosts through the store's calls
    (each moves its host's targets out of the claims' index), or resume and release them all."""
    dcache.open_db(target)
    try:
        callers = [f"caller-{k:04d}" for k in range(PAUSED_CALLERS)]
        hosts = [f"h{h}.example" for h in range(HELD_HOSTS)]
        if held:
            for caller in callers:
                dcache.pause_caller(caller, now=T0)
            for host in hosts:
                dcache.back_off_host(host, HELD_UNTIL, now=T0)
        else:
            for caller in callers:
                dcache.resume_caller(caller)
            for host in hosts:
                dcache.release_host(host, now=T0)
    finally:
        dcache.close_db()


def run_polite(target: str, sizes: Sizes, report: Report, store: StoreUnderTest) -> None:
    samples: dict[str, list[float]] = {"clear": [], "held": []}
    for rnd in range(sizes.fair_rounds):
        for side in alternate(rnd, ("clear", "held")):
            toggle(target, side == "held")
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
    path = tmp / "polite.db"
    log(f"polite claims: building {sizes.fair_pending:,} pending targets (SQLite)")
    build_sqlite(path, sizes.fair_pending)

    run_polite(str(path), sizes, report, SQLITE)


def pg_polite(server: PgServer, sizes: Sizes, report: Report) -> None:
    """On a PostgreSQL schema."""
    schema = server.new_schema("polite")
    log(f"polite claims: building {sizes.fair_pending:,} pending targets (PostgreSQL)")
    build_postgres(server, schema, sizes.fair_pending)

    run_polite(server.target(schema), sizes, report, POSTGRES)
    server.drop(schema)
