"""Reliability across processes: 4 real processes x 300 writes on one WAL file through the package.

Each process (multiprocessing, 'spawn' context, its own ``open_db``) creates jobs it keeps, jobs a sweep
must remove, and jobs that finish with bytes for an eviction to take; it writes results, touches, changes
statuses, sweeps and evicts, all at once with the others. The totals are predictable: every swept or
evicted job is removed exactly once, and every kept job ends with exactly the counts its process wrote.
Each call is timed; the worst wait on the lock is reported (not asserted: no timed tests).

The companion tests show why the store uses ``BEGIN IMMEDIATE``: with a plain deferred ``BEGIN``, a
transaction that reads and then writes fails at once with "database is locked" when another process
holds the write lock, whatever the busy timeout; with ``BEGIN IMMEDIATE`` it waits and succeeds.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import pytest
from helpers import make_job, make_target, make_targets

from sift import dcache
from sift.dcache import db

PROCESSES = 4
WRITES_PER_PROCESS = 300
KEEP_TARGETS = 10
DOOMED_LEASE = 500  # below SWEEP_NOW: any sweep removes these jobs
SWEEP_NOW = 1_000  # sweep_batch(0, now=SWEEP_NOW) removes exactly the jobs with lease <= 1000
LIVE_NOW = 10_000  # every other lease is at least this
PIECES = ("é", "☃", "🎉", "a", "ß", "\u00a0")
RESULT_TIMEOUT_S = 120.0

#: Figures of the last run, for docs/explanation/guarantees.md (``pytest -s`` prints them too).
RECORD: dict[str, float] = {}

ctx = multiprocessing.get_context("spawn")


def _writer(path: str, p: int, seed: int, barrier: Barrier, results: Any) -> None:
    """One process: 300 writes through the package; reports what it expects and what it measured."""
    rng = random.Random(seed)
    out: dict[str, Any] = {
        "p": p,
        "errors": [],
        "locked": 0,
        "waits": [],
        "swept": 0,
        "evicted": 0,
        "doomed": 0,
        "evictable": 0,
        "kept": {},
        "writes": 0,
    }
    kept: dict[str, dict[int, str | None]] = {}  # job -> idx -> result of finished targets
    kept_done: dict[str, set[int]] = {}
    now = LIVE_NOW

    def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except (dcache.StoreUnavailable, sqlite3.OperationalError) as exc:
            out["locked"] += 1
            out["errors"].append(f"{fn.__name__}: {type(exc).__name__}: {exc}")
            return None
        except Exception as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                out["locked"] += 1
            out["errors"].append(f"{fn.__name__}: {type(exc).__name__}: {exc}")
            return None
        finally:
            out["waits"].append(time.perf_counter() - start)
            out["writes"] += 1

    try:
        dcache.open_db(path)
        barrier.wait()
        n = 0
        while out["writes"] < WRITES_PER_PROCESS:
            n += 1
            now += 1
            left = WRITES_PER_PROCESS - out["writes"]
            op = rng.choices(("keep", "doom", "evictable", "update", "touch", "status", "sweep", "evict"),
                             (4, 4, 3, 50, 8, 6, 4, 4))[0]  # fmt: skip
            if not kept or (op == "evictable" and left < 2 + 3):
                op = "keep"
            if op == "keep":
                job_id = f"p{p}-keep{n}-\u00e9"
                job = make_job(
                    job_id, status="running", targets_total=KEEP_TARGETS, created_at=now, lease=now
                )
                call(dcache.create_batch_job, job, make_targets(KEEP_TARGETS))
                kept[job_id], kept_done[job_id] = {}, set()
            elif op == "doom":
                job = make_job(f"p{p}-doom{n}", created_at=now, lease=DOOMED_LEASE, targets_total=5)
                call(dcache.create_batch_job, job, make_targets(5))
                out["doomed"] += 1
            elif op == "evictable":  # 2 + its targets writes: create, results, then finished
                count = rng.randint(1, min(3, left - 2))
                job_id = f"p{p}-ev{n}"
                job = make_job(job_id, status="running", targets_total=count, lease=now)
                call(dcache.create_batch_job, job, make_targets(count))
                for idx in range(count):
                    call(dcache.update_batch_target, job_id, idx, "done", result=_text(rng), now=now)
                call(dcache.set_batch_job_status, job_id, rng.choice(("done", "partial", "failed")), now=now)
                out["evictable"] += 1
            elif op == "update":
                job_id = rng.choice(sorted(kept))
                idx = rng.randrange(KEEP_TARGETS)
                result = _text(rng) if rng.random() < 0.9 else None
                call(
                    dcache.update_batch_target,
                    job_id,
                    idx,
                    rng.choice(("done", "failed")),
                    result=result,
                    now=now,
                )
                kept[job_id][idx] = result
                kept_done[job_id].add(idx)
            elif op == "touch":
                call(dcache.touch_batch_job, rng.choice(sorted(kept)), now=now)
            elif op == "status":
                call(
                    dcache.set_batch_job_status,
                    rng.choice(sorted(kept)),
                    rng.choice(("queued", "running")),
                    now=now,
                )
            elif op == "sweep":
                out["swept"] += call(dcache.sweep_batch, 0, now=SWEEP_NOW) or 0
            else:
                out["evicted"] += call(dcache.evict_batch_oldest, rng.randrange(0, 4_000)) or 0
        out["kept"] = {
            job_id: (len(kept_done[job_id]), sum(len(r.encode()) for r in results.values() if r is not None))
            for job_id, results in kept.items()
        }
    except BaseException as exc:
        out["errors"].append(f"process {p}: {type(exc).__name__}: {exc}")
    finally:
        dcache.close_db()
        results.put(out)


def _text(rng: random.Random) -> str:
    return "".join(rng.choices(PIECES, k=rng.randint(1, 60)))


def _run_processes(
    target: Callable[..., None], args: Callable[[int, Barrier, Any], tuple[Any, ...]]
) -> list[Any]:
    """Start PROCESSES spawned processes behind one barrier; return what each put on the queue."""
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=args(p, barrier, results)) for p in range(PROCESSES)]
    for proc in procs:
        proc.start()
    outs = []
    try:
        for _ in procs:
            outs.append(results.get(timeout=RESULT_TIMEOUT_S))
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES
    return outs


@pytest.mark.slow
def test_processes_share_one_file(file_store: Path, record_property: Callable[[str, object], None]) -> None:
    outs = _run_processes(
        _writer, lambda p, barrier, results: (str(file_store), p, 7_000 + p, barrier, results)
    )
    outs.sort(key=lambda out: out["p"])

    assert [out["errors"] for out in outs] == [[]] * PROCESSES
    assert sum(out["locked"] for out in outs) == 0
    assert [out["writes"] for out in outs] == [WRITES_PER_PROCESS] * PROCESSES

    # Whatever the processes left for the sweep or the eviction goes now; each job is removed exactly once.
    dcache.open_db(file_store)
    swept = dcache.sweep_batch(0, now=SWEEP_NOW)
    evicted = dcache.evict_batch_oldest(0)
    assert sum(out["swept"] for out in outs) + swept == sum(out["doomed"] for out in outs)
    assert sum(out["evicted"] for out in outs) + evicted == sum(out["evictable"] for out in outs)

    kept = {job_id: counts for out in outs for job_id, counts in out["kept"].items()}
    jobs = {
        row[0]: (row[1], row[2]) for row in db.execute_sql("SELECT id, targets_done, nbytes FROM batch_job")
    }
    assert jobs == kept
    rows = db.execute_sql("SELECT job_id, status, result FROM batch_target").fetchall()
    assert len(rows) == KEEP_TARGETS * len(kept)
    for job_id, (targets_done, nbytes) in jobs.items():
        mine = [r for r in rows if r[0] == job_id]
        assert targets_done == sum(r[1] in ("done", "failed") for r in mine)
        assert nbytes == sum(len(r[2].encode("utf-8")) for r in mine if r[2] is not None)
    assert dcache.batch_nbytes() == sum(nbytes for _, nbytes in kept.values())
    assert db.execute_sql("PRAGMA integrity_check").fetchall() == [("ok",)]

    waits = sorted(w for out in outs for w in out["waits"])
    RECORD.update(
        processes=PROCESSES,
        writes_per_process=WRITES_PER_PROCESS,
        locked_errors=0,
        worst_call_s=round(waits[-1], 4),
        p99_call_s=round(waits[int(len(waits) * 0.99)], 4),
        median_call_s=round(waits[len(waits) // 2], 5),
        swept=sum(out["swept"] for out in outs) + swept,
        evicted=sum(out["evicted"] for out in outs) + evicted,
    )
    for key, value in RECORD.items():
        record_property(key, value)
    worst, p99, median = (RECORD[k] * 1000 for k in ("worst_call_s", "p99_call_s", "median_call_s"))
    print(f"\nprocesses: {PROCESSES} x {WRITES_PER_PROCESS} writes, 0 'database is locked' errors")
    print(f"processes: worst wait on the lock {worst:.1f} ms (p99 {p99:.1f} ms, median {median:.2f} ms)")
    print(f"processes: {RECORD}")


# -- The guard is needed: plain deferred BEGIN against BEGIN IMMEDIATE ------------------------------------


def _hold_write_lock(path: str, held: Event, release: Event, committed: Event) -> None:
    """Hold BEGIN IMMEDIATE, with a write (error gets an "h", lease becomes 777), until told to commit."""
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE batch_job SET error = error || 'h', lease = 777 WHERE id = 'j'")
    held.set()
    release.wait(60)
    conn.execute("COMMIT")
    committed.set()
    conn.close()


def _start_holder(path: Path) -> tuple[multiprocessing.process.BaseProcess, Event, Event]:
    held, release, committed = ctx.Event(), ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_write_lock, args=(str(path), held, release, committed))
    holder.start()
    assert held.wait(60), "the holder never took the write lock"
    return holder, release, committed


def _stop_holder(holder: multiprocessing.process.BaseProcess, release: Event, timer: threading.Timer) -> None:
    timer.cancel()
    release.set()
    holder.join(60)
    assert holder.exitcode == 0


@pytest.mark.slow
def test_deferred_begin_fails_at_once_while_immediate_waits(file_store: Path) -> None:
    dcache.create_batch_job(make_job("j", targets_total=3), make_targets(3))
    dcache.close_db()
    read = "SELECT error, lease FROM batch_job WHERE id = 'j'"
    write = "UPDATE batch_job SET error = ? WHERE id = 'j'"

    # Deferred: the read starts a snapshot; the write cannot wait for the lock and fails at once, even
    # with a 600 s busy timeout, while the other process still holds the lock (it has not committed).
    holder, release, committed = _start_holder(file_store)
    never = threading.Timer(600, release.set)
    conn = sqlite3.connect(file_store, timeout=600, isolation_level=None)
    try:
        conn.execute("BEGIN")
        error, _ = conn.execute(read).fetchone()
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            conn.execute(write, (error + "d",))
        assert not committed.is_set(), "the failure came only after the holder committed"
        conn.execute("ROLLBACK")
    finally:
        _stop_holder(holder, release, never)

    # Immediate: the same read-then-write waits on the busy timeout for the holder's commit, then succeeds.
    holder, release, _ = _start_holder(file_store)
    timer = threading.Timer(0.2, release.set)
    timer.start()
    try:
        conn.execute("BEGIN IMMEDIATE")
        error, lease = conn.execute(read).fetchone()
        assert (error, lease) == ("hh", 777), "BEGIN IMMEDIATE got the lock before the holder committed"
        conn.execute(write, (error + "i",))
        conn.execute("COMMIT")
    finally:
        _stop_holder(holder, release, timer)
    # Both holders' writes and ours, in order; the failed deferred attempt changed nothing.
    assert conn.execute(read).fetchone() == ("hhi", 777)
    conn.close()

    # The package's own write does the same: it waits for the other process, then succeeds after it.
    dcache.open_db(file_store)
    holder, release, _ = _start_holder(file_store)
    timer = threading.Timer(0.2, release.set)
    timer.start()
    try:
        dcache.update_batch_target("j", 0, "done", result="é", now=2_000)
    finally:
        _stop_holder(holder, release, timer)
    job = dcache.batch_job("j")
    assert job is not None
    assert (job.error, job.lease, job.targets_done, job.nbytes) == ("hhih", 2_000, 1, 2)


def _plain_load(path: str, p: int, begin: str, barrier: Barrier, results: Any) -> None:
    """Read-then-write transactions through a plain sqlite3 connection with a 10 s busy timeout."""
    locked = ok = 0
    errors: list[str] = []
    try:
        conn = sqlite3.connect(path, timeout=10, isolation_level=None)
        barrier.wait()
        for _ in range(WRITES_PER_PROCESS):
            try:
                conn.execute(begin)
                (nbytes,) = conn.execute("SELECT nbytes FROM batch_job WHERE id = 'j'").fetchone()
                time.sleep(0.0005)  # the work a caller does between its read and its write
                conn.execute("UPDATE batch_job SET nbytes = ? WHERE id = 'j'", (nbytes + 1,))
                conn.execute("COMMIT")
                ok += 1
            except sqlite3.OperationalError as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if "database is locked" in str(exc):
                    locked += 1
                else:
                    errors.append(str(exc))
        conn.close()
    except BaseException as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    results.put({"p": p, "locked": locked, "ok": ok, "errors": errors})


@pytest.mark.slow
@pytest.mark.parametrize("begin", ["BEGIN", "BEGIN IMMEDIATE"])
def test_plain_sqlite3_load_deferred_begin_fails(file_store: Path, begin: str) -> None:
    """The same load (4 processes x 300 read-then-write transactions) through plain sqlite3: with a
    deferred BEGIN some fail with "database is locked"; with BEGIN IMMEDIATE none do, and none is lost."""
    dcache.create_batch_job(make_job("j"))
    dcache.close_db()
    outs = _run_processes(
        _plain_load, lambda p, barrier, results: (str(file_store), p, begin, barrier, results)
    )
    assert [out["errors"] for out in outs] == [[]] * PROCESSES
    locked = sum(out["locked"] for out in outs)
    ok = sum(out["ok"] for out in outs)
    assert locked + ok == PROCESSES * WRITES_PER_PROCESS
    conn = sqlite3.connect(file_store)
    assert conn.execute("SELECT nbytes FROM batch_job WHERE id = 'j'").fetchone() == (ok,)  # no lost update
    conn.close()
    if begin == "BEGIN":
        assert locked > 0
        RECORD["deferred_begin_locked_errors"] = locked
    else:
        assert locked == 0
    print(
        f"\nplain sqlite3, {begin}: {PROCESSES} x {WRITES_PER_PROCESS} transactions, {locked} locked errors"
    )


# -- Claims: claimers, renewers, releasers, requeuers, sweepers and evictors in several processes ------------

CLAIM_JOBS = 4
CLAIM_TARGETS = 30
RUNNERS = 3
DOOMED_JOBS = 6  # finished long ago and holding no bytes: only the sweep may take them
SWEEP_TTL = 3_600  # far longer than the run: a job that runners touch is never swept
LIVE_STATUSES = ("queued", "running")
FINAL_STATUSES = ("done", "partial", "failed", "cancelled")

# Every deleted job and target is written down by a trigger of the test's own, with the job's status and
# lease at that moment, so the end can tell what the sweeps and evictions took, and that no job was live.
_DELETION_LOG = {
    "sqlite": [
        "CREATE TABLE deleted_job (id TEXT, status TEXT, lease INTEGER, nbytes INTEGER, at INTEGER)",
        "CREATE TABLE deleted_target (job_id TEXT, idx INTEGER, status TEXT, result TEXT, error TEXT,"
        " runner TEXT, attempts INTEGER)",
        "CREATE TRIGGER log_deleted_job AFTER DELETE ON batch_job BEGIN INSERT INTO deleted_job"
        " VALUES (old.id, old.status, old.lease, old.nbytes, unixepoch()); END",
        "CREATE TRIGGER log_deleted_target AFTER DELETE ON batch_target BEGIN INSERT INTO deleted_target"
        " VALUES (old.job_id, old.idx, old.status, old.result, old.error, old.runner, old.attempts); END",
    ],
    "postgres": [
        "CREATE TABLE deleted_job (id TEXT, status TEXT, lease BIGINT, nbytes BIGINT, at BIGINT)",
        "CREATE TABLE deleted_target (job_id TEXT, idx INTEGER, status TEXT, result TEXT, error TEXT,"
        " runner TEXT, attempts INTEGER)",
        # now() is the deleting transaction's start: a sweep reads its clock before that
        "CREATE FUNCTION log_deleted_job() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO"
        " deleted_job VALUES (OLD.id, OLD.status, OLD.lease, OLD.nbytes, extract(epoch FROM now())::bigint);"
        " RETURN OLD; END $$",
        "CREATE TRIGGER log_deleted_job AFTER DELETE ON batch_job FOR EACH ROW EXECUTE FUNCTION"
        " log_deleted_job()",
        "CREATE FUNCTION log_deleted_target() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO"
        " deleted_target VALUES (OLD.job_id, OLD.idx, OLD.status, OLD.result, OLD.error, OLD.runner,"
        " OLD.attempts);"
        " RETURN OLD; END $$",
        "CREATE TRIGGER log_deleted_target AFTER DELETE ON batch_target FOR EACH ROW EXECUTE FUNCTION"
        " log_deleted_target()",
    ],
}
_DROP_DELETION_LOG = [
    "DROP TRIGGER log_deleted_job{on}",
    "DROP TRIGGER log_deleted_target{on_target}",
]
#: The runners claim fairly (two callers, weights by class) and politely (targets on 3 hosts).
PER_HOST = 3
WEIGHTS = {"fleet": 2}


def _claim_runner(target: str, name: str, seed: int, runners_done: Any, barrier: Any) -> dict[str, Any]:
    """Claim, write (as this runner) and finish the job its write completes, renew, and now and then
    release, or give a target back untried; count what it did. A write after the claim was taken is
    refused (ClaimLost), or finds its job gone once that job finished without it and was evicted."""
    dcache.open_db(target)
    rng = random.Random(seed)
    done = {
        "claimed": 0,
        "released": 0,
        "given_back": 0,
        "written": 0,
        "refused": 0,
        "gone": 0,
        "finished": 0,
    }
    barrier.wait()
    for _ in range(60):
        claimed = dcache.claim_batch_targets(4, per_job=2, per_host=PER_HOST, weights=WEIGHTS, runner=name)
        done["claimed"] += len(claimed)
        for t in claimed:
            if rng.random() < 0.1:
                done["released"] += dcache.release_claims(name)
                break
            try:
                if rng.random() < 0.05:  # not sent in time: back untried, its attempt given back
                    dcache.retry_batch_target(
                        t.job_id, t.idx, runner=name, error=None, not_before=None, attempted=False
                    )
                    done["given_back"] += 1
                    continue
                dcache.update_batch_target(t.job_id, t.idx, "done", result=name, runner=name)
                done["written"] += 1
                done["finished"] += dcache.finish_batch_job(t.job_id) is not None
            except dcache.ClaimLost:
                done["refused"] += 1
            except (dcache.JobNotFound, dcache.TargetNotFound):
                done["gone"] += 1
            dcache.renew_claims(name)
    done["released"] += dcache.release_claims(name)
    dcache.close_db()
    with runners_done.get_lock():
        runners_done.value += 1
    return done


def _requeuer(target: str, max_attempts: int, barrier: Any) -> dict[str, Any]:
    """Requeue every claim at once (stale_after 0): each runner loses claims it is working on."""
    dcache.open_db(target)
    moved = 0
    barrier.wait()
    for _ in range(40):
        moved += dcache.requeue_stale_claims(0, max_attempts=max_attempts, reason="taken for dead")
    dcache.close_db()
    return {"moved": moved}


def _until_runners_stop(runners_done: Any, step: Callable[[], int]) -> int:
    """``step()`` again and again while the runners work, and once more after the last one stopped."""
    total = 0
    while True:
        last = runners_done.value == RUNNERS
        total += step()
        if last:
            return total
        time.sleep(0.005)  # pacing only: leave the 2 cores to the runners


def _sweeper(target: str, runners_done: Any, barrier: Any) -> dict[str, Any]:
    """Sweep with a TTL longer than the run, as long as the runners work: only long-finished jobs go."""
    dcache.open_db(target)
    barrier.wait()
    swept = _until_runners_stop(runners_done, lambda: dcache.sweep_batch(SWEEP_TTL))
    dcache.close_db()
    return {"swept": swept}


def _evictor(target: str, runners_done: Any, barrier: Any) -> dict[str, Any]:
    """Evict to a budget of 0 as long as the runners work: finished jobs holding bytes go, no live one."""
    dcache.open_db(target)
    barrier.wait()
    evicted = _until_runners_stop(runners_done, lambda: dcache.evict_batch_oldest(0))
    dcache.close_db()
    return {"evicted": evicted}


def _operator(target: str, runners_done: Any, barrier: Any) -> dict[str, Any]:
    """As long as the runners work: pause and resume a caller and a job, back a host off and release it,
    and pace and cap hosts, at random; then resume and release everything, and clear the policies."""
    dcache.open_db(target)
    rng = random.Random(7)

    def step() -> int:
        host = f"h{rng.randrange(3)}.example"
        choice = rng.randrange(6)
        if choice == 0:
            dcache.pause_caller("caller-1")
        elif choice == 1:
            dcache.resume_caller("caller-1")
        elif choice == 2:
            job_id = f"job-{rng.randrange(1, CLAIM_JOBS)}"
            with contextlib.suppress(dcache.JobNotFound):  # evicted once finished
                (dcache.pause_batch_job if rng.random() < 0.5 else dcache.resume_batch_job)(job_id)
        elif choice == 3:
            dcache.back_off_host(host, dcache.unix_now() + rng.random())
        elif choice == 4:
            dcache.release_host(host)
        else:
            dcache.set_host_policy(
                host, max_running=rng.choice([None, 1, 2]), min_interval=rng.choice([0, 0.01])
            )
        return 1

    barrier.wait()
    steps = _until_runners_stop(runners_done, step)
    dcache.resume_caller("caller-1")
    for j in range(CLAIM_JOBS):
        with contextlib.suppress(dcache.JobNotFound):
            dcache.resume_batch_job(f"job-{j}")
    for h in range(3):
        dcache.release_host(f"h{h}.example")
        dcache.set_host_policy(f"h{h}.example")
    dcache.close_db()
    return {"operator_steps": steps}


def _claims_worker(kind: str, *args: Any) -> dict[str, Any]:
    workers: dict[str, Callable[..., dict[str, Any]]] = {
        "runner": _claim_runner,
        "requeuer": _requeuer,
        "sweeper": _sweeper,
        "evictor": _evictor,
        "operator": _operator,
    }
    return workers[kind](*args)


@pytest.mark.slow
def test_claimers_renewers_releasers_requeuers_sweepers_and_evictors_keep_every_count(
    shared_store: str,
) -> None:
    from helpers import SPAWN, create_partial, run_processes

    backend = "postgres" if shared_store.startswith("postgresql:") else "sqlite"
    for statement in _DELETION_LOG[backend]:
        db.execute_sql(statement)
    now = dcache.unix_now()

    def targets(j: int) -> list[Any]:
        return [make_target(i, url=f"https://h{i % 3}.example/{j}/{i}") for i in range(CLAIM_TARGETS)]

    for j in range(1, CLAIM_JOBS):
        new = make_job(
            f"job-{j}", targets_total=CLAIM_TARGETS, created_at=j, lease=now, caller=f"caller-{j % 2}"
        )
        dcache.create_batch_job(new, targets(j))
    # job-0 waits for one more target than it has: it can never finish, so no eviction may take it.
    job_0 = make_job("job-0", targets_total=CLAIM_TARGETS + 1, created_at=now, lease=now, caller="caller-0")
    create_partial(job_0, targets(0))
    for d in range(DOOMED_JOBS):
        dcache.create_batch_job(make_job(f"doomed-{d}", status="done", targets_total=0, lease=1_000))
    runners_done = SPAWN.Value("i", 0)
    args: list[tuple[Any, ...]] = [
        ("runner", shared_store, f"runner-{r}", r, runners_done) for r in range(RUNNERS)
    ]
    args += [("requeuer", shared_store, 4), ("requeuer", shared_store, 10**6)]
    args += [("sweeper", shared_store, runners_done), ("evictor", shared_store, runners_done)]
    args.append(("operator", shared_store, runners_done))  # pauses, back-offs and host policies meanwhile
    reports = run_processes(_claims_worker, args)
    assert not [r for r in reports if "errors" in r], reports
    runners = [r for r in reports if "claimed" in r]  # reports come in the order the processes end
    assert len(runners) == RUNNERS
    assert [r["operator_steps"] > 0 for r in reports if "operator_steps" in r] == [True]

    # What went: the long-finished jobs, by the sweep; finished jobs holding bytes, by eviction. No job
    # was deleted while queued or running, and each went whole, exactly once.
    deleted = db.execute_sql("SELECT id, status, lease, nbytes, at FROM deleted_job").fetchall()
    assert [row for row in deleted if row[1] not in FINAL_STATUSES] == []
    assert len({row[0] for row in deleted}) == len(deleted)
    swept = sum(r.get("swept", 0) for r in reports)
    evicted = sum(r.get("evicted", 0) for r in reports)
    assert swept + evicted == len(deleted)
    assert sorted(row[0] for row in deleted if row[0].startswith("doomed-")) == sorted(
        f"doomed-{d}" for d in range(DOOMED_JOBS)
    )
    for job_id, _status, lease, nbytes, at in deleted:
        assert nbytes > 0 or lease + SWEEP_TTL <= at, (job_id, lease, nbytes, at)
    swept_or_evicted = {row[0] for row in deleted}
    assert "job-0" not in swept_or_evicted
    print(f"\n{backend}: {swept} jobs swept, {evicted} evicted, of {len(deleted)} deleted")

    # A target's attempts count its claims, less the ones given back by a release or a retry untried: over
    # the targets left and the ones deleted with their finished jobs.
    claimed = sum(r["claimed"] for r in runners)
    released = sum(r["released"] for r in runners) + sum(r["given_back"] for r in runners)
    columns = "job_id, status, result, error, runner, attempts"
    rows = db.execute_sql(f"SELECT {columns} FROM batch_target").fetchall()
    gone = db.execute_sql(f"SELECT {columns} FROM deleted_target")
    gone_rows = gone.fetchall()
    assert {row[0] for row in gone_rows} <= swept_or_evicted
    assert [row for row in gone_rows if row[1] not in ("done", "failed")] == []
    every = rows + gone_rows
    assert sum(row[5] for row in every) == claimed - released
    # Every stored result is its target's last holder's: no late write of a requeued claim landed.
    for _job_id, status, result, error, runner, attempts in every:
        assert status in ("pending", "running", "done", "failed"), status
        if status == "done":
            assert result == runner and attempts >= 1
        if status == "failed":
            assert (result, error) == (None, "taken for dead") and attempts >= 4
    assert sum(r["written"] for r in runners) == sum(1 for row in every if row[1] == "done")
    # Each job left counts each final target once, and its bytes are its results' bytes.
    for j in range(CLAIM_JOBS):
        job = dcache.batch_job(f"job-{j}")
        if job is None:
            assert f"job-{j}" in swept_or_evicted
            continue
        final = [row for row in rows if row[0] == job.id and row[1] in ("done", "failed")]
        assert job.targets_done == len(final)
        assert job.nbytes == sum(len(row[2].encode()) for row in final if row[2] is not None)
        # Live while it has work left; once complete, finished by the runner whose write completed it (or
        # by the requeue that failed its last target).
        assert (job.status in LIVE_STATUSES) == (job.targets_done < job.targets_total), job
    # No host over its limit: a requeue or release only lowers the running counts.
    running = db.execute_sql("SELECT host, COUNT(*) FROM batch_target WHERE status = 'running' GROUP BY host")
    assert all(count <= PER_HOST for _, count in running.fetchall())
    dcache.requeue_in_flight(max_attempts=10**6)  # whatever is still claimed goes back: nothing is lost
    left = db.execute_sql("SELECT COUNT(*) FROM batch_target WHERE status = 'running'").fetchone()[0]
    assert left == 0
    for statement in _DROP_DELETION_LOG:
        on = " ON batch_job" if backend == "postgres" else ""
        db.execute_sql(statement.format(on=on, on_target=on.replace("batch_job", "batch_target")))
    assert dcache.check_store().ok
