"""``sift simulate --hosts N``: N real processes, each a host of the service, share one store.

Each host process opens the store itself (one SQLite file for all, or one PostgreSQL schema) and runs:

- API threads: they send the host's share of the planned submissions through ``submit_batch_job``. A repeat
  of an idempotency key goes to another host than its original, as a client's retry through a load
  balancer may. Each thread keeps at most ``IN_FLIGHT`` of its jobs unfinished, polling them with
  ``batch_job`` (and ``batch_targets`` once one finished) before it submits more.
- runner threads (``--workers``): ``claim_batch_targets(CLAIM_LIMIT, per_job=PER_JOB, runner=...)`` (each
  thread its own runner name), then for each target a fetch (it waits ``--fetch-ms`` on average, as a real
  fetch waits on the network with the GIL released; one in ``SLOW_EVERY`` is slow besides, and touches the
  lease of every job the runner holds a claim of while it waits), then each job's arrived results in one
  ``update_batch_targets(job_id, results, runner=...)`` (a lost claim's write is dropped), then
  ``set_batch_job_status`` once the job's ``targets_done`` reaches ``targets_total``, and
  ``evict_batch_oldest(budget)`` after each claim.
- a keeper thread, every ``RENEW_EVERY_S`` whether or not there is work: ``renew_claims`` of each of the
  host's runners, ``requeue_stale_claims(stale_after, max_attempts=MAX_ATTEMPTS)``, and the final status of
  a job whose every target is written (its last writer may have died before it set it).

The store's functions run on the real clock, so ``stale_after`` is real seconds. Part-way through (a third
of the planned targets written, and the victim holding claimed targets it has not written yet) the coordinator
SIGKILLs the last host; on PostgreSQL it then waits for the server to end the host's connections (each
named for the host in ``pg_stat_activity``) before it counts what the host held, since a write the host
sent just before it was frozen still lands. The others requeue its claims once their heartbeats are
``stale_after`` old, claim and finish them, and claim the jobs it had submitted but nobody had started.
The run ends when every survivor has sent its submissions and seen them finish, and no job is queued or
running.

What each host did is in its journal: a file of JSON lines that it alone appends to, with every claim (the
targets, as soon as ``claim_batch_targets`` returned, and how long the call took), every target written,
every submission's answer and every requeue. Each record is one ``write(2)`` to a file opened ``O_APPEND``,
with no buffer in the process: once the call has returned, the record is in the kernel's page cache, which
a SIGKILL of the process does not lose. An fsync would add a guard against a crash of the whole machine,
which the simulation does not model. A claim commits in the store before its record is written, so the
killed host's journal may lack its very last claims and writes: the check allows exactly that (a target of
the killed host left running, or written, that its journal does not name) and nothing else.

At the end :func:`sift.cli.simulation.hosts_verdicts.check_run` checks the store against the journals.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
import urllib.parse
from dataclasses import dataclass, field, replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from sift import dcache
from sift.dcache import BatchTarget, TargetStatus

from ..store import CommandError, is_postgres
from .cores import busy_pct, cores_time
from .fairness import running_urls
from .host import HostConfig, host_main, runner_names
from .journal import JournalReader, read_journal
from .workload import NO_OPTIONS, ClaimOptions, JobSpec, Settings, plan

__all__ = ["STALL_S", "HostsRun", "Kill", "assign", "host_target", "run_hosts"]


#: The coordinator gives up when no host records anything for this long, plus stale_after (and the check
#: then fails).
STALL_S = 30.0
#: Which part of the planned targets is written before the victim is killed.
KILL_AFTER = 1 / 3
#: How long the coordinator waits, after it killed a host, for the PostgreSQL server to end the host's
#: connections: each first runs what it was sent, which may wait out a lock (or the run fails).
CONNECTIONS_END_S = 60.0


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
    # Running under its runners in the store once nothing it sent could land: read while it was frozen on
    # SQLite, and on PostgreSQL once the server had ended its connections after the kill.
    held_targets: int
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
    #: Each host's peak of targets running at once, as the sampler read them from the store, and how many
    #: samples it took.
    host_peaks: dict[str, int] = field(default_factory=dict)
    samples: int = 0


class _Coordinated:
    def __init__(
        self, index: int, process: BaseProcess, conn: Any, journal: str, application_name: str | None
    ) -> None:
        self.index = index
        #: The ``application_name`` of the host's connections on PostgreSQL; None on SQLite.
        self.application_name = application_name
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
    claim: ClaimOptions | None = None,
) -> HostsRun:
    """Start the hosts on the store at ``target`` (already open in this process), kill the last one part-way
    (with ``kill`` and more than one host), and return once the survivors stopped. A fetch waits ``fetch_s``
    seconds on average; the runners claim with ``claim``'s options. Between its reads of the journals the
    coordinator samples the running targets from the store, for each host's peak."""
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
        application_name = f"{prefix}-host-{index}" if is_postgres(target) else None
        config = HostConfig(
            host_target(target, application_name),
            journal,
            index,
            prefix,
            settings,
            stale_after,
            tuple(share),
            fetch_s,
            claim or NO_OPTIONS,
        )
        parent, child = context.Pipe()
        process = context.Process(
            target=host_main, args=(config, child), name=f"sift-host-{index}", daemon=True
        )
        hosted.append(_Coordinated(index, process, parent, journal, application_name))
        child_ends.append(child)
    victim = hosted[-1] if kill and hosts > 1 else None
    runners = runner_names(prefix, hosts - 1, settings.workers)
    killed: Kill | None = None
    stalled = False
    peaks: dict[str, int] = {}
    samples = 0
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
            for url_host, n in running_urls().items():
                peaks[url_host] = max(peaks.get(url_host, 0), n)
            samples += 1
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
                if due and (held := _kill_holding(victim, runners, must_hold=not late)) is not None:
                    killed = Kill(victim.index, written, held, round(now - started, 3))
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
        host_peaks=peaks,
        samples=samples,
    )


def host_target(target: str, application_name: str | None) -> str:
    """What a host process opens: ``target``, its connections named ``application_name`` (in place of any
    the target names) when one is given, a PostgreSQL target's."""
    if application_name is None:
        return target
    parts = urllib.parse.urlsplit(target)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    named = [(key, value) for key, value in query if key != "application_name"]
    named.append(("application_name", application_name))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(named)))


def _kill_holding(victim: _Coordinated, runners: list[str], *, must_hold: bool) -> int | None:
    """SIGKILL the victim if (or, without ``must_hold``, even if not) the store shows it holding claimed
    targets while it is frozen (SIGSTOP); return how many it held at its death, or None when it held none
    and lives on. On PostgreSQL they are counted again once the server has ended its connections: a write it
    sent before the freeze may not have reached its rows yet, and lands."""
    pid = victim.process.pid or 0
    os.kill(pid, signal.SIGSTOP)
    while _state(pid) not in ("T", "Z", "X", ""):  # until it is stopped (read, not waited for: not reaped)
        time.sleep(0.001)
    held = _held_in_store(runners)
    if must_hold and not held:
        os.kill(pid, signal.SIGCONT)
        return None
    os.kill(pid, signal.SIGKILL)
    victim.process.join()
    victim.read()
    if victim.application_name is None:  # SQLite: a frozen process writes nothing, and its death rolls back
        return held
    _await_connections_ended(victim.index, victim.application_name)
    return _held_in_store(runners)


def _await_connections_ended(host: int, application_name: str) -> None:
    """Wait until the PostgreSQL server shows no connection named ``application_name`` (a killed host's): it
    ends each once it has run what it was sent. CommandError after :data:`CONNECTIONS_END_S`."""
    sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
    deadline = time.monotonic() + CONNECTIONS_END_S
    while dcache.db.execute_sql(sql, (application_name,)).fetchone()[0]:
        if time.monotonic() > deadline:
            raise CommandError(
                f"host {host}: the server still ran its connections {CONNECTIONS_END_S:g} s after its "
                "SIGKILL, so what it held could not be counted"
            )
        time.sleep(0.005)


def _held_in_store(runners: list[str]) -> int:
    """How many targets the store shows running under ``runners`` that no transaction is writing. Its
    journal cannot tell: a target written just before the freeze may not be journaled yet. On PostgreSQL a
    row a transaction locks is skipped: a frozen runner's COMMIT already sent still lands."""
    T = BatchTarget
    query = T.select(T.job_id).where(T.status == TargetStatus.RUNNING, T.runner.in_(runners))
    # One statement, outside a transaction: on SQLite a write transaction would wait on the frozen victim.
    return len(dcache.db.execute(dcache.db.backend.lock_rows(query, skip_locked=True)).fetchall())


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
