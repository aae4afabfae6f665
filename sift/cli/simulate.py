"""``sift simulate``: a realistic workload against the store, then a summary and an invariant check.

Callers of both classes submit jobs from their own threads; some repeat an idempotency key and must be
answered from the store. Worker threads play the runner: they take targets from a bounded queue, write a
synthetic JSON result envelope of random size, and call ``evict_batch_oldest(budget)`` after each.
Time is a simulated clock (every store call gets ``now=`` from it): it advances ``STEP_S`` seconds per
target written, and a sweep runs whenever it passes the next multiple of a quarter of the ttl. Once half
the submissions are handled, the runner crashes: its workers stop after their current target, the callers
wait, the queue (and whatever a caller had not queued yet) is lost, the store is reopened as a new runner
process would open it, and that runner, at its start, calls ``mark_in_flight_failed`` to fail the jobs that
were in flight; then the callers carry on against its new set of workers. Reconciliation is the runner's
alone, as in a real deployment: the callers (the web workers) never call ``mark_in_flight_failed``.

It never changes a store holding jobs it did not make: without ``--db`` or ``$SIFT_DB`` it works on a new
file of its own (see :func:`sift.cli.store.new_simulation_store`), and a named file that already holds
jobs is refused before it is opened for writing. On PostgreSQL it works in a schema of its own (see
:func:`postgres_simulation_store`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import peewee

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, JobNotFound, JobStatus, TargetNotFound, TargetStatus
from sift.dcache.clock import unix_now

from .inspection import counts_by_status
from .progress import make_bar
from .report import Column, emit_json, format_count, format_size, format_span, key_values, plural, table
from .store import OPEN_TIMEOUT_S, CommandError, is_postgres

__all__ = [
    "Settings",
    "Simulation",
    "check_invariants",
    "cmd_simulate",
    "plan",
    "postgres_simulation_store",
]

#: Simulated seconds that pass per target result written.
STEP_S = 2
#: The callers: name, class, and how many shares of the submissions each sends.
CALLERS: tuple[tuple[str, str, int], ...] = (
    ("crawler-eu", "fleet", 4),
    ("crawler-us", "fleet", 3),
    ("uptime-monitor", "fleet", 3),
    ("alice", "restricted", 1),
    ("bob", "restricted", 1),
    ("carol", "restricted", 1),
)
#: Chance that a submission repeats one of the caller's recent idempotency keys (a client retry).
REPEAT_P = 0.15
#: Chance that a new submission carries no idempotency key at all.
NO_KEY_P = 0.1
#: How many of its latest keys a caller may repeat.
RECENT_KEYS = 8
#: Chance that a target fails (no result; an error and a hint instead).
FAIL_P = 0.06
#: Chance that a caller polls one of its earlier jobs after a submission.
POLL_P = 0.3
#: Targets the runner's in-memory queue holds per worker (callers wait when it is full).
QUEUE_PER_WORKER = 8
#: Largest synthetic page body, in characters.
MAX_BODY = 48_000
RESTART_REASON = "runner restarted (simulated crash)"
WORDS = (
    *("fetch", "page", "render", "cache", "lease", "batch", "target", "result", "status", "header", "body"),
    *("the", "of", "and", "to", "in", "café", "naïve", "Zürich", "東京", "сайт", "ünïcödé", "🙂"),
)
ERRORS = (
    ("timeout after 10 s", "retry later"),
    ("connection reset by peer", None),
    ("HTTP 503", "retry later"),
)
FINAL_TARGET = (TargetStatus.DONE.value, TargetStatus.FAILED.value)


@dataclass(frozen=True)
class Settings:
    jobs: int = 400
    targets: int = 20
    workers: int = 4
    budget: int = 2 * 1024 * 1024
    ttl: int = 30 * 60
    seed: int = 1


@dataclass(frozen=True)
class JobSpec:
    """One submission: who sends it, its idempotency key ("" for none), and how many targets."""

    number: int
    caller: str
    caller_class: str
    idem_key: str
    targets: int
    repeat: bool


def plan(settings: Settings) -> list[JobSpec]:
    """The submissions, in order, drawn from the seed."""
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


class SimClock:
    """The simulated clock: advances a fixed step per target written; says when a sweep is due."""

    def __init__(self, start: int, step: int, sweep_every: int) -> None:
        self._lock = threading.Lock()
        self._now = start
        self.start = start
        self.step = step
        self.sweep_every = max(1, sweep_every)
        self._next_sweep = start + self.sweep_every

    def now(self) -> int:
        with self._lock:
            return self._now

    def tick(self) -> tuple[int, bool]:
        """Advance one step; return the new time and whether a sweep is due at it."""
        with self._lock:
            self._now += self.step
            due = self._now >= self._next_sweep
            if due:
                self._next_sweep = self._now + self.sweep_every
            return self._now, due


@dataclass
class JobRun:
    """What the runner knows of a job it queued."""

    job_id: str
    spec: JobSpec
    remaining: int
    failed: int = 0
    started: bool = False
    gone: bool = False


@dataclass
class Tally:
    submissions: int = 0
    jobs_created: int = 0
    idem_hits: int = 0
    idem_wrong: int = 0
    idem_started_anew: int = 0
    polls: int = 0
    targets_written: int = 0
    targets_failed: int = 0
    targets_lost: int = 0
    sweeps: int = 0
    jobs_swept: int = 0
    jobs_evicted: int = 0
    restart_dropped_targets: int = 0
    restart_marked_failed: int = 0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


class Simulation:
    def __init__(self, settings: Settings, path: str, bar: Any) -> None:
        self.settings = settings
        self.path = path
        self.bar = bar
        self.prefix = f"sim-{secrets.token_hex(3)}"
        # Ids and keys carry the run's prefix, so they cannot collide with jobs of another run.
        self.specs = [
            replace(spec, idem_key=f"{self.prefix}-{spec.idem_key}" if spec.idem_key else "")
            for spec in plan(settings)
        ]
        planned_span = sum(spec.targets for spec in self.specs) * STEP_S
        self.clock = SimClock(unix_now() - planned_span, STEP_S, settings.ttl // 4)
        self.queue: queue.Queue[tuple[str, int, str] | None] = queue.Queue(
            QUEUE_PER_WORKER * settings.workers
        )
        self.lock = threading.Lock()
        self.runs: dict[str, JobRun] = {}
        self.created: dict[tuple[str, str], set[str]] = {}
        self.tally = Tally()
        self.counters_before_restart: dict[str, int] = {}
        # The crash: set once half the submissions are handled; workers stop, callers park until resumed.
        self.crashing = threading.Event()
        self.resumed = threading.Event()
        self.crash_after = max(1, len(self.specs) // 2)
        self.callers_parked = 0
        self.callers_finished = 0
        self.parking = threading.Condition(self.lock)
        self.abort = threading.Event()
        self.errors: list[BaseException] = []
        self.corpus = corpus(settings.seed)
        self.handled = 0

    # -- bookkeeping ------------------------------------------------------------------------------------

    def add(self, **amounts: int) -> None:
        with self.lock:
            for name, amount in amounts.items():
                setattr(self.tally, name, getattr(self.tally, name) + amount)

    def resolved(self) -> None:
        with self.lock:
            self.bar.update(1)

    def item_done(self, run: JobRun) -> bool:
        """Count one queued target of ``run`` as handled; True when it was the job's last."""
        with self.lock:
            run.remaining -= 1
            last = run.remaining == 0
        if last:
            self.resolved()
        return last

    def guarded(self, fn: Callable[..., None], *args: Any) -> Callable[[], None]:
        def body() -> None:
            try:
                fn(*args)
            except BaseException as exc:
                with self.lock:
                    self.errors.append(exc)
                self.abort.set()

        return body

    # -- callers (the API side) -------------------------------------------------------------------------

    def caller(self, specs: list[JobSpec], seed: int) -> None:
        try:
            self.submissions(specs, random.Random(seed))
        finally:
            with self.parking:
                self.callers_finished += 1
                self.parking.notify_all()

    def checkpoint(self) -> None:
        """While the runner is down, a caller waits here (its requests would fail) until it is back."""
        if not self.crashing.is_set():
            return
        with self.parking:
            self.callers_parked += 1
            self.parking.notify_all()
        while not (self.resumed.wait(0.05) or self.abort.is_set()):
            pass
        with self.parking:
            self.callers_parked -= 1

    def submissions(self, specs: list[JobSpec], rng: random.Random) -> None:
        mine: list[str] = []
        for spec in specs:
            self.checkpoint()
            if self.abort.is_set():
                return
            self.submit_one(spec, rng, mine)
            with self.lock:
                self.handled += 1
                if self.handled == self.crash_after:
                    self.crashing.set()

    def submit_one(self, spec: JobSpec, rng: random.Random, mine: list[str]) -> None:
        self.add(submissions=1)
        job_id = f"{self.prefix}-{spec.number:05d}"
        found = self.submit(spec, job_id)  # the idempotency lookup and the create, one transaction
        if found is not None:
            with self.lock:
                right = found in self.created.get((spec.caller, spec.idem_key), set())
            self.add(idem_hits=1, idem_wrong=0 if right else 1)
            self.resolved()
            return
        if spec.repeat:
            self.add(idem_started_anew=1)
        mine.append(job_id)
        if rng.random() < POLL_P:
            self.poll(rng.choice(mine))

    def submit(self, spec: JobSpec, job_id: str) -> str | None:
        """``submit_batch_job``: None when the job was created (its targets then go to the runner's
        queue), else the id of the job the store answered the repeat with."""
        now = self.clock.now()
        job, targets = submission(spec, job_id, now)
        found, created = dcache.submit_batch_job(job, targets, self.settings.ttl, now=now)
        if not created:
            return found
        with self.lock:
            self.runs[job_id] = JobRun(job_id, spec, remaining=spec.targets)
            self.created.setdefault((spec.caller, spec.idem_key), set()).add(job_id)
            self.tally.jobs_created += 1
        run = self.runs[job_id]
        for idx, url in enumerate(target_urls(spec)):
            while True:
                if self.abort.is_set():
                    return None
                if self.crashing.is_set():  # the runner died: what it had not queued yet is lost too
                    for _ in range(idx, spec.targets):
                        self.add(restart_dropped_targets=1)
                        self.item_done(run)
                    return None
                try:
                    self.queue.put((job_id, idx, url), timeout=0.05)
                    break
                except queue.Full:
                    continue
        return None

    def poll(self, job_id: str) -> None:
        """A caller reads one of its jobs; a finished one's results are fetched, which renews its lease."""
        self.add(polls=1)
        job = dcache.batch_job(job_id)
        if job is None or job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
            return
        dcache.batch_targets(job_id)
        with contextlib.suppress(JobNotFound):  # swept or evicted in between
            dcache.touch_batch_job(job_id, now=self.clock.now())

    # -- workers (the runner) ---------------------------------------------------------------------------

    def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        while not (self.crashing.is_set() or self.abort.is_set()):
            try:
                item = self.queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is None:
                return
            self.run_target(rng, *item)

    def envelope(self, rng: random.Random, url: str) -> str:
        return envelope(rng, self.corpus, url)

    def run_target(self, rng: random.Random, job_id: str, idx: int, url: str) -> None:
        run = self.runs[job_id]
        sweep_at: int | None = None
        failed = False
        if not run.gone:
            try:
                with self.lock:
                    first, run.started = not run.started, True
                if first:
                    dcache.set_batch_job_status(job_id, JobStatus.RUNNING, now=self.clock.now())
                dcache.update_batch_target(job_id, idx, TargetStatus.RUNNING, now=self.clock.now())
                now, sweep_due = self.clock.tick()
                sweep_at = now if sweep_due else None
                if rng.random() < FAIL_P:
                    failed = True
                    error, hint = rng.choice(ERRORS)
                    dcache.update_batch_target(
                        job_id, idx, TargetStatus.FAILED, error=error, hint=hint, now=now
                    )
                else:
                    result = self.envelope(rng, url)
                    dcache.update_batch_target(job_id, idx, TargetStatus.DONE, result=result, now=now)
                self.add(targets_written=1, targets_failed=int(failed))
            except (JobNotFound, TargetNotFound):
                run.gone = True  # swept while it waited: a real runner drops the rest of it
        if run.gone:
            self.add(targets_lost=1)
        with self.lock:
            run.failed += int(failed)
        if self.item_done(run) and not run.gone:
            self.finish_job(run)
        if sweep_at is not None:
            swept = dcache.sweep_batch(self.settings.ttl, now=sweep_at)
            self.add(sweeps=1, jobs_swept=swept)
        self.add(jobs_evicted=dcache.evict_batch_oldest(self.settings.budget))

    def finish_job(self, run: JobRun) -> None:
        total = run.spec.targets
        if run.failed == 0:
            status, error = JobStatus.DONE, ""
        elif run.failed == total:
            status, error = JobStatus.FAILED, "every target failed"
        else:
            status, error = JobStatus.PARTIAL, f"{run.failed} of {total} targets failed"
        try:
            dcache.set_batch_job_status(run.job_id, status, error, now=self.clock.now())
        except JobNotFound:
            run.gone = True

    # -- the run ----------------------------------------------------------------------------------------

    def threads(self, phase: int) -> tuple[list[threading.Thread], list[threading.Thread]]:
        by_caller: dict[str, list[JobSpec]] = {}
        for spec in self.specs:
            by_caller.setdefault(spec.caller, []).append(spec)
        base = self.settings.seed * 1000 + phase * 100
        callers = [
            threading.Thread(
                target=self.guarded(self.caller, mine, base + n), name=f"caller-{name}", daemon=True
            )
            for n, (name, mine) in enumerate(by_caller.items())
        ]
        workers = [
            threading.Thread(target=self.guarded(self.worker, base + 50 + n), name=f"worker-{n}", daemon=True)
            for n in range(self.settings.workers)
        ]
        return callers, workers

    def show_status(self) -> None:
        if self.bar.disable is False:
            stored, live = format_size(dcache.batch_nbytes()), dcache.live_batch_jobs_total()
            self.bar.set_postfix_str(f"{stored} stored, {live} live", refresh=False)

    def wait(self, threads: list[threading.Thread]) -> None:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
                self.show_status()

    def wait_for(self, ready: Callable[[], bool]) -> None:
        with self.parking:
            while not (ready() or self.abort.is_set()):
                self.parking.wait(0.05)

    def run(self) -> None:
        callers, workers = self.threads(0)
        running = callers + workers
        try:
            for thread in running:
                thread.start()
            # The crash, once half the submissions are handled: workers stop after their current target,
            # callers park, and the runner's queue is lost.
            while not (self.crashing.wait(0.2) or self.abort.is_set()):
                self.show_status()
            self.wait(workers)
            self.wait_for(lambda: self.callers_parked + self.callers_finished == len(callers))
            if not self.abort.is_set():
                self.restart()
            # A new runner process takes over; the callers carry on.
            workers = self.threads(1)[1]
            running = callers + workers
            self.crashing.clear()
            for thread in workers:
                thread.start()
            self.resumed.set()
            self.wait(callers)
            for _ in workers:
                while not self.abort.is_set():
                    try:
                        self.queue.put(None, timeout=0.05)
                        break
                    except queue.Full:
                        continue
            self.wait(workers)
        except BaseException:
            self.abort.set()
            raise
        finally:
            for thread in running:
                if thread.ident is not None:
                    thread.join()
        if self.errors:
            raise self.errors[0]

    def restart(self) -> None:
        """The runner process starts again: its queue is gone; it opens the store and, before it takes any
        work, reconciles (``mark_in_flight_failed``). Only the runner does this; the callers, which stand
        for web workers, never do."""
        dropped = 0
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                dropped += 1
                self.item_done(self.runs[item[0]])
        if self.path != ":memory:":  # a new process: its counters start again from zero
            self.counters_before_restart = dcache.stats()
            dcache.close_db()
            dcache.open_db(self.path, timeout=OPEN_TIMEOUT_S)
        marked = dcache.mark_in_flight_failed(RESTART_REASON, now=self.clock.now())
        evicted = dcache.evict_batch_oldest(self.settings.budget)
        self.add(restart_dropped_targets=dropped, restart_marked_failed=marked, jobs_evicted=evicted)

    def counters(self) -> dict[str, int]:
        """stats() over the whole run: the first process's counters plus the restarted one's."""
        now = dcache.stats()
        return {name: now[name] + self.counters_before_restart.get(name, 0) for name in now}


def check_invariants(budget: int | None = None) -> list[Check]:
    """The store's invariants, read with plain SELECTs (no job may be queued or running)."""
    J, T = BatchJob, BatchTarget
    jobs = J.select().count()
    finished_rows = T.select(peewee.fn.COUNT(peewee.SQL("*"))).where(
        (T.job_id == J.id) & T.status.in_(FINAL_TARGET)
    )
    bad_done = J.select().where(J.targets_done != finished_rows).count()
    result_bytes = T.select(
        peewee.fn.COALESCE(peewee.fn.SUM(dcache.db.backend.byte_length(T.result)), 0)
    ).where(T.job_id == J.id)
    bad_bytes = J.select().where(J.nbytes != result_bytes).count()
    total = J.select(peewee.fn.COALESCE(peewee.fn.SUM(J.nbytes), 0)).scalar()
    orphans = T.select().where(T.job_id.not_in(J.select(J.id))).count()
    live = dcache.live_batch_jobs_total()
    nbytes = dcache.batch_nbytes()
    checks = [
        Check(
            "targets_done equals each job's done and failed target rows",
            bad_done == 0,
            f"{bad_done} of {jobs} jobs differ" if bad_done else f"{jobs} jobs",
        ),
        Check(
            "nbytes equals the UTF-8 bytes of each job's results",
            bad_bytes == 0,
            f"{bad_bytes} of {jobs} jobs differ" if bad_bytes else f"{jobs} jobs",
        ),
        Check("batch_nbytes() equals SUM(nbytes)", nbytes == total, f"{nbytes:,} and {total:,}"),
        Check("no target row without its job", orphans == 0, f"{orphans} orphan targets"),
        Check("no job left queued or running", live == 0, f"{live} live jobs"),
    ]
    if budget is not None:
        checks.append(Check("bytes stored within the budget", nbytes <= budget, f"{nbytes:,} of {budget:,}"))
    return checks


#: The tables a store has on PostgreSQL: a schema holding any other table is someone else's.
POSTGRES_STORE_TABLES = frozenset({"batch_job", "batch_target", "batch_totals", "sift_schema"})


def postgres_simulation_store(target: str, source: str) -> tuple[str, str | None]:
    """The PostgreSQL store simulate may use for ``target`` (named by ``source``), and the schema it made.

    Without ``?schema=``, a new schema of its own, ``sift_sim_<UTC time>_<pid>``, created here with a
    plain ``CREATE SCHEMA`` (so it cannot be one that already existed); it is kept after the run. With
    ``?schema=NAME``, as a named SQLite file: used if missing or an empty store, refused (unchanged) if it
    holds jobs or tables that are not the store's. Nothing but that schema is ever written to.
    """
    import psycopg  # the CLI reaches here only for a postgresql:// target

    from sift.dcache.backends import parse_target

    url, schema = parse_target(target)  # StoreUnavailable ("schema: ...") for a name sift does not use
    query = urllib.parse.parse_qsl(urllib.parse.urlsplit(target).query, keep_blank_values=True)
    named = any(key == "schema" for key, _ in query)
    try:
        with psycopg.connect(url, connect_timeout=int(OPEN_TIMEOUT_S), autocommit=True) as conn:
            if named:
                _refuse_postgres_schema(conn, schema, source)
                return target, None
            stamp = time.strftime("%Y%m%d_%H%M%S", time.gmtime())
            for attempt in range(100):
                name = f"sift_sim_{stamp}_{os.getpid()}" + (f"_{attempt}" if attempt else "")
                try:
                    conn.execute(f'CREATE SCHEMA "{name}"')
                except psycopg.errors.DuplicateSchema:
                    continue
                return f"{target}{'&' if '?' in target else '?'}schema={name}", name
            raise CommandError(f"{source}: could not make a new schema sift_sim_{stamp}_{os.getpid()}_*")
    except psycopg.Error as exc:
        raise CommandError(f"{source}: cannot reach {shown_store(target)}: {exc}") from exc


def _refuse_postgres_schema(conn: Any, schema: str, source: str) -> None:
    rows = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchall()
    tables = {row[0] for row in rows}
    if "batch_job" in tables:
        holds_jobs = conn.execute(f'SELECT EXISTS (SELECT 1 FROM "{schema}".batch_job)').fetchone()[0]
        if holds_jobs:
            raise CommandError(
                f"{source}: schema {schema} already holds jobs; simulate runs only on a new or empty store, "
                "so it never changes real data (without ?schema= it makes a new schema of its own)"
            )
    if foreign := sorted(tables - POSTGRES_STORE_TABLES):
        raise CommandError(
            f"{source}: schema {schema} holds other tables ({', '.join(foreign)}), not an empty store; "
            "simulate never writes into it (without ?schema= it makes a new schema of its own)"
        )


def target_urls(spec: JobSpec) -> list[str]:
    """The URLs of the job ``spec`` submits."""
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


def shown_store(target: str) -> str:
    """The store as the summary names it: a PostgreSQL URL without its password."""
    if not is_postgres(target):
        return target
    from sift.dcache.backends import shown_url

    return shown_url(target)


def _jobs_by_status() -> dict[str, int]:
    return counts_by_status(BatchJob, tuple(s.value for s in JobStatus))


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(
        jobs=args.jobs,
        targets=args.targets,
        workers=args.workers,
        budget=args.budget,
        ttl=args.ttl,
        seed=args.seed,
    )


def kept_schema_note(schema: str | None) -> str:
    """What the summary adds to a PostgreSQL schema simulate made: it is kept, and how to drop it."""
    return f" (kept; to drop it: DROP SCHEMA {schema} CASCADE)" if schema else ""


def cmd_simulate(args: argparse.Namespace) -> int:
    if getattr(args, "hosts", None) is not None:
        from .hosts import cmd_simulate_hosts  # here: hosts builds on this module

        return cmd_simulate_hosts(args)
    settings = settings_of(args)
    started = time.perf_counter()
    with make_bar(settings.jobs, "simulate", "job") as bar:
        sim = Simulation(settings, getattr(args, "sim_target", args.db), bar)
        sim.run()
    seconds = time.perf_counter() - started
    summary = _summary(sim, seconds)
    summary["schema_made"] = getattr(args, "sim_schema", None)
    if args.json:
        emit_json(summary)
    else:
        print("\n".join(_human(summary)))
    return 0 if summary["ok"] else 1


def _summary(sim: Simulation, seconds: float) -> dict[str, Any]:
    tally = sim.tally
    counters = sim.counters()
    checks = check_invariants(sim.settings.budget)
    checks += [
        Check(
            "every idempotent answer was that caller's job with that key",
            tally.idem_wrong == 0,
            f"{tally.idem_wrong} wrong of {tally.idem_hits}",
        ),
        Check(
            "stats() counters agree with what the calls returned",
            (counters["jobs_swept"], counters["jobs_evicted"], counters["batch_idem_hit"])
            == (tally.jobs_swept, tally.jobs_evicted, tally.idem_hits),
            f"swept {counters['jobs_swept']}/{tally.jobs_swept}, evicted {counters['jobs_evicted']}/"
            f"{tally.jobs_evicted}, idempotent hits {counters['batch_idem_hit']}/{tally.idem_hits}",
        ),
    ]
    callers = sorted({(spec.caller, spec.caller_class) for spec in sim.specs})
    return {
        "db": shown_store(sim.path),
        "settings": asdict(sim.settings),
        "callers": {name: cls for name, cls in callers},
        "seconds": round(seconds, 3),
        "simulated_seconds": sim.clock.now() - sim.clock.start,
        "targets_per_s": round(tally.targets_written / seconds, 1) if seconds > 0 else None,
        "tally": asdict(tally),
        "restart_after_submissions": sim.crash_after,
        "bytes_stored": dcache.batch_nbytes(),
        "budget": sim.settings.budget,
        "bytes_evicted": counters["bytes_evicted"],
        "jobs": _jobs_by_status(),
        "counters": counters,
        "invariants": [asdict(check) for check in checks],
        "ok": all(check.ok for check in checks),
    }


def _human(summary: dict[str, Any]) -> Iterator[str]:
    t = summary["tally"]
    s = summary["settings"]
    fleet = sum(1 for cls in summary["callers"].values() if cls == "fleet")
    restricted = len(summary["callers"]) - fleet
    budget, stored = summary["budget"], summary["bytes_stored"]
    yield (
        f"Simulated {format_count(t['submissions'])} submissions from {len(summary['callers'])} callers "
        f"({fleet} fleet, {restricted} restricted) with {s['workers']} workers in {summary['seconds']:.1f} s "
        f"(seed {s['seed']}, {format_span(summary['simulated_seconds'])} of simulated time)"
    )
    yield ""
    yield from key_values(
        [
            ("store", summary["db"] + kept_schema_note(summary.get("schema_made"))),
            ("jobs created", format_count(t["jobs_created"])),
            (
                "targets written",
                f"{format_count(t['targets_written'])} ({format_count(t['targets_failed'])} failed), "
                f"{summary['targets_per_s']:,} targets/s",
            ),
            (
                "idempotent repeats",
                f"{format_count(t['idem_hits'])} answered from the store, "
                f"{format_count(t['idem_started_anew'])} started anew (original gone or failed)",
            ),
            (
                "runner restart",
                f"after {format_count(summary['restart_after_submissions'])} submissions: "
                f"{plural(t['restart_dropped_targets'], 'queued target')} lost; "
                "the new runner alone reconciled at its start: "
                f"{plural(t['restart_marked_failed'], 'in-flight job')} marked failed",
            ),
            (
                "sweeps",
                f"{plural(t['sweeps'], 'sweep')} (ttl {format_span(s['ttl'])}): "
                f"{plural(t['jobs_swept'], 'job')} swept",
            ),
            (
                "eviction",
                f"{plural(t['jobs_evicted'], 'job')} evicted, {format_size(summary['bytes_evicted'])} freed",
            ),
            (
                "bytes stored",
                f"{format_size(stored)} of {format_size(budget)} budget "
                f"({100 * stored / budget if budget else 0:.0f}%)",
            ),
            ("polls", f"{format_count(t['polls'])} reads of earlier jobs by their callers"),
        ],
        indent="  ",
    )
    yield from summary_footer(summary)


def summary_footer(summary: dict[str, Any]) -> Iterator[str]:
    """The end of a human summary (single process or hosts): jobs by status, then the invariants' verdicts."""
    yield ""
    yield "Jobs by status"
    rows = [{"status": k, "count": format_count(v)} for k, v in summary["jobs"].items()]
    yield from table(rows, [Column("status", "status"), Column("count", "count", right=True)], indent="  ")
    yield ""
    yield "Invariants"
    for check in summary["invariants"]:
        yield f"  {'ok  ' if check['ok'] else 'FAIL'}  {check['name']} ({check['detail']})"
    yield ""
    yield "All invariants hold." if summary["ok"] else "INVARIANTS FAILED: the store is inconsistent."
