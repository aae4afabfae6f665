"""``sift simulate --hosts N``: N real processes, each a host of the service, share one store.

Each host process opens the store itself (one SQLite file for all, or one PostgreSQL schema) and runs:

- API threads: they send the host's share of the planned submissions through ``submit_batch_job``. A repeat
  of an idempotency key goes to another host than its original, as a client's retry through a load
  balancer may. Each thread keeps at most ``IN_FLIGHT`` of its jobs unfinished, polling them with
  ``batch_job`` (and ``batch_targets`` once one finished) before it submits more.
- runner threads (``--workers``): ``claim_batch_targets(CLAIM_LIMIT, per_job=PER_JOB)``, then for each
  target a fetch (it waits ``--fetch-ms`` on average, as a real fetch waits on the network with the GIL
  released; one in ``SLOW_EVERY`` is slow besides, and touches the lease of every job the runner holds a
  claim of while it waits), ``update_batch_target`` with the result, ``set_batch_job_status`` once the
  job's ``targets_done`` reaches ``targets_total``, and ``evict_batch_oldest(budget)`` after each claim.
- a rescuer thread: ``rescue_stale_jobs(stale_after, RESCUE_REASON)`` every ``RESCUE_EVERY_S``.

The store's functions run on the real clock, so ``stale_after`` is real seconds. Part-way through (a third
of the planned targets written, and the victim holding claimed targets it has not written yet) the coordinator
SIGKILLs the last host. The others rescue its jobs once their leases are ``stale_after`` old, and claim the
jobs it had submitted but nobody had started. The run ends when every survivor has sent its submissions
and seen them finish, and no job is queued or running.

What each host did is in its journal: a file of JSON lines that it alone appends to, with every claim (the
targets, as soon as ``claim_batch_targets`` returned, and how long the call took), every target written,
every submission's answer and every rescue. Each record is one ``write(2)`` to a file opened ``O_APPEND``,
with no buffer in the process: once the call has returned, the record is in the kernel's page cache, which
a SIGKILL of the process does not lose. An fsync would add a guard against a crash of the whole machine,
which the simulation does not model. A claim commits in the store before its record is written, so the
killed host's journal may lack its very last claims and writes: the check allows exactly that (a target of
the killed host left running, or written, that its journal does not name) and nothing else.

At the end :func:`check_run` checks the store against the journals.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, JobNotFound, JobStatus, TargetNotFound, TargetStatus
from sift.dcache.clock import unix_now

from .report import Column, emit_json, format_count, format_size, key_values, plural, table
from .simulate import (
    ERRORS,
    FAIL_P,
    Check,
    JobSpec,
    Settings,
    check_invariants,
    corpus,
    envelope,
    kept_schema_note,
    plan,
    settings_of,
    shown_store,
    submission,
    summary_footer,
)
from .store import OPEN_TIMEOUT_S, CommandError, is_postgres

__all__ = ["RESCUE_REASON", "HostsRun", "check_run", "cmd_simulate_hosts", "read_journal", "run_hosts"]

#: API threads per host.
API_THREADS = 2
#: Jobs an API thread keeps unfinished before it polls instead of submitting more.
IN_FLIGHT = 2
#: Targets one claim takes, and at most how many of one job (so one big job does not starve the rest).
CLAIM_LIMIT = 4
PER_JOB = 2
#: One fetch in this many is slow: it lasts SLOW_TOUCHES * TOUCH_EVERY_S and touches the runner's jobs.
SLOW_EVERY = 40
SLOW_TOUCHES = 3
TOUCH_EVERY_S = 0.02
#: How often each host's rescuer calls rescue_stale_jobs.
RESCUE_EVERY_S = 0.5
#: How long an idle runner or a polling API thread waits before trying again.
IDLE_S = 0.01
POLL_S = 0.005
#: The error a rescued job gets.
RESCUE_REASON = "rescued: its host stopped renewing the lease (simulated SIGKILL)"
#: The coordinator gives up when no host records anything for this long, plus stale_after (and the check
#: then fails).
STALL_S = 30.0
#: Which part of the planned targets is written before the victim is killed.
KILL_AFTER = 1 / 3
LIVE = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
IDEM_STATUSES = (
    JobStatus.QUEUED.value,
    JobStatus.RUNNING.value,
    JobStatus.DONE.value,
    JobStatus.PARTIAL.value,
)


# -- journals ----------------------------------------------------------------------------------------------


class Journal:
    """A host's record of what it did: JSON lines, each one unbuffered ``write(2)`` in append mode."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.lock = threading.Lock()

    def write(self, **record: Any) -> None:
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
        with self.lock:
            os.write(self.fd, line)

    def close(self) -> None:
        os.close(self.fd)


class JournalReader:
    """Reads the records appended to a journal since the last call (a line still being written waits)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.records: list[dict[str, Any]] = []

    def new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        fresh = [json.loads(line) for line in data[:end].splitlines()]
        self.records += fresh
        return fresh


def read_journal(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a journal."""
    reader = JournalReader(str(path))
    reader.new()
    return reader.records


# -- one host ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostConfig:
    target: str
    journal: str
    host: int
    prefix: str
    settings: Settings
    stale_after: int
    specs: tuple[JobSpec, ...]
    fetch_s: float = 0.0  # the mean network time of a fetch


def host_main(config: HostConfig, conn: multiprocessing.connection.Connection) -> None:
    """A host process: open the store, say ready, run on "go" until "stop", say bye."""
    Host(config).serve(conn)


class Host:
    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.journal = Journal(config.journal)
        self.stop = threading.Event()
        self.failed = threading.Event()
        self.errors: list[str] = []
        self.text = corpus(config.settings.seed)
        self.claim_numbers = itertools.count()
        self.numbers_lock = threading.Lock()
        self.empty_claims = 0  # calls that found nothing to claim (written in the end record)
        self.go = threading.Event()  # the coordinator said go
        self.warmed = threading.Barrier(1)

    def serve(self, conn: multiprocessing.connection.Connection) -> None:
        c = self.config
        threads = API_THREADS + c.settings.workers + 3  # and the rescuer, the main thread, one spare
        options: dict[str, Any] = {"max_connections": threads} if is_postgres(c.target) else {}
        dcache.open_db(c.target, timeout=OPEN_TIMEOUT_S, **options)
        try:
            # Every thread opens its connection (on PostgreSQL, one of the pool's each) before the host says
            # it is ready, as in a host that has served for a while: the first claims do not time it.
            self.warmed = threading.Barrier(API_THREADS + c.settings.workers + 2)
            seed = c.settings.seed * 1000 + c.host * 100
            api = [
                self.thread(self.api, list(c.specs[n::API_THREADS]), seed + n, name=f"api-{n}")
                for n in range(API_THREADS)
            ]
            runners = [
                self.thread(self.runner, seed + 50 + n, name=f"runner-{n}") for n in range(c.settings.workers)
            ]
            host_threads = [*api, *runners, self.thread(self.rescuer, name="rescuer")]
            try:
                self.warmed.wait()
            except threading.BrokenBarrierError:  # a thread could not connect: the host does not start
                self.halt(host_threads)
                conn.send(("failed", c.host, self.errors))
                return
            conn.send(("ready", c.host))
            if conn.recv() != "go":
                self.halt(host_threads)
                return
            self.journal.write(k="start", t=time.monotonic())
            self.go.set()
            for thread in api:
                while thread.is_alive() and not self.failed.is_set():
                    thread.join(0.05)
            if not self.failed.is_set():
                conn.send(("api_done", c.host))
            while not (self.failed.is_set() or conn.poll(0.05)):
                pass
            self.halt(host_threads)
            self.journal.write(k="end", t=time.monotonic(), empty_claims=self.empty_claims)
            conn.send(("bye", c.host, self.errors))
        finally:
            dcache.close_db()
            self.journal.close()

    def halt(self, threads: list[threading.Thread]) -> None:
        """Stop the host's threads, those still waiting for the start included, and wait for them."""
        self.stop.set()
        self.go.set()
        for thread in threads:
            thread.join()

    def thread(self, fn: Callable[..., None], *args: Any, name: str) -> threading.Thread:
        def body() -> None:
            try:
                dcache.batch_nbytes()  # opens this thread's connection
                self.warmed.wait()
                self.go.wait()
                fn(*args)
            except threading.BrokenBarrierError:  # another thread of the host failed before the start
                return
            except BaseException:
                text = traceback.format_exc()
                self.errors.append(text)
                self.journal.write(k="error", what=text)
                self.failed.set()
                self.stop.set()
                self.warmed.abort()

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        return thread

    # -- the API side ------------------------------------------------------------------------------------

    def api(self, specs: list[JobSpec], seed: int) -> None:
        outstanding: collections.deque[str] = collections.deque()
        for spec in specs:
            while len(outstanding) >= IN_FLIGHT and not self.stop.is_set():
                self.poll(outstanding)
            if self.stop.is_set():
                return
            answered, created = self.submit(spec)
            self.journal.write(k="sub", n=spec.number, id=answered, new=created, t=time.monotonic())
            if created:
                outstanding.append(answered)
        while outstanding and not self.stop.is_set():
            self.poll(outstanding)

    def submit(self, spec: JobSpec) -> tuple[str, bool]:
        now = unix_now()
        job, targets = submission(spec, job_id_of(self.config.prefix, spec.number), now)
        return dcache.submit_batch_job(job, targets, self.config.settings.ttl, now=now)

    def poll(self, outstanding: collections.deque[str]) -> None:
        """Read the oldest unfinished job; once finished (or evicted) it is the client's no more."""
        job_id = outstanding[0]
        job = dcache.batch_job(job_id)
        if job is None or job.status not in LIVE:
            outstanding.popleft()
            if job is not None:
                dcache.batch_targets(job_id)  # the client fetches its results
            return
        outstanding.rotate(-1)
        time.sleep(POLL_S)

    # -- the runner side ---------------------------------------------------------------------------------

    def runner(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            started = time.perf_counter()
            claimed = dcache.claim_batch_targets(CLAIM_LIMIT, per_job=PER_JOB)
            latency = time.perf_counter() - started
            if not claimed:
                with self.numbers_lock:
                    self.empty_claims += 1
                time.sleep(IDLE_S)
                continue
            with self.numbers_lock:
                number = next(self.claim_numbers)
            got = [[target.job_id, target.idx] for target in claimed]
            self.journal.write(k="claim", c=number, t=time.monotonic(), lat=round(latency, 6), got=got)
            held = collections.Counter(target.job_id for target in claimed)
            for target in claimed:
                self.fetch(rng, held)
                self.write_target(rng, target, number)
                held[target.job_id] -= 1
            if evicted := dcache.evict_batch_oldest(self.config.settings.budget):
                self.journal.write(k="evict", n=evicted)

    def fetch(self, rng: random.Random, held: collections.Counter[str]) -> None:
        """A fetch waits on the network from half to one and a half times ``fetch_s`` (none at 0); a slow one
        waits longer besides, and renews the lease of each job the runner holds targets of."""
        if self.config.fetch_s:
            time.sleep(rng.uniform(0.5, 1.5) * self.config.fetch_s)
        if rng.random() >= 1 / SLOW_EVERY:
            return
        for _ in range(SLOW_TOUCHES):
            time.sleep(TOUCH_EVERY_S)
            for job_id, count in held.items():
                if count > 0:
                    try:
                        dcache.touch_batch_job(job_id)
                    except JobNotFound:
                        self.journal.write(k="lost", job=job_id, why="deleted while this host held a claim")

    def write_target(self, rng: random.Random, target: BatchTarget, number: int) -> None:
        job_id, idx, host = target.job_id, target.idx, self.config.host
        try:
            if rng.random() < FAIL_P:
                error, hint = rng.choice(ERRORS)
                text = f"{error} (host {host}, claim {number})"
                dcache.update_batch_target(job_id, idx, TargetStatus.FAILED, error=text, hint=hint)
                ok, size = False, 0
            else:
                result = envelope(rng, self.text, target.url, host=host, claim=number)
                dcache.update_batch_target(job_id, idx, TargetStatus.DONE, result=result)
                ok, size = True, len(result.encode("utf-8"))
        except (JobNotFound, TargetNotFound):
            self.journal.write(k="lost", job=job_id, why="deleted while this host held a claim")
            return
        self.journal.write(k="done", job=job_id, idx=idx, ok=ok, size=size, t=time.monotonic())
        self.finish(job_id)

    def finish(self, job_id: str) -> None:
        """After a write: the job's final status once every target is written (by whichever runner sees
        it first; another seeing it too writes the same status)."""
        job = dcache.batch_job(job_id)
        if job is None:  # finished by another runner and evicted since: nothing left to do
            return
        if job.status == JobStatus.FAILED and job.error == RESCUE_REASON:
            self.journal.write(k="lost", job=job_id, why="rescued while this host held a claim")
            return
        if job.status != JobStatus.RUNNING or job.targets_done < job.targets_total:
            return
        targets = dcache.batch_targets(job_id) or []
        failed = sum(1 for target in targets if target.status == TargetStatus.FAILED)
        if failed == 0:
            status, error = JobStatus.DONE, ""
        elif failed == job.targets_total:
            status, error = JobStatus.FAILED, "every target failed"
        else:
            status, error = JobStatus.PARTIAL, f"{failed} of {job.targets_total} targets failed"
        try:
            dcache.set_batch_job_status(job_id, status, error)
        except JobNotFound:  # finished by another runner and evicted meanwhile
            return
        self.journal.write(k="finish", job=job_id, status=status.value)

    def rescuer(self) -> None:
        while not self.stop.wait(RESCUE_EVERY_S):
            if rescued := dcache.rescue_stale_jobs(self.config.stale_after, RESCUE_REASON):
                self.journal.write(k="rescue", n=rescued)


def job_id_of(prefix: str, number: int) -> str:
    return f"{prefix}-{number:05d}"


# -- the coordinator ---------------------------------------------------------------------------------------


def assign(specs: list[JobSpec], hosts: int) -> list[list[JobSpec]]:
    """Each submission's host: an original goes to host ``number % hosts``, a repeat to the host after its
    original's (a retry that the load balancer sent elsewhere)."""
    shares: list[list[JobSpec]] = [[] for _ in range(hosts)]
    first: dict[tuple[str, str], int] = {}
    for spec in specs:
        key = (spec.caller, spec.idem_key)
        if spec.repeat and key in first:
            shares[(first[key] + 1) % hosts].append(spec)
        else:
            host = spec.number % hosts
            if spec.idem_key:
                first.setdefault(key, host)
            shares[host].append(spec)
    return shares


@dataclass
class Kill:
    host: int
    after_targets: int  # written by all hosts when it was killed
    held_targets: int  # claimed and not yet written, per its journal when it was killed
    at_s: float


@dataclass
class HostsRun:
    """What the coordinator saw: each host's journal, how the hosts ended, the kill, and the run's time."""

    hosts: int
    specs: list[JobSpec]
    prefix: str
    journals: dict[int, list[dict[str, Any]]]
    exit_codes: dict[int, int | None]
    errors: dict[int, list[str]]
    kill: Kill | None
    seconds: float
    stalled: bool = False
    alive_s: dict[int, float] = field(default_factory=dict)
    #: The share of the machine's cores busy during the run (every process's, a local server's too), or None
    #: when it cannot be told (no /proc/stat, or no tick went by).
    cores_busy_pct: float | None = None


class _Coordinated:
    def __init__(self, index: int, process: BaseProcess, conn: Any, journal: str) -> None:
        self.index = index
        self.process = process
        self.conn = conn
        self.reader = JournalReader(journal)
        self.api_done = False
        self.bye = False
        self.errors: list[str] = []
        self.held: set[tuple[str, int]] = set()
        self.written = 0

    def read(self) -> int:
        fresh = self.reader.new()
        for record in fresh:
            if record["k"] == "claim":
                self.held.update((job, idx) for job, idx in record["got"])
            elif record["k"] == "done":
                self.held.discard((record["job"], record["idx"]))
                self.written += 1
        return len(fresh)


def run_hosts(
    settings: Settings,
    target: str,
    hosts: int,
    stale_after: int,
    kill: bool,
    journal_dir: Path,
    fetch_s: float = 0.0,
) -> HostsRun:
    """Start the hosts on the store at ``target`` (already open in this process), kill the last one part-way
    (with ``kill`` and more than one host), and return once the survivors stopped. A fetch waits ``fetch_s``
    seconds on average."""
    prefix = f"sim-{os.urandom(3).hex()}"
    specs = [
        replace(spec, idem_key=f"{prefix}-{spec.idem_key}" if spec.idem_key else "")
        for spec in plan(settings)
    ]
    context = multiprocessing.get_context("spawn")
    hosted: list[_Coordinated] = []
    child_ends: list[multiprocessing.connection.Connection] = []
    for index, share in enumerate(assign(specs, hosts)):
        journal = str(journal_dir / f"host-{index}.jsonl")
        config = HostConfig(target, journal, index, prefix, settings, stale_after, tuple(share), fetch_s)
        parent, child = context.Pipe()
        process = context.Process(
            target=host_main, args=(config, child), name=f"sift-host-{index}", daemon=True
        )
        hosted.append(_Coordinated(index, process, parent, journal))
        child_ends.append(child)
    victim = hosted[-1] if kill and hosts > 1 else None
    killed: Kill | None = None
    stalled = False
    try:
        for host in hosted:
            host.process.start()
        for end in child_ends:  # the hosts have theirs: a host that dies is then seen at once (EOF)
            end.close()
        for host in hosted:
            _wait_ready(host)
        started, cores_at_start = time.monotonic(), cores_time()
        for host in hosted:
            host.conn.send("go")
        kill_at = max(1, int(sum(spec.targets for spec in specs if not spec.repeat) * KILL_AFTER))
        last_progress = last_live_check = started
        threshold_reached: float | None = None
        while True:
            ready = multiprocessing.connection.wait(
                [h.conn for h in hosted if not h.bye and h is not victim], 0.01
            )
            now = time.monotonic()
            for host in hosted:
                if host.conn in ready:
                    _receive(host)
                if host.read():
                    last_progress = now
            survivors = [h for h in hosted if h is not victim]
            if any(h.errors or not h.process.is_alive() for h in hosted if h is not victim or killed is None):
                break  # a host failed (the victim too, before it was killed): the check reports it
            if victim is not None and killed is None:
                written = sum(h.written for h in hosted)
                if written >= kill_at and threshold_reached is None:
                    threshold_reached = now
                # Late: the victim held nothing for 2 s past the mark, or the survivors are done already.
                late = (threshold_reached is not None and now - threshold_reached > 2.0) or all(
                    h.api_done for h in survivors
                )
                due = late or (threshold_reached is not None and bool(victim.held))
                if due and _kill_holding(victim, must_hold=not late):
                    killed = Kill(victim.index, written, len(victim.held), round(now - started, 3))
            elif all(h.api_done for h in survivors) and now - last_live_check > 0.05:
                last_live_check = now
                if dcache.live_batch_jobs_total() == 0:
                    break
            if now - last_progress > STALL_S + stale_after:  # survivors record nothing while they wait
                stalled = True
                break
        seconds = time.monotonic() - started
        cores_busy = busy_pct(cores_at_start, cores_time())
    finally:
        for host in hosted:
            if host.process.is_alive():
                with contextlib.suppress(OSError):
                    host.conn.send("stop")
        for host in hosted:
            deadline = time.monotonic() + 60
            while not host.bye and host.process.is_alive() and time.monotonic() < deadline:
                if host.conn.poll(0.05):
                    _receive(host)
            host.process.join(max(0.0, deadline - time.monotonic()))
            if host.process.is_alive():
                host.process.kill()
                host.process.join()
    journals = {h.index: read_journal(h.reader.path) for h in hosted}
    return HostsRun(
        hosts=hosts,
        specs=specs,
        prefix=prefix,
        journals=journals,
        exit_codes={h.index: h.process.exitcode for h in hosted},
        errors={h.index: h.errors for h in hosted},
        kill=killed,
        seconds=seconds,
        stalled=stalled,
        alive_s={h.index: _alive(journals[h.index]) for h in hosted},
        cores_busy_pct=cores_busy,
    )


#: The kernel's count of CPU time since boot, per state, summed over the cores (Linux).
PROC_STAT = "/proc/stat"


def cores_time() -> tuple[int, int] | None:
    """(all, idle) CPU time so far, in clock ticks summed over the cores; idle counts waiting on I/O too.
    None where PROC_STAT cannot be read."""
    try:
        with open(PROC_STAT) as f:
            ticks = [int(n) for n in f.readline().split()[1:9]]  # user … steal; guest time is in user
    except (OSError, ValueError):
        return None
    if len(ticks) < 5:
        return None
    return sum(ticks), ticks[3] + ticks[4]


def busy_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the cores' time between two :func:`cores_time` readings that was not idle, in %."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    elapsed, idle = after[0] - before[0], after[1] - before[1]
    busy = 100 * (elapsed - idle) / elapsed
    return round(min(100.0, max(0.0, busy)), 1)  # clamped: the kernel's iowait count may step back


def _kill_holding(victim: _Coordinated, *, must_hold: bool) -> bool:
    """SIGKILL the victim if (or, without ``must_hold``, even if not) it holds claimed targets it has not
    written. It is frozen first (SIGSTOP), so its journal can be read as it stands at its death; if it holds
    nothing, it runs on (SIGCONT) and False is returned."""
    pid = victim.process.pid or 0
    os.kill(pid, signal.SIGSTOP)
    while _state(pid) not in ("T", "Z", "X", ""):  # until it is stopped (read, not waited for: not reaped)
        time.sleep(0.001)
    victim.read()
    if must_hold and not victim.held:
        os.kill(pid, signal.SIGCONT)
        return False
    os.kill(pid, signal.SIGKILL)
    victim.process.join()
    victim.read()
    return True


def _state(pid: int) -> str:
    """The process's state letter from /proc (``T`` stopped, ``Z`` a zombie), or "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def _wait_ready(host: _Coordinated) -> None:
    """Wait for the host's "ready"; raise CommandError with its first error if it failed or died instead."""
    message: Any
    try:
        message = host.conn.recv() if host.conn.poll(120) else None
    except (EOFError, OSError):  # it died
        message = None
    if message is not None and message[0] == "ready":
        return
    if message is not None and message[0] == "failed" and message[2]:
        why = message[2][0].strip().splitlines()[-1]
    else:
        host.process.join(5)
        why = f"exit status {host.process.exitcode}"
    raise CommandError(f"host {host.index} did not start: {why}")


def _receive(host: _Coordinated) -> None:
    try:
        message = host.conn.recv()
    except EOFError:
        host.bye = True
        return
    if message[0] == "api_done":
        host.api_done = True
    elif message[0] == "bye":
        host.bye = True
        host.errors += message[2]


def _alive(records: list[dict[str, Any]]) -> float:
    """How long a host worked: from its start to its end, or to its last record if it was killed."""
    times = [r["t"] for r in records if "t" in r]
    return max(times) - min(times) if len(times) > 1 else 0.0


# -- the check ---------------------------------------------------------------------------------------------


@dataclass
class _Seen:
    """The journals, indexed."""

    claims: dict[tuple[str, int], list[tuple[int, int]]] = field(default_factory=dict)  # -> (host, claim)
    writes: dict[tuple[str, int], list[tuple[int, float]]] = field(default_factory=dict)  # -> (host, t)
    submissions: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    lost: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)  # jobs some host set a final status of

    @classmethod
    def of(cls, journals: dict[int, list[dict[str, Any]]]) -> _Seen:
        seen = cls()
        for host, records in journals.items():
            for r in records:
                if r["k"] == "claim":
                    for job, idx in r["got"]:
                        seen.claims.setdefault((job, idx), []).append((host, r["c"]))
                elif r["k"] == "done":
                    seen.writes.setdefault((r["job"], r["idx"]), []).append((host, r["t"]))
                elif r["k"] == "sub":
                    seen.submissions.append((host, r))
                elif r["k"] == "lost":
                    seen.lost.append((host, r))
                elif r["k"] == "finish":
                    seen.finished.add(r["job"])
        return seen


def check_run(run: HostsRun, budget: int) -> list[Check]:
    """The end check, from the store and the journals alone (the store must be open)."""
    seen = _Seen.of(run.journals)
    killed = run.kill.host if run.kill else None
    J, T = BatchJob, BatchTarget
    mine = f"{run.prefix}-"
    target_rows: Any = T.select(T.job_id, T.idx, T.status, T.result, T.error).where(T.job_id.startswith(mine))
    job_rows: Any = J.select(J.id, J.caller, J.idem_key, J.status, J.error).where(J.id.startswith(mine))
    targets: list[tuple[Any, ...]] = list(target_rows.tuples())
    jobs: list[tuple[Any, ...]] = list(job_rows.tuples())
    checks = [_claimed_once(seen), _claimed_by_writer(seen, targets, killed)]
    checks += check_invariants(budget)
    report = dcache.check_store()
    checks.append(
        Check(
            "check_store() finds no violation",
            not report.violations,
            f"{len(report.violations)} violations"
            + (f", first: {report.violations[0]}" if report.violations else ""),
        )
    )
    checks.append(_rescues_were_right(seen, targets, jobs, killed))
    checks.append(_idempotent(run, seen, jobs))
    bad = {h: code for h, code in run.exit_codes.items() if h != killed and (code != 0 or run.errors[h])}
    checks.append(
        Check(
            "every surviving host ran without error and stopped",
            not bad and not run.stalled,
            (f"the run stalled: no host recorded anything for {STALL_S:.0f} s; " if run.stalled else "")
            + (
                ", ".join(f"host {h}: exit {code}, {len(run.errors[h])} errors" for h, code in bad.items())
                or plural(run.hosts - (killed is not None), "host")
            ),
        )
    )
    return checks


def _claimed_once(seen: _Seen) -> Check:
    twice = sorted(key for key, claims in seen.claims.items() if len(claims) > 1)
    total = sum(len(c) for c in seen.claims.values())
    detail = f"{total:,} claimed targets, {len(twice)} claimed more than once"
    if twice:
        detail += (
            f", e.g. {twice[0][0]} target {twice[0][1]} by hosts {[h for h, _ in seen.claims[twice[0]]]}"
        )
    return Check("every target claimed at most once", not twice, detail)


def _claimed_by_writer(seen: _Seen, targets: list[tuple[Any, ...]], killed: int | None) -> Check:
    """A target out of pending was claimed; a written one was written once, by its claimer (its journal, and
    the host and claim number in the stored result or error, say so); a claimed one is out of pending."""
    problems: list[str] = []
    stored = {(job, idx): status for job, idx, status, _, _ in targets}
    for job, idx, status, result, error in targets:
        key = (job, idx)
        claims = seen.claims.get(key, [])
        writers = [host for host, _ in seen.writes.get(key, [])]
        if status == TargetStatus.PENDING:
            continue
        if not claims:
            if killed is None or status != TargetStatus.RUNNING:  # else the killed host's last claim
                problems.append(f"{job} target {idx} is {status} but no host claimed it")
            continue
        host, number = claims[0]
        if status == TargetStatus.RUNNING:
            continue
        written_by = _writer_named(result, error)
        if written_by != (host, number):
            problems.append(
                f"{job} target {idx} was claimed by host {host} (claim {number}), written by {written_by}"
            )
        if writers != [host] and not (host == killed and writers == []):
            problems.append(
                f"{job} target {idx} was claimed by host {host}, journaled as written by {writers}"
            )
    for key in seen.claims:
        if stored.get(key) == TargetStatus.PENDING:
            problems.append(f"{key[0]} target {key[1]} was claimed but is pending")
    detail = (
        f"{len(targets):,} targets" if not problems else f"{len(problems)} problems, first: {problems[0]}"
    )
    return Check(
        "every target out of pending was claimed, and written once by its claimer", not problems, detail
    )


def _writer_named(result: str | None, error: str | None) -> tuple[int, int] | None:
    if result is not None:
        try:
            page = json.loads(result)
            return int(page["host"]), int(page["claim"])
        except (ValueError, KeyError, TypeError):
            return None
    if error and error.endswith(")") and "(host " in error:
        host, _, claim = error.rpartition("(host ")[2][:-1].partition(", claim ")
        with contextlib.suppress(ValueError):
            return int(host), int(claim)
    return None


def _rescues_were_right(
    seen: _Seen, targets: list[tuple[Any, ...]], jobs: list[tuple[Any, ...]], killed: int | None
) -> Check:
    """A live host never lost a job it was working on, and the killed host owed something on each rescued
    job: a target it claimed (or a claim no journal names) and never wrote, or the job's last write, after
    which it died before it could set the job's final status."""
    owed = _owed_by(killed, seen, targets) if killed is not None else set()
    rescued = [
        job for job, _, _, status, error in jobs if status == JobStatus.FAILED and error == RESCUE_REASON
    ]
    wrong = [job for job in rescued if job not in owed]
    lost = [(host, r) for host, r in seen.lost if host != killed]
    ok = not wrong and not lost
    if ok:
        detail = (
            f"{len(rescued)} rescued jobs in the store, each owed by the killed host; 0 lost by live hosts"
        )
    else:
        detail = f"{len(wrong)} rescued jobs the killed host owed nothing" + (
            f" (e.g. {wrong[0]})" if wrong else ""
        )
        detail += f"; {len(lost)} jobs lost by live hosts" + (
            f" (e.g. host {lost[0][0]}: {lost[0][1]['job']} {lost[0][1]['why']})" if lost else ""
        )
    return Check("no job of a live host failed by the rescue", ok, detail)


def _owed_by(killed: int, seen: _Seen, targets: list[tuple[Any, ...]]) -> set[str]:
    """The jobs the killed host left unfinished: it held a target of the job still running, or it wrote
    the job's last target (by its journal, or a write of a target it claimed that its journal lacks)."""
    owed: set[str] = set()
    unfinished: set[str] = set()
    last: dict[str, tuple[float, int]] = {}  # job -> (time, host) of its latest journaled write
    for job, idx, status, _, _ in targets:
        claims = seen.claims.get((job, idx), [])
        claimer = claims[0][0] if claims else killed  # a claim no journal names is the killed host's
        if status == TargetStatus.RUNNING and claimer == killed:
            owed.add(job)
        elif (
            status in (TargetStatus.DONE, TargetStatus.FAILED)
            and claimer == killed
            and not seen.writes.get((job, idx))
        ):
            owed.add(job)  # written, then killed before the record
        if status not in (TargetStatus.DONE, TargetStatus.FAILED):
            unfinished.add(job)
        for host, at in seen.writes.get((job, idx), []):
            if at > last.get(job, (-1.0, 0))[0]:
                last[job] = (at, host)
    owed.update(
        job
        for job, (_, host) in last.items()
        if host == killed and job not in unfinished and job not in seen.finished
    )
    return owed


def _idempotent(run: HostsRun, seen: _Seen, jobs: list[tuple[Any, ...]]) -> Check:
    """Each answer from the store names a job submitted with the same caller and key; and the store never
    holds two jobs of one (caller, key) that the key would find (queued, running, done or partial)."""
    ids: dict[tuple[str, str], set[str]] = {}
    spec_of = {spec.number: spec for spec in run.specs}
    for spec in run.specs:
        if spec.idem_key:
            ids.setdefault((spec.caller, spec.idem_key), set()).add(job_id_of(run.prefix, spec.number))
    problems: list[str] = []
    hits = 0
    for _, record in seen.submissions:
        spec = spec_of[record["n"]]
        own = job_id_of(run.prefix, spec.number)
        if record["new"]:
            if record["id"] != own:
                problems.append(f"submission {spec.number} created {record['id']}, not {own}")
            continue
        hits += 1
        if record["id"] == own or record["id"] not in ids.get((spec.caller, spec.idem_key), set()):
            problems.append(f"submission {spec.number} was answered with {record['id']}")
    findable: collections.Counter[tuple[str, str]] = collections.Counter(
        (caller, key) for _, caller, key, status, _ in jobs if key and status in IDEM_STATUSES
    )
    problems += [f"{n} findable jobs of {key}" for key, n in findable.items() if n > 1]
    detail = (
        f"{hits} answered from the store" if not problems else f"{len(problems)} wrong, first: {problems[0]}"
    )
    return Check("every idempotent repeat answered with the same id", not problems, detail)


# -- the command -------------------------------------------------------------------------------------------


def cmd_simulate_hosts(args: argparse.Namespace) -> int:
    if getattr(args, "sim_target", args.db) == ":memory:":
        raise CommandError("--hosts: several processes cannot share an in-memory store; name a file")
    settings = settings_of(args)
    journal_dir = Path(tempfile.mkdtemp(prefix="sift-simulate-journals-"))
    target = getattr(args, "sim_target", args.db)  # args.db may be shown without its password
    fetch_s = args.fetch_ms / 1000
    run = run_hosts(settings, target, args.hosts, args.stale_after, not args.no_kill, journal_dir, fetch_s)
    checks = check_run(run, settings.budget)
    summary = _summary(run, checks, args, settings, journal_dir)
    if args.json:
        emit_json(summary)
    else:
        print("\n".join(_human(summary)))
    return 0 if summary["ok"] else 1


def _percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _rates(records: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    latencies = [r["lat"] for r in records if r["k"] == "claim"]
    written = sum(1 for r in records if r["k"] == "done")
    claimed = sum(len(r["got"]) for r in records if r["k"] == "claim")

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 2)

    return {
        "seconds": round(seconds, 3),
        "targets_written": written,
        "targets_per_s": round(written / seconds, 1) if seconds > 0 else None,
        "claims": len(latencies),
        "targets_claimed": claimed,
        "claims_per_s": round(len(latencies) / seconds, 1) if seconds > 0 else None,
        "empty_claims": sum(r.get("empty_claims", 0) for r in records if r["k"] == "end"),
        "rescued": sum(r["n"] for r in records if r["k"] == "rescue"),
        "evicted": sum(r["n"] for r in records if r["k"] == "evict"),
        "submissions": sum(1 for r in records if r["k"] == "sub"),
        "claim_p50_ms": ms(_percentile(latencies, 0.50)),
        "claim_p99_ms": ms(_percentile(latencies, 0.99)),
    }


def longest_wait(journals: dict[int, list[dict[str, Any]]]) -> float | None:
    """The longest a created job waited from its submission to its first claim (seconds): what
    ``stale_after`` must exceed, since rescue_stale_jobs fails a queued job as readily as a running one."""
    created: dict[str, float] = {}
    first_claim: dict[str, float] = {}
    for records in journals.values():
        for r in records:
            if r["k"] == "sub" and r["new"]:
                created[r["id"]] = r["t"]
            elif r["k"] == "claim":
                for job, _ in r["got"]:
                    first_claim[job] = min(first_claim.get(job, r["t"]), r["t"])
    waits = [first_claim[job] - t for job, t in created.items() if job in first_claim]
    return round(max(waits), 3) if waits else None


def _summary(
    run: HostsRun, checks: list[Check], args: argparse.Namespace, settings: Settings, journal_dir: Path
) -> dict[str, Any]:
    per_host = []
    for host, records in run.journals.items():
        state = (
            "killed"
            if run.kill and run.kill.host == host
            else "finished"
            if run.exit_codes[host] == 0
            else "failed"
        )
        per_host.append(
            {"host": host, "state": state, "exit": run.exit_codes[host], **_rates(records, run.alive_s[host])}
        )
    everything = [r for records in run.journals.values() for r in records]
    subs = [r for r in everything if r["k"] == "sub"]
    jobs = {status: 0 for status in (s.value for s in JobStatus)}
    statuses: Any = BatchJob.select(BatchJob.status).tuples()
    for (status,) in statuses:
        jobs[status] = jobs.get(status, 0) + 1
    return {
        "db": shown_store(args.db),
        "schema_made": getattr(args, "sim_schema", None),
        "journals": str(journal_dir),
        "settings": asdict(settings),
        "hosts": run.hosts,
        "stale_after": args.stale_after,
        "fetch_ms": args.fetch_ms,
        "kill": None if run.kill is None else asdict(run.kill),
        "seconds": round(run.seconds, 3),
        "cores_busy_pct": run.cores_busy_pct,
        "per_host": per_host,
        "total": _rates(everything, run.seconds),
        "submissions": {
            "planned": len(run.specs),
            "sent": len(subs),
            "jobs_created": sum(1 for r in subs if r["new"]),
            "idem_hits": sum(1 for r in subs if not r["new"]),
        },
        "longest_wait_s": longest_wait(run.journals),
        "bytes_stored": dcache.batch_nbytes(),
        "budget": settings.budget,
        "jobs": jobs,
        "invariants": [asdict(check) for check in checks],
        "ok": all(check.ok for check in checks),
    }


def _cores_busy_text(pct: float | None) -> str:
    if pct is None:
        return f"unknown ({PROC_STAT} unreadable, or the run too short to measure)"
    cores = os.cpu_count() or "its"
    return f"{pct:g}% of this machine's {cores} cores during the run (all processes, a local server too)"


def _human(summary: dict[str, Any]) -> Iterator[str]:
    s, kill, subs = summary["settings"], summary["kill"], summary["submissions"]
    yield (
        f"Simulated {format_count(subs['sent'])} of {format_count(subs['planned'])} submissions on "
        f"{plural(summary['hosts'], 'host')} ({API_THREADS} API threads, {s['workers']} runner threads and a "
        f"rescuer each; fetches of {summary['fetch_ms']} ms on average) in {summary['seconds']:.1f} s "
        f"(seed {s['seed']})"
    )
    yield ""
    if kill is None:
        killed = "none (--no-kill, or a single host)"
    else:
        killed = (
            f"host {kill['host']} SIGKILLed at {kill['at_s']:.1f} s, after "
            f"{format_count(kill['after_targets'])} targets written, holding "
            f"{plural(kill['held_targets'], 'claimed target')} not written yet"
        )
    total = summary["total"]
    yield from key_values(
        [
            ("store", summary["db"] + kept_schema_note(summary["schema_made"])),
            ("journals", summary["journals"]),
            ("killed", killed),
            (
                "rescued",
                f"{plural(total['rescued'], 'job')} by rescue_stale_jobs (stale after "
                f"{summary['stale_after']} s)",
            ),
            (
                "submissions",
                f"{format_count(subs['jobs_created'])} jobs created, "
                f"{format_count(subs['idem_hits'])} answered from the store",
            ),
            ("longest wait", f"{summary['longest_wait_s']} s from a submission to its job's first claim"),
            ("eviction", f"{plural(total['evicted'], 'job')} evicted"),
            (
                "bytes stored",
                f"{format_size(summary['bytes_stored'])} of {format_size(summary['budget'])} budget",
            ),
            ("cores busy", _cores_busy_text(summary["cores_busy_pct"])),
        ],
        indent="  ",
    )
    yield ""
    rows = []
    for row in [*summary["per_host"], {"host": "total", "state": "", **total}]:
        rows.append(
            {
                "host": str(row["host"]),
                "state": row["state"],
                "seconds": f"{row['seconds']:.1f}",
                "targets": format_count(row["targets_written"]),
                "targets/s": f"{row['targets_per_s'] or 0:,.1f}",
                "claims": format_count(row["claims"]),
                "claims/s": f"{row['claims_per_s'] or 0:,.1f}",
                "rescued": format_count(row["rescued"]),
                "p50": "-" if row["claim_p50_ms"] is None else f"{row['claim_p50_ms']:.1f} ms",
                "p99": "-" if row["claim_p99_ms"] is None else f"{row['claim_p99_ms']:.1f} ms",
            }
        )
    columns = [
        Column("host", "host"),
        Column("state", "state"),
        Column("seconds", "seconds", right=True),
        Column("targets", "targets", right=True),
        Column("targets/s", "targets/s", right=True),
        Column("claims", "claims", right=True),
        Column("claims/s", "claims/s", right=True),
        Column("rescued", "rescued", right=True),
        Column("claim p50", "p50", right=True),
        Column("claim p99", "p99", right=True),
    ]
    yield from table(rows, columns, indent="  ")
    yield from summary_footer(summary)
