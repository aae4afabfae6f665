"""The byte budget past one database: one global budget, oldest lease evicted first, against a budget per
shard, each shard evicting its own oldest (docs/explanation/scaling.md).

A model, not the store: finished jobs arrive one at a time with their whole size (lognormal or Pareto),
and callers touch recent jobs (a touch moves the job's lease to now, as ``touch_batch_job`` does). Every
event has its own instant, so leases never tie. Jobs go to shards by a hash of their id, as a distributed
table sharded by ``job_id`` would place them. After each event every configuration evicts as the store's
``evict_batch_oldest`` does: whole jobs, oldest lease first, until its bytes fit its budget.

The global reference is written separately from the per-shard stores (a Fenwick tree over lease instants,
not a heap), so the one-shard case checks one against the other. An eviction by a sharded configuration is
*wrong* when the global order, after the same event, still keeps that job; its *rank* is the share of the
jobs the global order keeps that are older than it (0% = the globally oldest, the one it should have taken).

    python scripts/scale_sim.py                        # 1, 4, 16 and 64 shards, seed 1
    python scripts/scale_sim.py --rebalance 1000       # plus per-shard budgets rebalanced every 1000 events

Stdlib only; deterministic for a seed.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

DEFAULT_SHARDS = (1, 4, 16, 64)
DISTRIBUTIONS = ("lognormal", "pareto")


@dataclass(frozen=True)
class Config:
    """One run: the workload, the budget and the shard counts to compare with the global order."""

    jobs: int = 60_000  # finished jobs arriving over the run
    budget_jobs: int = 10_000  # the byte budget, as this many jobs of the mean size
    dist: str = "lognormal"  # the distribution of a job's bytes
    median: int = 8_192  # median bytes of a job
    sigma: float = 1.5  # lognormal: sigma of log(bytes)
    alpha: float = 1.5  # pareto: tail index (> 1, so the mean is finite)
    touches: float = 0.5  # touches per arriving job, each on one of the last budget_jobs jobs
    shards: tuple[int, ...] = DEFAULT_SHARDS
    rebalance: int = 0  # events between two rebalances of the per-shard budgets; 0: never
    seed: int = 1

    def __post_init__(self) -> None:
        _positive_int("jobs", self.jobs)
        _positive_int("budget_jobs", self.budget_jobs)
        _positive_int("median", self.median)
        if self.dist not in DISTRIBUTIONS:
            raise ValueError(f"dist: must be one of {', '.join(DISTRIBUTIONS)}, got {self.dist!r}")
        _finite("sigma", self.sigma, above=0.0)
        _finite("alpha", self.alpha, above=1.0)
        _finite("touches", self.touches, above=None)
        if not isinstance(self.shards, tuple) or not self.shards:
            raise ValueError(f"shards: must be a non-empty tuple of shard counts, got {self.shards!r}")
        for count in self.shards:
            _positive_int("shards", count)
        if len(set(self.shards)) != len(self.shards):
            raise ValueError(f"shards: each count at most once, got {self.shards!r}")
        if type(self.rebalance) is not int or self.rebalance < 0:
            raise ValueError(f"rebalance: must be an int >= 0 (0: never), got {self.rebalance!r}")
        if type(self.seed) is not int:
            raise ValueError(f"seed: must be an int, got {self.seed!r}")


def _positive_int(name: str, value: object) -> None:
    if type(value) is not int or value <= 0:
        raise ValueError(f"{name}: must be an int > 0, got {value!r}")


def _finite(name: str, value: object, *, above: float | None) -> None:
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        raise ValueError(f"{name}: must be a finite number, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    if above is not None and number <= above:
        raise ValueError(f"{name}: must be > {above:g}, got {value!r}")
    if above is None and number < 0:
        raise ValueError(f"{name}: must be >= 0, got {value!r}")


# -- The workload ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Events in time order: ``(job, size)`` is a job arriving with its bytes, ``(job, -1)`` a touch."""

    events: tuple[tuple[int, int], ...]
    sizes: tuple[int, ...]
    budget: int
    slots: tuple[int, ...]  # a 64-bit hash of each job's id, for its shard


def workload(config: Config) -> Workload:
    rng = random.Random(config.seed)
    if config.dist == "lognormal":
        mu = math.log(config.median)
        sizes = [max(1, round(rng.lognormvariate(mu, config.sigma))) for _ in range(config.jobs)]
    else:
        scale = config.median / 2 ** (1 / config.alpha)  # the Pareto whose median is config.median
        sizes = [max(1, round(scale * rng.paretovariate(config.alpha))) for _ in range(config.jobs)]
    budget = round(config.budget_jobs * statistics.fmean(sizes))
    events: list[tuple[int, int]] = []
    whole, part = divmod(config.touches, 1.0)
    for job, size in enumerate(sizes):
        events.append((job, size))
        for _ in range(int(whole) + (rng.random() < part)):
            events.append((max(0, job - int(rng.random() * config.budget_jobs)), -1))
    slots = tuple(
        int.from_bytes(hashlib.blake2b(f"job-{job}".encode(), digest_size=8).digest(), "big")
        for job in range(config.jobs)
    )
    return Workload(tuple(events), tuple(sizes), budget, slots)


# -- The global order: the reference -------------------------------------------------------------------


class GlobalOrder:
    """Every job under one budget: a Fenwick tree counts the kept jobs by lease instant, so the oldest is
    a search of the tree and a job's rank a prefix sum."""

    def __init__(self, budget: int, instants: int) -> None:
        self.budget = budget
        self.nbytes = 0
        self.size = 1 << max(1, instants - 1).bit_length()
        self.tree = [0] * (self.size + 1)
        self.job_at = [-1] * self.size
        self.lease: dict[int, int] = {}
        self.bytes_of: dict[int, int] = {}

    def _place(self, job: int, instant: int) -> None:
        self.job_at[instant] = job
        self._add(instant, 1)

    def _unplace(self, instant: int) -> None:
        self.job_at[instant] = -1
        self._add(instant, -1)

    def _add(self, instant: int, delta: int) -> None:
        i = instant + 1
        while i <= self.size:
            self.tree[i] += delta
            i += i & -i

    def older(self, instant: int) -> int:
        """How many kept jobs have a lease before ``instant``."""
        count, i = 0, instant
        while i > 0:
            count += self.tree[i]
            i -= i & -i
        return count

    def _oldest(self) -> int:
        position, step = 0, self.size
        while step:
            if position + step <= self.size and self.tree[position + step] == 0:
                position += step
            step >>= 1
        return position  # the first instant whose prefix count reaches 1

    def holds(self, job: int) -> bool:
        return job in self.lease

    def count(self) -> int:
        return len(self.lease)

    def arrive(self, job: int, size: int, now: int) -> list[int]:
        self.lease[job], self.bytes_of[job] = now, size
        self._place(job, now)
        self.nbytes += size
        evicted = []
        while self.nbytes > self.budget:
            instant = self._oldest()
            victim = self.job_at[instant]
            self._unplace(instant)
            del self.lease[victim]
            self.nbytes -= self.bytes_of.pop(victim)
            evicted.append(victim)
        return evicted

    def touch(self, job: int, now: int) -> bool:
        old = self.lease.get(job)
        if old is None:
            return False
        self._unplace(old)
        self._place(job, now)
        self.lease[job] = now
        return True


# -- Budgets per shard -------------------------------------------------------------------------------------


class Shard:
    """One shard's jobs under its own budget: a heap of (lease, job), stale entries skipped."""

    __slots__ = ("budget", "heap", "jobs", "nbytes")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.nbytes = 0
        self.jobs: dict[int, tuple[int, int]] = {}  # job -> (lease, size)
        self.heap: list[tuple[int, int]] = []

    def add(self, job: int, size: int, now: int) -> None:
        self.jobs[job] = (now, size)
        heapq.heappush(self.heap, (now, job))
        self.nbytes += size

    def touch(self, job: int, now: int) -> bool:
        kept = self.jobs.get(job)
        if kept is None:
            return False
        self.jobs[job] = (now, kept[1])
        heapq.heappush(self.heap, (now, job))
        return True

    def evict(self) -> list[int]:
        evicted = []
        while self.nbytes > self.budget:
            lease, job = heapq.heappop(self.heap)
            kept = self.jobs.get(job)
            if kept is None or kept[0] != lease:
                continue  # a touched job's old entry, or an evicted job's
            del self.jobs[job]
            self.nbytes -= kept[1]
            evicted.append(job)
        return evicted


def split(budget: int, parts: int) -> list[int]:
    """``budget`` in ``parts`` budgets as equal as whole bytes allow, summing to ``budget``."""
    share, rest = divmod(budget, parts)
    return [share + (1 if k < rest else 0) for k in range(parts)]


class Sharded:
    """Jobs placed by the hash of their id, each shard evicting its own oldest down to its own budget."""

    def __init__(self, budget: int, count: int, slots: Sequence[int]) -> None:
        self.budget = budget
        self.slots = slots
        self.shards = [Shard(b) for b in split(budget, count)]
        self.arrived = [0] * count  # bytes arrived in each shard since the last rebalance
        self.rounds: list[list[int]] = []  # those counts, per past round

    def index(self, job: int) -> int:
        """The shard ``job`` lives in."""
        return self.slots[job] % len(self.shards)

    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    def arrive(self, job: int, size: int, now: int) -> list[int]:
        k = self.index(job)
        self.arrived[k] += size
        self.shards[k].add(job, size, now)
        return self.shards[k].evict()

    def touch(self, job: int, now: int) -> bool:
        return self.shards[self.index(job)].touch(job, now)

    def rebalance(self) -> list[int]:
        """A coordinator's round: each shard's new budget is its share of the bytes that arrived over the
        latest rounds that together brought the whole budget's worth (the span the global order keeps),
        so every shard keeps about the same span of time. Only per-shard byte counters cross shards."""
        self.rounds.append(self.arrived)
        self.arrived = [0] * len(self.shards)
        window = [0] * len(self.shards)
        for counts in reversed(self.rounds):
            window = [w + c for w, c in zip(window, counts, strict=True)]
            if sum(window) >= self.budget:
                break
        arrived = sum(window)
        if not arrived:
            return []
        budgets = [self.budget * w // arrived for w in window]
        evicted = []
        extras = split(self.budget - sum(budgets), len(budgets))
        for s, budget, extra in zip(self.shards, budgets, extras, strict=True):
            s.budget = budget + extra
            evicted.extend(s.evict())
        return evicted


# -- Running and measuring -----------------------------------------------------------------------------


@dataclass
class Result:
    """One configuration over the run; byte figures are fractions of the whole budget."""

    name: str
    shards: int  # 0 for the global order
    rebalance: int
    shard_budget: int
    evicted: list[int] = field(default_factory=list, repr=False)  # jobs, in eviction order
    wrong_ranks: list[float] = field(default_factory=list, repr=False)  # % of global-kept jobs older
    kept_sum: float = 0.0
    kept_samples: int = 0
    kept_min: float = math.inf
    kept_max: float = 0.0
    max_nbytes: int = 0
    touches: int = 0
    touch_misses: int = 0
    final_kept: list[int] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, object]:
        ranks = sorted(self.wrong_ranks)
        wrong = len(ranks)
        return {
            "name": self.name,
            "shards": self.shards,
            "rebalance": self.rebalance,
            "shard_budget": self.shard_budget,
            "kept_mean": self.kept_sum / self.kept_samples if self.kept_samples else math.nan,
            "kept_min": self.kept_min if self.kept_samples else math.nan,
            "kept_max": self.kept_max if self.kept_samples else math.nan,
            "max_nbytes": self.max_nbytes,
            "evicted": len(self.evicted),
            "wrongly_evicted": wrong,
            "wrong_fraction": wrong / len(self.evicted) if self.evicted else 0.0,
            "median_wrong_rank": statistics.median(ranks) if ranks else None,
            "p99_wrong_rank": ranks[min(wrong - 1, int(0.99 * wrong))] if ranks else None,
            "youngest_wrong_rank": ranks[-1] if ranks else None,
            "touch_miss_fraction": self.touch_misses / self.touches if self.touches else 0.0,
        }


def simulate(config: Config) -> tuple[Workload, list[Result]]:
    """Run the global order and every sharded configuration over the config's workload, in lockstep."""
    load = workload(config)
    return load, run(config.shards, config.rebalance, load)


def run(shards: Sequence[int], rebalance: int, load: Workload) -> list[Result]:
    """The global order first, then each shard count (and, with ``rebalance``, each rebalanced)."""
    reference = GlobalOrder(load.budget, len(load.events))
    variants: list[tuple[Sharded, Result]] = []
    for count in shards:
        for period in (0, rebalance) if rebalance else (0,):
            model = Sharded(load.budget, count, load.slots)
            name = f"{count}" + (f", rebalanced /{period}" if period else "")
            variants.append((model, Result(name, count, period, model.shards[0].budget)))
    result0 = Result("global", 0, 0, load.budget)
    full = False  # the steady state starts at the global order's first eviction
    for now, (job, size) in enumerate(load.events):
        if size >= 0:
            result0.evicted.extend(reference.arrive(job, size, now))
        else:
            result0.touches += 1
            result0.touch_misses += not reference.touch(job, now)
        full = full or bool(result0.evicted)
        _sample(result0, reference.nbytes, load.budget, full)
        for model, result in variants:
            if size >= 0:
                evicted = model.arrive(job, size, now)
            else:
                result.touches += 1
                result.touch_misses += not model.touch(job, now)
                evicted = []
            if result.rebalance and now % result.rebalance == result.rebalance - 1:
                evicted += model.rebalance()
            for victim in evicted:
                if reference.holds(victim):
                    older = reference.older(reference.lease[victim])
                    result.wrong_ranks.append(100.0 * older / reference.count())
            result.evicted.extend(evicted)
            _sample(result, model.nbytes(), load.budget, full)
    result0.final_kept = sorted(reference.lease)
    for model, result in variants:
        result.final_kept = sorted(job for s in model.shards for job in s.jobs)
    return [result0] + [result for _, result in variants]


def _sample(result: Result, nbytes: int, budget: int, full: bool) -> None:
    result.max_nbytes = max(result.max_nbytes, nbytes)
    if full:
        kept = nbytes / budget
        result.kept_sum += kept
        result.kept_samples += 1
        result.kept_min = min(result.kept_min, kept)
        result.kept_max = max(result.kept_max, kept)


# -- Output ----------------------------------------------------------------------------------------------


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def table(config: Config, load: Workload, results: list[Result]) -> str:
    sizes = load.sizes
    spread = f"sigma {config.sigma:g}" if config.dist == "lognormal" else f"alpha {config.alpha:g}"
    touches = sum(1 for _, size in load.events if size < 0)
    lines = [
        f"{config.jobs:,} jobs, {config.dist} sizes (median {size_text(config.median)}, {spread}; "
        f"mean {size_text(statistics.fmean(sizes))}, largest {size_text(max(sizes))}), "
        f"{touches:,} touches; seed {config.seed}",
        f"budget {size_text(load.budget)} = {config.budget_jobs:,} jobs of the mean size",
        "",
    ]
    head = (
        "shards",
        "jobs/shard",
        "kept mean",
        "kept min",
        "evicted",
        "wrong",
        "rank p50",
        "rank p99",
        "youngest",
        "touch misses",
    )
    rows = [head]
    for result in results:
        s = result.summary()
        count = max(1, result.shards)
        rows.append(
            (
                result.name,
                f"{config.budget_jobs / count:,.0f}",
                _percent(s["kept_mean"], 2),
                _percent(s["kept_min"], 2),
                f"{s['evicted']:,}",
                _percent(s["wrong_fraction"], 1) if result.shards else "-",
                _percent(s["median_wrong_rank"], 1, scale=1),
                _percent(s["p99_wrong_rank"], 1, scale=1),
                _percent(s["youngest_wrong_rank"], 1, scale=1),
                _percent(s["touch_miss_fraction"], 1),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    lines += [
        "",
        "jobs/shard: the budget in jobs of the mean size, per shard",
        "kept: bytes held over the whole budget, after each event once the global order is full",
        "wrong: share of the evictions taking a job the global order still kept after the same event",
        "rank: share of the globally kept jobs older than a wrongly evicted one (0% = the globally oldest)",
        "touch misses: touches (polls) of one of the last jobs-in-budget jobs that found it gone",
    ]
    return "\n".join(lines)


def _percent(value: object, digits: int, *, scale: float = 100.0) -> str:
    if value is None:
        return "-"
    return f"{scale * float(value):.{digits}f}%"  # type: ignore[arg-type]


def parse_args(argv: Sequence[str] | None) -> tuple[Config, bool]:
    """The run's config and whether to print JSON; a bad argument exits 2 naming it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Config()
    parser.add_argument("--jobs", type=int, default=defaults.jobs, help="finished jobs over the run")
    parser.add_argument(
        "--budget-jobs", type=int, default=defaults.budget_jobs, help="budget as this many mean-size jobs"
    )
    parser.add_argument("--dist", default=defaults.dist, help="lognormal or pareto")
    parser.add_argument("--median", type=int, default=defaults.median, help="median bytes of a job")
    parser.add_argument("--sigma", type=float, default=defaults.sigma, help="lognormal sigma")
    parser.add_argument("--alpha", type=float, default=defaults.alpha, help="pareto tail index (> 1)")
    parser.add_argument("--touches", type=float, default=defaults.touches, help="touches per arriving job")
    parser.add_argument(
        "--shards",
        default=",".join(map(str, defaults.shards)),
        help="comma-separated shard counts (default 1,4,16,64)",
    )
    parser.add_argument("--rebalance", type=int, default=0, help="events between rebalances (0: never)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    try:
        shards = tuple(int(part) for part in args.shards.split(","))
    except ValueError:
        parser.error(f"shards: must be comma-separated ints, got {args.shards!r}")
    try:
        config = Config(
            jobs=args.jobs,
            budget_jobs=args.budget_jobs,
            dist=args.dist,
            median=args.median,
            sigma=args.sigma,
            alpha=args.alpha,
            touches=args.touches,
            shards=shards,
            rebalance=args.rebalance,
            seed=args.seed,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return config, bool(args.json)


def main(argv: Sequence[str] | None = None) -> int:
    config, as_json = parse_args(argv)
    load, results = simulate(config)
    if as_json:
        out = {"config": asdict(config), "budget": load.budget, "results": [r.summary() for r in results]}
        print(json.dumps(out, indent=2))
    else:
        print(table(config, load, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
