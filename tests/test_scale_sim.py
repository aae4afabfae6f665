"""scripts/scale_sim.py, the model behind docs/explanation/scaling.md: a global byte budget against
a budget per shard. Small runs (well under a second each); nothing is timed."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import load_script

sim = load_script("scale_sim")

SMALL: dict[str, Any] = {"jobs": 4_000, "budget_jobs": 400}
WORKLOADS = [
    pytest.param({}, id="lognormal"),
    pytest.param({"dist": "pareto", "alpha": 1.3}, id="pareto"),
    pytest.param({"touches": 0.0}, id="no-touches"),
    pytest.param({"touches": 2.5, "sigma": 2.5}, id="many-touches"),
]


def run(rebalance: int = 0, shards: tuple[int, ...] = (1, 4, 16, 64), **extra: Any) -> tuple[Any, list[Any]]:
    config = sim.Config(**{**SMALL, **extra}, shards=shards, rebalance=rebalance)
    return sim.simulate(config)  # type: ignore[no-any-return]


@pytest.mark.parametrize("rebalance", [0, 37])
@pytest.mark.parametrize("extra", WORKLOADS)
def test_one_shard_is_exactly_the_global_order(extra: dict[str, Any], rebalance: int) -> None:
    _, results = run(rebalance, shards=(1,), **extra)
    reference, *sharded = results
    assert len(sharded) == (2 if rebalance else 1)
    assert reference.evicted  # the budget was reached, so there was an order to follow
    for result in sharded:
        assert result.evicted == reference.evicted  # the same jobs, in the same order
        assert result.final_kept == reference.final_kept
        assert result.summary() | {"name": "", "shards": 0, "rebalance": 0} == reference.summary() | {
            "name": "",
            "shards": 0,
            "rebalance": 0,
        }


@pytest.mark.slow
@pytest.mark.parametrize("rebalance", [0, 37])
@pytest.mark.parametrize("extra", WORKLOADS)
def test_kept_bytes_never_exceed_the_budget(extra: dict[str, Any], rebalance: int) -> None:
    load, results = run(rebalance, **extra)
    assert sum(load.sizes) > 2 * load.budget  # far more arrived than the budget holds
    for result in results:
        assert result.max_nbytes <= load.budget, result.name
        assert result.kept_max <= 1.0, result.name
    reference = results[0]
    # The global order stays within one job of full: it stops evicting as soon as the rest fit.
    assert reference.kept_min * load.budget > load.budget - max(load.sizes)


@pytest.mark.slow
@pytest.mark.parametrize("extra", WORKLOADS)
def test_no_wrong_eviction_with_one_shard_and_some_with_many(extra: dict[str, Any]) -> None:
    _, results = run(shards=(1, 64), **extra)
    one, many = results[1].summary(), results[2].summary()
    assert (one["wrongly_evicted"], one["wrong_fraction"], one["youngest_wrong_rank"]) == (0, 0.0, None)
    assert many["wrongly_evicted"] > 0  # the measure is not blind
    assert 0.0 <= many["median_wrong_rank"] <= many["p99_wrong_rank"] <= many["youngest_wrong_rank"] < 100.0


@pytest.mark.slow
def test_global_order_against_a_plain_model() -> None:
    """The reference itself: evict the smallest lease from a plain dict, one job at a time."""
    load, results = run(shards=(1,), touches=1.5)
    budget, leases, sizes, evicted = load.budget, {}, {}, []
    for now, (job, size) in enumerate(load.events):
        if size < 0:
            if job in leases:
                leases[job] = now
            continue
        leases[job], sizes[job] = now, size
        while sum(sizes.values()) > budget:
            oldest = min(leases, key=leases.__getitem__)
            del leases[oldest], sizes[oldest]
            evicted.append(oldest)
    assert results[0].evicted == evicted
    assert results[0].final_kept == sorted(leases)


def test_a_wrong_eviction_and_its_rank_by_hand() -> None:
    """Budget 10 over 2 shards of 5. Job 0 (2 bytes) goes to shard 1, jobs 1 and 2 (3 bytes each) to
    shard 0: the global order keeps all three (8 bytes), shard 0 must evict job 1 (6 > 5), which one
    of the three jobs the global order keeps is older than."""
    load = sim.Workload(events=((0, 2), (1, 3), (2, 3)), sizes=(2, 3, 3), budget=10, slots=(1, 0, 0))
    reference, sharded = sim.run((2,), 0, load)
    assert reference.evicted == [] and reference.final_kept == [0, 1, 2]
    assert sharded.evicted == [1] and sharded.final_kept == [0, 2]
    assert sharded.wrong_ranks == [pytest.approx(100 / 3)]
    assert (reference.max_nbytes, sharded.max_nbytes) == (8, 5)


def test_rebalancing_moves_budget_to_the_busier_shard() -> None:
    """Shard 0 gets 3 of every 4 jobs: after a rebalance its budget is three times shard 1's."""
    events = tuple((job, 10) for job in range(400))
    load = sim.Workload(
        events=events, sizes=(10,) * 400, budget=1_000, slots=tuple(int(j % 4 == 3) for j in range(400))
    )
    model = sim.Sharded(load.budget, 2, load.slots)
    for now, (job, size) in enumerate(events):
        model.arrive(job, size, now)
    model.rebalance()
    assert [s.budget for s in model.shards] == [750, 250]
    assert model.nbytes() <= load.budget


@pytest.mark.slow
def test_a_seed_gives_the_same_run() -> None:
    first = run(rebalance=50, seed=7)
    again = run(rebalance=50, seed=7)
    other = run(rebalance=50, seed=8)
    assert first[0] == again[0]
    assert [r.summary() for r in first[1]] == [r.summary() for r in again[1]]
    assert [r.evicted for r in first[1]] == [r.evicted for r in again[1]]
    assert first[0].events != other[0].events
    assert [r.evicted for r in first[1]] != [r.evicted for r in other[1]]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("jobs", 0),
        ("jobs", 1.5),
        ("jobs", True),
        ("budget_jobs", -1),
        ("median", 0),
        ("dist", "uniform"),
        ("sigma", 0.0),
        ("sigma", float("nan")),
        ("alpha", 1.0),
        ("alpha", float("inf")),
        ("touches", -0.5),
        ("touches", "1"),
        ("shards", ()),
        ("shards", (4, 0)),
        ("shards", (4, 4)),
        ("shards", [1, 4]),
        ("rebalance", -1),
        ("seed", "1"),
    ],
)
def test_bad_arguments_are_rejected_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        sim.Config(**{field: value})


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--shards", "0"], "shards"),
        (["--shards", "4,x"], "shards"),
        (["--jobs", "0"], "jobs"),
        (["--dist", "zipf"], "dist"),
        (["--alpha", "0.9", "--dist", "pareto"], "alpha"),
        (["--rebalance", "-5"], "rebalance"),
    ],
)
def test_bad_command_line_exits_2_naming_the_field(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        sim.main(argv)
    assert exit_info.value.code == 2
    assert f"{field}: " in capsys.readouterr().err


@pytest.mark.slow
def test_command_line_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["--jobs", "2000", "--budget-jobs", "200", "--shards", "1,8", "--rebalance", "100"]) == 0
    out = capsys.readouterr().out
    names = [line.split("  ")[0] for line in out.splitlines()[4:8]]
    assert names == ["global", "1", "1, rebalanced /100", "8"]


@pytest.mark.parametrize(("budget", "parts"), [(10, 1), (10, 3), (1_000_003, 64), (5, 16)])
def test_shard_budgets_add_up_to_the_whole_budget(budget: int, parts: int) -> None:
    budgets = sim.split(budget, parts)
    assert len(budgets) == parts and sum(budgets) == budget
    assert max(budgets) - min(budgets) <= 1
    assert [s.budget for s in sim.Sharded(budget, parts, (0,)).shards] == budgets
