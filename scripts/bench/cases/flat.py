"""Flat in history: each hot path at a small and a large history (N retained jobs), the two stores in
alternating rounds; the goal is the large store's median within 1.3 x the small one's."""

from __future__ import annotations

import time
from pathlib import Path

from sift import dcache

from ..fixtures import Builder, PgBuilder
from ..harness import Report, alternate, log, time_batch
from ..sizes import T0, Sizes
from ..stores import POSTGRES, SQLITE, PgServer, StoreUnderTest
from .hot_paths import FLAT_CASES, RUNNER_JOB, flat_paths


def build_flat(b: Builder | PgBuilder, n: int, sizes: Sizes, runner_targets: int) -> None:
    """The flat cases' store, on either kind: ``n`` retained jobs, 10 live ones, and the runner's job."""
    b.jobs("job-", n, targets=sizes.targets_per_job, result_bytes=sizes.retained_result, lease0=T0)
    for k in range(10):  # a few live jobs, so the live counts count something
        b.one_job(
            f"live-{k}", caller=f"caller-{k}", status="queued", targets=0, result_bytes=None, lease=T0 + n
        )
    b.one_job(
        RUNNER_JOB,
        caller="caller-0",
        status="running",
        targets=runner_targets,
        result_bytes=None,
        lease=T0 + n,
    )
    b.close()


def bench_flat(tmp: Path, sizes: Sizes, report: Report) -> None:
    """The flat cases on SQLite files."""
    stores = {n: tmp / f"flat-{n}.db" for n in (sizes.flat_small, sizes.flat_large)}
    for n, path in stores.items():
        t0 = time.perf_counter()
        build_flat(Builder(path), n, sizes, flat_runner_targets(sizes))
        log(f"flat: built {n} jobs x {sizes.targets_per_job} targets in {time.perf_counter() - t0:.1f} s")
    run_flat({n: str(path) for n, path in stores.items()}, sizes, report, SQLITE)


def flat_runner_targets(sizes: Sizes) -> int:
    """Pending targets the runner's job needs for every runner step of the group (and a few to spare)."""
    return sizes.flat_rounds * (sizes.warmup + sizes.flat_batches * sizes.flat_ops) + 10


def run_flat(targets: dict[int, str], sizes: Sizes, report: Report, store: StoreUnderTest) -> None:
    """Time the hot paths on the built stores (``targets``: N -> what open_db opens), interleaved."""
    stores = (sizes.flat_small, sizes.flat_large)
    samples: dict[tuple[int, str], list[float]] = {(n, c): [] for n in stores for c in FLAT_CASES}
    step = dict.fromkeys(stores, 0)  # next runner target of each store
    for rnd in range(sizes.flat_rounds):
        for n in alternate(rnd, stores):
            dcache.open_db(targets[n])
            ops = flat_paths(n)
            for case in FLAT_CASES:  # warm the caches after the open
                start = step[n] if case == "runner_step" else 0
                time_batch(ops[case], start, sizes.warmup)
            step[n] += sizes.warmup
            for _ in range(sizes.flat_batches):
                for case in FLAT_CASES:
                    start = step[n] if case == "runner_step" else rng_start(rnd)
                    samples[n, case].append(time_batch(ops[case], start, sizes.flat_ops))
                step[n] += sizes.flat_ops
            dcache.close_db()
    for case in FLAT_CASES:
        small = report.case(f"{store.prefix}flat/{case}", sizes.flat_small, samples[sizes.flat_small, case])
        large = report.case(f"{store.prefix}flat/{case}", sizes.flat_large, samples[sizes.flat_large, case])
        ratio = report.pair(large, small)
        report.goal(
            f"{store.goal_prefix}flat in history: {case} "
            f"median(N={sizes.flat_large})/median(N={sizes.flat_small})",
            ratio,
            1.3,
            "x",
        )


def rng_start(rnd: int) -> int:
    """Where a round's calls start in the lookups' 4096 keys: a different stretch each round."""
    return (rnd * 997) % 4096


def pg_flat(server: PgServer, sizes: Sizes, report: Report) -> None:
    """The flat cases, on PostgreSQL: the same stores and hot paths as on SQLite."""
    schemas = {n: server.new_schema(f"flat{n}") for n in (sizes.flat_small, sizes.flat_large)}
    for n, schema in schemas.items():
        t0 = time.perf_counter()
        build_flat(PgBuilder(server, schema), n, sizes, flat_runner_targets(sizes))
        log(f"pg flat: built {n} jobs x {sizes.targets_per_job} targets in {time.perf_counter() - t0:.1f} s")
    run_flat({n: server.target(schema) for n, schema in schemas.items()}, sizes, report, POSTGRES)
    for schema in schemas.values():
        server.drop(schema)
