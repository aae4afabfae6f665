"""Target-result writes on PostgreSQL from one process and from several, and what their backends wait on."""

from __future__ import annotations

import statistics
import threading
import time

from ..fixtures import PgBuilder
from ..harness import Report
from ..sizes import T0, Sizes
from ..stores import PgServer
from .workers import Workers

#: One sample of what each writer's backend is doing: its state and what it waits on, if anything.
WAIT_SAMPLE = (
    "SELECT state, COALESCE(wait_event_type, ''), COALESCE(wait_event, '') FROM pg_stat_activity "
    "WHERE application_name = %s AND backend_type = 'client backend'"
)


class WaitSampler(threading.Thread):
    """Samples pg_stat_activity every ``interval`` seconds on a connection of its own, counting what the
    writers' backends are doing. A backend waiting for a row lock, a transaction to end (the holder of a
    row it wants) or an advisory lock shows wait_event_type 'Lock'."""

    def __init__(self, server: PgServer, schema: str, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.conn = server.connect(schema)
        self.app = schema
        self.interval = interval
        self.stop = threading.Event()
        self.samples = 0
        self.seen: dict[tuple[str, str, str], int] = {}
        self.max_lock_waiters = 0

    def run(self) -> None:
        while not self.stop.is_set():
            rows = self.conn.execute(WAIT_SAMPLE, (self.app,)).fetchall()
            self.samples += 1
            waiting = 0
            for state, kind, event in rows:
                key = (state or "", kind, event)
                self.seen[key] = self.seen.get(key, 0) + 1
                waiting += kind == "Lock"
            self.max_lock_waiters = max(self.max_lock_waiters, waiting)
            time.sleep(self.interval)
        self.conn.close()

    def shares(self) -> dict[str, float]:
        """Percent of the writers' sampled backend time in each kind of wait, in Lock waits by event."""
        total = sum(self.seen.values()) or 1
        out: dict[str, float] = {"samples": float(self.samples), "backend_samples": float(total)}

        sums: dict[str, int] = {}
        for (state, kind, event), count in self.seen.items():
            if kind == "Lock":
                names = ["lock_wait", f"lock_wait_{event}"]
            elif kind in ("IO", "LWLock"):
                names = ["io_or_lwlock_wait"]
            elif kind == "Client" or state.startswith("idle"):
                names = ["in_client"]  # the backend waits for the next statement: the client's time
            else:
                names = ["running" if state == "active" and not kind else f"other_{kind}"]
            for name in names:
                sums[name] = sums.get(name, 0) + count
        out["lock_wait_pct"] = 0.0
        for name, count in sorted(sums.items()):
            out[f"{name}_pct"] = 100 * count / total
        out["max_lock_waiters"] = float(self.max_lock_waiters)
        return out


def pg_writers(server: PgServer, sizes: Sizes, report: Report) -> None:
    """Target-result writes (update_batch_target to done with 1 KB) from 1 process and from
    ``writer_procs`` processes at once, each process writing the pending targets of a job of its own, as
    runners on several hosts do; rounds alternate which side goes first. Throughput is the writes of a
    round over the time from the common start to the last process's end. One more round of all processes,
    not timed, samples pg_stat_activity for the lock waits."""
    procs, ops, rounds = sizes.writer_procs, sizes.writer_ops, sizes.writer_rounds
    schema = server.new_schema("writers")
    warmup = sizes.warmup
    need = [warmup + ops * (rounds * (2 if w == 0 else 1) + 1) for w in range(procs)]
    b = PgBuilder(server, schema)
    b.jobs(
        "job-", sizes.flat_small, targets=sizes.targets_per_job, result_bytes=sizes.retained_result, lease0=T0
    )
    for w in range(procs):
        job_id, caller = f"writer-{w}", f"caller-{w}"
        b.one_job(job_id, caller=caller, status="running", targets=need[w], result_bytes=None, lease=T0)
    b.close()
    workers = Workers(server.target(schema), [("write", f"writer-{w}") for w in range(procs)], warmup)
    try:
        samples = workers.rounds(rounds, (1, procs), ops)
        sampler = WaitSampler(server, schema)
        sampler.start()
        workers.round(procs, ops)
        sampler.stop.set()
        sampler.join()
    finally:
        written = workers.close()
    check = server.connect(schema)
    counts = dict(check.execute("SELECT id, targets_done FROM batch_job WHERE id LIKE %s", ("writer-%",)))
    check.close()
    if [counts[f"writer-{w}"] for w in range(procs)] != written:
        raise AssertionError(f"writers: targets_done {counts} after {written} first writes")
    one = report.case("pg/target_writes", 1, samples[1], writes_per_s=1e6 / statistics.median(samples[1]))
    many = report.case(
        "pg/target_writes", procs, samples[procs], writes_per_s=1e6 / statistics.median(samples[procs])
    )
    many.extra.update(sampler.shares())
    ratio = report.pair(many, one)
    report.goal(
        f"PostgreSQL: target writes from {procs} processes, time per write / 1 process "
        f"({many.extra['writes_per_s'] / one.extra['writes_per_s']:.2f} x the throughput; "
        "0.5 x = 2 x the throughput)",
        ratio,
        0.5,
        "x",
    )
    report.goal(
        f"PostgreSQL: lock waits, {procs} processes writing: share of the writers' backend time "
        "waiting on a lock (pg_stat_activity sampled every 5 ms)",
        many.extra["lock_wait_pct"],
        None,
        "%",
    )
    server.drop(schema)
