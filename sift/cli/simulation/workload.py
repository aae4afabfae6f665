"""The simulated workload: the planned submissions and the synthetic results, all drawn from a seed.

The mixed workload (the default): callers of both classes submit jobs; some repeat one of their recent
idempotency keys (a client's retry) and must be answered from the store. The flood workload: one caller
submits many big jobs first, then several small callers submit small jobs; a few hot hosts take a large
share of the URLs, the rest spread over many hosts. A result is a JSON page envelope of random size whose
body is cut from a text with non-ASCII words, so that UTF-8 bytes and characters differ.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sift.dcache import BatchJob, BatchTarget, JobStatus

__all__ = [
    "ERRORS",
    "FAIL_P",
    "FLOOD_CALLER",
    "NO_OPTIONS",
    "WORKLOADS",
    "ClaimOptions",
    "JobSpec",
    "Settings",
    "corpus",
    "envelope",
    "final_status",
    "plan",
    "settings_of",
    "submission",
    "target_urls",
]

#: The callers: name, class, and how many shares of the submissions each sends.
CALLERS: tuple[tuple[str, str, int], ...] = (
    ("crawler-eu", "fleet", 4),
    ("crawler-us", "fleet", 3),
    ("uptime-monitor", "fleet", 3),
    ("alice", "restricted", 1),
    ("bob", "restricted", 1),
    ("carol", "restricted", 1),
)
#: The flood workload's callers: the flooding one, then the small ones (class restricted).
FLOOD_CALLER = ("flood", "fleet")
SMALL_CALLERS = tuple((f"small-{n}", "restricted") for n in range(4))
#: Most targets of a small caller's job.
SMALL_TARGETS = 3
#: The flood's hot hosts, the share of the flood workload's URLs they take, and how many other hosts share
#: the rest.
HOT_HOSTS = 3
HOT_SHARE = 0.5
COLD_HOSTS = 200
WORKLOADS = ("mixed", "flood")
#: Chance that a submission repeats one of the caller's recent idempotency keys (a client retry).
REPEAT_P = 0.15
#: Chance that a new submission carries no idempotency key at all.
NO_KEY_P = 0.1
#: How many of its latest keys a caller may repeat.
RECENT_KEYS = 8
#: Chance that a target fails (no result; an error and a hint instead).
FAIL_P = 0.06
#: Largest synthetic page body, in characters.
MAX_BODY = 48_000
WORDS = (
    *("fetch", "page", "render", "cache", "lease", "batch", "target", "result", "status", "header", "body"),
    *("the", "of", "and", "to", "in", "café", "naïve", "Zürich", "東京", "сайт", "ünïcödé", "🙂"),
)
ERRORS = (
    ("timeout after 10 s", "retry later"),
    ("connection reset by peer", None),
    ("HTTP 503", "retry later"),
)


@dataclass(frozen=True)
class Settings:
    """The simulation's size and seed (the command line's defaults)."""

    jobs: int = 400
    targets: int = 20
    workers: int = 4
    budget: int = 2 * 1024 * 1024
    ttl: int = 30 * 60
    seed: int = 1
    workload: str = "mixed"


@dataclass(frozen=True)
class ClaimOptions:
    """What the runners pass to ``claim_batch_targets`` besides its limit, per_job and runner."""

    per_host: int | None = None
    weights: dict[str, int] | None = None
    fair: bool = True

    def kwargs(self) -> dict[str, Any]:
        """The claim's keyword arguments: only those given (the defaults are the claim's own)."""
        given: dict[str, Any] = {}
        if self.per_host is not None:
            given["per_host"] = self.per_host
        if self.weights:
            given["weights"] = dict(self.weights)
        if not self.fair:
            given["fair"] = False
        return given


#: The claim's own defaults.
NO_OPTIONS = ClaimOptions()


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings given on the command line (sizes and durations already parsed)."""
    return Settings(
        jobs=args.jobs,
        targets=args.targets,
        workers=args.workers,
        budget=args.budget,
        ttl=args.ttl,
        seed=args.seed,
        workload=args.workload,
    )


def claim_options_of(args: argparse.Namespace) -> ClaimOptions:
    """The claim's options given on the command line (--per-host, --weights, --oldest-first)."""
    return ClaimOptions(per_host=args.per_host, weights=args.weights, fair=not args.oldest_first)


@dataclass(frozen=True)
class JobSpec:
    """One submission: who sends it, its idempotency key ("" for none), and how many targets."""

    number: int
    caller: str
    caller_class: str
    idem_key: str
    targets: int
    repeat: bool
    flood: bool = False  # of the flood workload: its URLs spread over the hot and the other hosts


def plan(settings: Settings) -> list[JobSpec]:
    """The submissions, in order, drawn from the seed."""
    if settings.workload == "flood":
        return flood_plan(settings)
    rng = random.Random(settings.seed)
    recent: dict[str, list[tuple[str, int]]] = {name: [] for name, _, _ in CALLERS}
    specs = []
    for number in range(settings.jobs):
        caller, caller_class, _ = rng.choices(CALLERS, weights=[w for _, _, w in CALLERS])[0]
        if recent[caller] and rng.random() < REPEAT_P:
            key, count = rng.choice(recent[caller])
            specs.append(JobSpec(number, caller, caller_class, key, count, repeat=True))
            continue
        count = rng.randint(1, settings.targets)
        key = "" if rng.random() < NO_KEY_P else f"req-{number:05d}"
        if key:
            recent[caller] = [*recent[caller], (key, count)][-RECENT_KEYS:]
        specs.append(JobSpec(number, caller, caller_class, key, count, repeat=False))
    return specs


def flood_plan(settings: Settings) -> list[JobSpec]:
    """The flood: half the submissions (at least one) are the flooding caller's jobs of ``targets`` targets
    each, sent first; then the small callers' jobs of 1 to SMALL_TARGETS targets, in turn. No repeats."""
    rng = random.Random(settings.seed)
    big = max(1, settings.jobs // 2)
    specs = [
        JobSpec(n, *FLOOD_CALLER, f"req-{n:05d}", settings.targets, repeat=False, flood=True)
        for n in range(big)
    ]
    for n in range(big, settings.jobs):
        caller, caller_class = SMALL_CALLERS[(n - big) % len(SMALL_CALLERS)]
        count = rng.randint(1, min(SMALL_TARGETS, settings.targets))
        specs.append(JobSpec(n, caller, caller_class, f"req-{n:05d}", count, repeat=False, flood=True))
    return specs


def corpus(seed: int) -> str:
    """The text result bodies are cut from (non-ASCII included, so UTF-8 bytes and characters differ)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(2 * MAX_BODY // 4))


def envelope(rng: random.Random, text: str, url: str, **extra: Any) -> str:
    """A synthetic result: a JSON page envelope of random size, its body cut from ``text``."""
    size = min(MAX_BODY, int(rng.lognormvariate(7.3, 1.1)))
    start = rng.randrange(0, len(text) - size)
    page = {
        "url": url,
        "status": 200,
        "headers": {"content-type": "text/html; charset=utf-8"},
        "elapsed_ms": rng.randint(20, 900),
        **extra,
        "body": text[start : start + size],
    }
    return json.dumps(page, ensure_ascii=False)


def target_urls(spec: JobSpec) -> list[str]:
    """The URLs of the job ``spec`` submits; in the flood workload each on a hot host with HOT_SHARE chance,
    else on one of COLD_HOSTS others, drawn from the job's number."""
    if spec.flood:
        rng = random.Random(spec.number)
        urls = []
        for idx in range(spec.targets):
            hot = rng.random() < HOT_SHARE
            host = (
                f"hot-{rng.randrange(HOT_HOSTS)}.example"
                if hot
                else f"site-{rng.randrange(COLD_HOSTS)}.example"
            )
            urls.append(f"https://{host}/{spec.caller}/{spec.number}/{idx}")
        return urls
    return [f"https://{spec.caller}.example/page/{spec.number}/{idx}" for idx in range(spec.targets)]


def submission(spec: JobSpec, job_id: str, now: int) -> tuple[BatchJob, Iterator[BatchTarget]]:
    """The queued job and the targets a caller submits for ``spec``."""
    options = json.dumps({"render": spec.number % 3 == 0, "timeout_s": 10})
    job = BatchJob(
        id=job_id,
        caller=spec.caller,
        caller_class=spec.caller_class,
        idem_key=spec.idem_key,
        status=JobStatus.QUEUED,
        targets_total=spec.targets,
        created_at=now,
        lease=now,
    )
    return job, (BatchTarget(idx=i, url=u, options=options) for i, u in enumerate(target_urls(spec)))


def final_status(failed: int, total: int) -> tuple[JobStatus, str]:
    """A finished job's status and error, from how many of its ``total`` targets failed."""
    if failed == 0:
        return JobStatus.DONE, ""
    if failed == total:
        return JobStatus.FAILED, "every target failed"
    return JobStatus.PARTIAL, f"{failed} of {total} targets failed"
