"""claim_batch_targets from 1, 2 and 4 processes at once, on either kind of store; then the fair claim's
cost as the store grows (:mod:`.fair`)."""

from __future__ import annotations

from pathlib import Path

from sift import dcache

from ..fixtures import Builder, PgBuilder
from ..harness import Report
from ..sizes import T0, Sizes
from ..stores import POSTGRES, SQLITE, PgServer, StoreUnderTest
from .fair import bench_fair, pg_fair
from .hot_paths import CLAIM_LIMIT
from .workers import Workers

#: Pending targets of each queued job the claims group claims from. Nothing here writes the claimed
#: targets, so a claimed-out job stays running in front of the claim order, and every later claim passes
#: it: with jobs of 100 targets, hundreds piled up and each round's claims got slower (on PostgreSQL 1.3 ms,
#: then 1.9 ms per claim). Jobs this big keep that pile as small as a runner's jobs in flight.
CLAIM_JOB_TARGETS = 2000
#: The claims group's sides: how many processes claim at once.
CLAIM_SIDES = (1, 2, 4)


def build_claims(b: Builder | PgBuilder, sizes: Sizes) -> None:
    """Retained history, and queued jobs of CLAIM_JOB_TARGETS pending targets each, enough for every claim of
    the group (with a quarter to spare): a claim never finds the store empty."""
    b.jobs(
        "job-", sizes.flat_small, targets=sizes.targets_per_job, result_bytes=sizes.retained_result, lease0=T0
    )
    calls = sizes.claim_ops * sizes.claim_rounds * sum(CLAIM_SIDES) + sizes.warmup * max(CLAIM_SIDES)
    # and always several jobs per claimer: on PostgreSQL claimers skip the jobs others hold
    jobs = max(calls * CLAIM_LIMIT * 5 // 4 // CLAIM_JOB_TARGETS + 1, 4 * max(CLAIM_SIDES))
    lease = T0 + 10**6
    b.jobs("claim-", jobs, targets=CLAIM_JOB_TARGETS, result_bytes=None, lease0=lease, statuses=("queued",))


def run_claims(target: str, sizes: Sizes, report: Report, store: StoreUnderTest) -> None:
    """claim_batch_targets(10) from 1, 2 and 4 processes at once, in rounds (the order rotating); each process
    makes claim_ops claims a round. Afterwards the running targets must be exactly the targets claimed."""
    workers = Workers(target, [("claim", "")] * max(CLAIM_SIDES), sizes.warmup)
    try:
        samples = workers.rounds(sizes.claim_rounds, CLAIM_SIDES, sizes.claim_ops)
    finally:
        claimed = workers.close()
    dcache.open_db(target)
    count = "SELECT COUNT(*) FROM batch_target WHERE status = 'running'"
    running = dcache.db.execute_sql(count).fetchone()[0]
    dcache.close_db()
    if running != sum(claimed):
        raise AssertionError(f"claims: {running} targets running after {sum(claimed)} claimed")
    cases = {
        n: report.case(f"{store.prefix}claims/claim_batch_targets", n, samples[n], claims_per_s=0.0)
        for n in CLAIM_SIDES
    }
    for case in cases.values():
        case.extra["claims_per_s"] = 1e6 / case.median_us
        case.ratio = case.median_us / cases[1].median_us
    most = max(CLAIM_SIDES)
    ratio = cases[most].median_us / cases[1].median_us
    name = (
        f"{store.goal_prefix}claims from {most} processes, time per claim / 1 process "
        f"({1 / ratio:.2f} x the throughput)"
    )
    if store is SQLITE:  # writers serialize on SQLite: the goal is no collapse
        report.goal(name + ": no slower", ratio, 1.0, "x")
    else:
        report.goal(name, ratio, None, "x")


def bench_claims(tmp: Path, sizes: Sizes, report: Report) -> None:
    """The claims on a SQLite file."""
    path = tmp / "claims.db"
    b = Builder(path)
    build_claims(b, sizes)
    b.close()
    run_claims(str(path), sizes, report, SQLITE)
    bench_fair(tmp, sizes, report)


def pg_claims(server: PgServer, sizes: Sizes, report: Report) -> None:
    """The claims on a PostgreSQL schema."""
    schema = server.new_schema("claims")
    build_claims(PgBuilder(server, schema), sizes)
    run_claims(server.target(schema), sizes, report, POSTGRES)
    server.drop(schema)
    pg_fair(server, sizes, report)
