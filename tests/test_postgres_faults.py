"""Faults under a PostgreSQL store, on a private server the tests start themselves (tests/pg_server.py), so
that the shared test server is never stopped or reconfigured.

- The server stopped and started again (``-m fast``, and ``-m immediate``: a crash), and restarted in one
  ``pg_ctl restart``, while 4 threads of this process and 2 other processes of 2 threads each keep calling
  the store: every failed call is ``StoreUnavailable``; the same threads' calls work once it is back; every
  write whose call returned is there, and the counts and byte totals are exact (checked in SQL, and by
  ``check_store()``).
- A client SIGKILLed inside ``db.atomic()`` after several writes, and in the middle of a 200,000-target
  ``put_batch_targets``: nothing of it is left, and another process writes the same job at once.
- A wrong password (scram-sha-256), no password, a wrong port or host, a server that never answers, an
  unknown database: ``open_db`` raises ``StoreUnavailable`` naming the cause, never the password.
- The pool exhausted, and a session ended by ``pg_terminate_backend`` in the middle of a call or of the
  caller's transaction: ``StoreUnavailable``, and the thread's next call works.

No wall clock is asserted: a call that hangs shows as a worker that never reaches its count, which fails the
test after :data:`LIVENESS_S` seconds naming it.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pg_server
import pytest
from cli_helpers import sift_script
from helpers import make_job, make_targets
from pg_server import PASSWORD, PASSWORD_ROLE, PrivateServer
from runner_site import serving

from sift import dcache
from sift.dcache import BatchTarget, db

ctx = multiprocessing.get_context("spawn")
TESTS = Path(__file__).parent

#: How long a step may take before the test fails naming what did not happen (a hang, not a timing).
LIVENESS_S = 180.0
#: The store's timeout in these tests (connect, lock and pool waits), seconds.
TIMEOUT_S = 2.0


@pytest.fixture(scope="session")
def server() -> Iterator[PrivateServer]:
    """A private PostgreSQL server for this test session, stopped and removed at the end. Skips every case
    with one reason when no server can be started here, except under CI (``CI=true``), where they fail."""
    started = pg_server.started("the fault tests")
    try:
        yield started
    finally:
        try:
            dcache.close_db()
        finally:
            started.destroy()


_schemas = itertools.count()


@pytest.fixture
def target(server: PrivateServer) -> Iterator[str]:
    """A store in a fresh schema of the private server, open in this process; yields its target URL."""
    url = f"{server.url()}?schema=faults_{next(_schemas)}"
    dcache.open_db(url, timeout=TIMEOUT_S)
    yield url
    dcache.close_db()


def _rows(server: PrivateServer, url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` in the store's schema, read over a connection of its own (not sift's)."""
    schema = url.rpartition("schema=")[2]
    with server.admin() as admin:
        admin.execute(f'SET search_path = "{schema}"')
        return admin.execute(sql, params).fetchall()


def _snapshot(server: PrivateServer, url: str) -> dict[str, list[tuple[Any, ...]]]:
    return {
        table: sorted(_rows(server, url, f"SELECT * FROM {table}"), key=repr)
        for table in ("batch_job", "batch_target", "batch_totals")
    }


def _invariants(server: PrivateServer, url: str) -> None:
    """targets_done counts the finished targets, nbytes their stored results, the slots sum the jobs."""
    wrong = _rows(
        server,
        url,
        "SELECT j.id, j.targets_done, j.nbytes, t.finished, t.size FROM batch_job j LEFT JOIN "
        "(SELECT job_id, COUNT(*) FILTER (WHERE status IN ('done', 'failed')) AS finished, "
        "COALESCE(SUM(octet_length(result)), 0) AS size FROM batch_target GROUP BY job_id) t "
        "ON t.job_id = j.id "
        "WHERE j.targets_done <> COALESCE(t.finished, 0) OR j.nbytes <> COALESCE(t.size, 0)",
    )
    assert wrong == []
    (slots,), (jobs,) = (
        _rows(server, url, "SELECT SUM(nbytes) FROM batch_totals")[0],
        _rows(server, url, "SELECT COALESCE(SUM(nbytes), 0) FROM batch_job")[0],
    )
    assert slots == jobs


def _wait_until(what: str, done: Callable[[], bool], *, alive: Callable[[], list[str]] = list) -> None:
    """Poll ``done`` until true; fail naming ``what`` after LIVENESS_S, or as soon as ``alive`` names a
    worker that died."""
    deadline = time.monotonic() + LIVENESS_S
    while not done():
        dead = alive()
        assert not dead, f"waiting for {what}: {dead}"
        assert time.monotonic() < deadline, f"not within {LIVENESS_S:g} s: {what}"
        time.sleep(0.02)


# -- The server restarted under load ---------------------------------------------------------------------

THREADS = 4  # in this process
PROCESSES = 2
PROCESS_THREADS = 2
WORKERS = THREADS + PROCESSES * PROCESS_THREADS
LOAD_JOBS = 4
SLICE = 50  # the targets of each load job that one worker owns (only it writes them)
OUTAGE_FAILURES = 3  # failed calls each worker makes while the server is down
CALLS_BEFORE = 100  # calls each worker completes before the fault
CALLS_AFTER = 100  # calls each worker completes once the server is back


class Load:
    """What the workers share: per-worker counts of calls that returned and that raised, and two events."""

    def __init__(self) -> None:
        self.ok = ctx.Array("q", WORKERS, lock=False)
        self.failed = ctx.Array("q", WORKERS, lock=False)
        self.up = ctx.Event()  # set once the server is back
        self.stop = ctx.Event()


def _work(worker: int, load: Load) -> list[tuple[Any, ...]]:
    """Call the store until told to stop; return every call as (kind, args, outcome, after_up, seconds),
    where outcome is "ok", or the exception's class name and message."""
    rng = random.Random(worker)
    calls: list[tuple[Any, ...]] = []
    mine = range(worker * SLICE, (worker + 1) * SLICE)
    for seq in itertools.count():
        if load.stop.is_set():
            break
        after_up = load.up.is_set()
        began = time.monotonic()
        job = f"load-{rng.randrange(LOAD_JOBS)}"
        roll = rng.random()
        writes: list[tuple[str, int, str, str, str | None]] = []
        for idx in rng.sample(mine, 2 if roll < 0.15 else 1):
            status = rng.choice(("done", "failed"))
            result = f"{worker}:{seq}:{idx}:" + "é" * rng.randrange(30)
            writes.append((job, idx, status, result, f"e{seq}" if status == "failed" else None))
        kind = "atomic" if roll < 0.15 else "target" if roll < 0.7 else "create" if roll < 0.85 else "read"
        new_job = f"new-{worker}-{seq}"
        args: tuple[Any, ...] = {"atomic": tuple(writes), "target": writes[0], "create": (new_job,)}.get(
            kind, (job,)
        )
        try:
            if kind == "atomic":  # the caller's own transaction around two writes
                with db.atomic():
                    for job_id, idx, status, result, error in writes:
                        dcache.update_batch_target(job_id, idx, status, result=result, error=error, now=seq)
            elif kind == "target":
                job_id, idx, status, result, error = writes[0]
                dcache.update_batch_target(job_id, idx, status, result=result, error=error, now=seq)
            elif kind == "create":
                dcache.create_batch_job(make_job(new_job, targets_total=3), make_targets(3))
            else:
                found = dcache.batch_job(job)
                assert found is not None and found.targets_done <= found.targets_total
            outcome: tuple[str, ...] = ("ok",)
            load.ok[worker] += 1
        except dcache.StoreUnavailable as exc:
            outcome = (type(exc).__name__, str(exc))
            load.failed[worker] += 1
        except BaseException as exc:  # a leak: reported with its traceback, the test fails on it
            outcome = ("LEAK " + type(exc).__name__, "".join(traceback.format_exception(exc)))
            load.failed[worker] += 1
        calls.append((kind, args, outcome, after_up, time.monotonic() - began))
    return calls


def _process_worker(url: str, first: int, load: Load, results: Any) -> None:
    try:
        dcache.open_db(url, timeout=TIMEOUT_S)
        out: dict[int, list[tuple[Any, ...]]] = {}
        threads = [
            threading.Thread(target=lambda w=w: out.__setitem__(w, _work(w, load)))
            for w in range(first, first + PROCESS_THREADS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        results.put(out)
    except BaseException as exc:
        results.put({-1: [("process", (), ("LEAK " + type(exc).__name__, str(exc)), False, 0.0)]})


def _expected_targets(calls: list[tuple[Any, ...]]) -> dict[tuple[str, int], list[tuple[Any, ...]]]:
    """For each written target, the states it may hold: its last write that returned, and any write after
    that one whose call failed (it may have committed before the connection was lost). With no write that
    returned, also the pending state it started in."""
    writes: dict[tuple[str, int], list[tuple[tuple[Any, ...], bool]]] = {}
    for kind, args, outcome, *_ in calls:
        if kind in ("target", "atomic"):
            for job_id, idx, status, result, error in args if kind == "atomic" else (args,):
                writes.setdefault((job_id, idx), []).append(((status, result, error), outcome == ("ok",)))
    allowed = {}
    for key, history in writes.items():
        returned = [i for i, (_, ok) in enumerate(history) if ok]
        start = returned[-1] if returned else 0
        states = [state for state, _ in history[start:]]
        if not returned:
            states.append(("pending", None, None))
        allowed[key] = states
    return allowed


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stop-fast", "stop-immediate", "restart-immediate"])
def test_server_restart_under_load(server: PrivateServer, target: str, how: str) -> None:
    for j in range(LOAD_JOBS):
        total = WORKERS * SLICE
        dcache.create_batch_job(
            make_job(f"load-{j}", status="running", targets_total=total), make_targets(total)
        )
    load, results = Load(), ctx.Queue()
    thread_calls: dict[int, list[tuple[Any, ...]]] = {}
    threads = [
        threading.Thread(target=lambda w=w: thread_calls.__setitem__(w, _work(w, load)))
        for w in range(THREADS)
    ]
    processes = [
        ctx.Process(target=_process_worker, args=(target, THREADS + p * PROCESS_THREADS, load, results))
        for p in range(PROCESSES)
    ]
    for thread in threads:
        thread.start()
    for process in processes:
        process.start()

    def dead() -> list[str]:
        return [f"process {p.pid} exited {p.exitcode}" for p in processes if not p.is_alive()]

    try:
        _wait_until(f"{CALLS_BEFORE} calls by each worker", lambda: min(load.ok) >= CALLS_BEFORE, alive=dead)
        mode = how.rpartition("-")[2]
        if how.startswith("stop"):
            # The restart in two steps, so that the outage lasts until every worker has called through it.
            failed_before = list(load.failed)
            server.stop(mode)
            _wait_until(
                f"{OUTAGE_FAILURES} failed calls by each worker while the server is down",
                lambda: all(load.failed[w] - failed_before[w] >= OUTAGE_FAILURES for w in range(WORKERS)),
                alive=dead,
            )
            server.start()
        else:
            server.restart(mode)
        load.up.set()
        ok_at_up = list(load.ok)
        _wait_until(
            f"{CALLS_AFTER} calls by each worker after the server is back",
            lambda: all(load.ok[w] - ok_at_up[w] >= CALLS_AFTER for w in range(WORKERS)),
            alive=dead,
        )
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(timeout=LIVENESS_S)
        by_worker = dict(thread_calls)
        for _ in processes:
            by_worker.update(results.get(timeout=LIVENESS_S))
        for process in processes:
            process.join(timeout=LIVENESS_S)

    assert sorted(by_worker) == list(range(WORKERS))
    calls = [call for w in range(WORKERS) for call in by_worker[w]]
    leaks = [call for call in calls if call[2][0].startswith("LEAK")]
    assert leaks == [], "\n".join(call[2][1] for call in leaks[:3])
    for w in range(WORKERS):
        failures = [call[2] for call in by_worker[w] if call[2] != ("ok",)]
        assert failures, f"worker {w} never saw the outage"
        # Back up: at most the first call fails (a connection the thread had not used since the restart).
        after = [call[2] != ("ok",) for call in by_worker[w] if call[3]]
        assert sum(after[1:]) == 0, [call for call in by_worker[w] if call[3] and call[2] != ("ok",)]

    # Nothing whose call returned is lost.
    created = dict(
        _rows(
            server,
            target,
            "SELECT j.id, COUNT(t.idx) FROM batch_job j LEFT JOIN batch_target t ON t.job_id = j.id "
            "WHERE j.id LIKE 'new-%%' GROUP BY j.id",
        )
    )
    creates = {args[0]: outcome == ("ok",) for kind, args, outcome, *_ in calls if kind == "create"}
    assert [job_id for job_id, ok in creates.items() if ok and job_id not in created] == []
    assert set(created) <= set(creates)
    assert {job_id: count for job_id, count in created.items() if count != 3} == {}  # all or nothing
    stored = {
        (job_id, idx): (status, result, error)
        for job_id, idx, status, result, error in _rows(
            server,
            target,
            "SELECT job_id, idx, status, result, error FROM batch_target WHERE job_id LIKE 'load-%%'",
        )
    }
    allowed = _expected_targets(calls)
    wrong = {key: (stored[key], states) for key, states in allowed.items() if stored[key] not in states}
    assert wrong == {}
    untouched = [
        key for key, state in stored.items() if key not in allowed and state != ("pending", None, None)
    ]
    assert untouched == []
    _invariants(server, target)
    failed = [call for call in calls if call[2] != ("ok",)]
    print(  # measured, never asserted: pytest -s shows it
        f"\n{how}: {len(calls)} calls by {WORKERS} workers, {len(calls) - len(failed)} returned, "
        f"{len(failed)} raised StoreUnavailable ({sorted({call[2][0] for call in failed})}); "
        f"longest failed call {max(call[4] for call in failed):.3f} s, "
        f"longest call {max(call[4] for call in calls):.3f} s"
    )
    # The pool's idle connections were in it when the workers found theirs lost: each is asked the server
    # before it serves again, so this thread's next call works at once.
    dcache.update_batch_target("load-0", 0, "done", result="again", now=10**6)
    _invariants(server, target)
    assert dcache.check_store().violations == []  # the package's own check agrees


# -- A runner process through the restart -----------------------------------------------------------------


def _job_final(job_id: str) -> bool:
    """Whether the job is final, read through this process's store; False while it cannot be read."""
    try:
        job = dcache.batch_job(job_id)
    except dcache.StoreUnavailable:
        return False
    return job is not None and job.status in ("done", "partial", "failed")


@pytest.mark.slow
def test_sift_run_finishes_its_job_through_a_server_restart(
    server: PrivateServer, target: str, tmp_path: Path
) -> None:
    """``sift run``, as users run it, holding fetches in flight when the server stops: their results wait
    in the runner (its writes fail, and so do its claims) until the server is back, then are written once
    each; the rest of the job is fetched; every page was asked for once, the counts and byte totals are
    exact, no claim is left, and SIGTERM still stops the runner with exit status 0."""
    with serving() as site:
        urls = [f"{site.base}/ok/{i}" for i in range(10)] + [f"{site.base}/hang/{i}" for i in range(10, 30)]
        job_id = dcache.submit("alice", urls, idem_key="").job_id
        log = tmp_path / "runner.log"
        with log.open("w") as err:
            argv = [str(sift_script()), "--db", target, "run", "--fetch", "runner_site:fetch"]
            argv += ["--concurrency", "4", "--renew-every", "1"]
            # from the tests' directory: --fetch imports runner_site from the current directory
            proc = subprocess.Popen(argv, cwd=TESTS, stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            _wait_until("the first 4 of the hanging pages asked for", lambda: site.asked("/hang/") == 4)
            server.stop("fast")
            site.release.set()  # the 4 fetches in flight return while the server is down
            _wait_until("the runner's write to fail", lambda: "outcomes failed" in log.read_text())
            server.start()
            _wait_until("the job to be final", lambda: _job_final(job_id))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=LIVENESS_S)
            if not (server.data / "postmaster.pid").exists():  # failed while down: the module's next cases
                server.start()
        assert proc.returncode == 0, log.read_text()[-2000:]
    assert {path: len(times) for path, times in site.times.items()} == {
        url.removeprefix(site.base): 1 for url in urls
    }
    job = dcache.batch_job(job_id)
    assert job is not None and (job.status, job.targets_done) == ("done", 30)
    rows = _rows(server, target, "SELECT idx, status, attempts, result FROM batch_target ORDER BY idx")
    assert [row[:3] for row in rows] == [(idx, "done", 1) for idx in range(30)]
    assert all(result.startswith(f"{'page' if idx < 10 else 'hung'} /") for idx, *_, result in rows)
    _invariants(server, target)
    assert dcache.check_store().violations == []


# -- A client SIGKILLed mid-transaction ------------------------------------------------------------------


def _killed_inside_atomic(url: str, inside: Any) -> None:
    dcache.open_db(url, timeout=TIMEOUT_S)
    with db.atomic():
        for idx in range(10):
            dcache.update_batch_target("job-1", idx, "done", result="r" * 100, now=7)
        dcache.create_batch_job(make_job("job-2"), make_targets(3))
        dcache.put_batch_targets("job-3", make_targets(5))
        dcache.submit_batch_job(make_job("job-4", idem_key="k"), make_targets(3), 60, now=7)
        inside.set()
        time.sleep(600)  # SIGKILLed here


def _writes_the_same_rows(url: str, results: Any) -> None:
    try:
        dcache.open_db(url, timeout=TIMEOUT_S)  # a lock still held would fail these after TIMEOUT_S
        for idx in range(10):
            dcache.update_batch_target("job-1", idx, "done", result="w" * idx, now=8)
        dcache.create_batch_job(make_job("job-2"), make_targets(3))
        dcache.put_batch_targets("job-3", make_targets(5))
        results.put(dcache.submit_batch_job(make_job("job-5", idem_key="k"), None, 60, now=8))
    except BaseException as exc:
        results.put(f"{type(exc).__name__}: {exc}")


def _in_transaction(server: PrivateServer) -> int:
    with server.admin() as admin:
        row = admin.execute(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = %s AND state LIKE 'idle in transaction%%'",
            (server.database,),
        ).fetchone()
    assert row is not None
    return int(str(row[0]))


def _kill(process: Any) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=LIVENESS_S)
    assert process.exitcode == -signal.SIGKILL


def _other_process_writes(url: str) -> None:
    results = ctx.Queue()
    writer = ctx.Process(target=_writes_the_same_rows, args=(url, results))
    writer.start()
    assert results.get(timeout=LIVENESS_S) == ("job-5", True)
    writer.join(timeout=LIVENESS_S)


@pytest.mark.slow
def test_client_killed_inside_atomic_leaves_nothing_and_no_lock(server: PrivateServer, target: str) -> None:
    dcache.create_batch_job(make_job("job-1", status="running", targets_total=20), make_targets(20))
    dcache.create_batch_job(make_job("job-3", targets_total=5))
    before = _snapshot(server, target)
    inside = ctx.Event()
    child = ctx.Process(target=_killed_inside_atomic, args=(target, inside))
    child.start()
    assert inside.wait(timeout=LIVENESS_S)
    assert _in_transaction(server) == 1  # the child's writes are in the server, uncommitted
    _kill(child)
    assert _snapshot(server, target) == before
    _other_process_writes(target)  # the same target rows, job rows and key, at once
    assert _in_transaction(server) == 0
    rows = _rows(server, target, "SELECT id, targets_done, nbytes FROM batch_job ORDER BY id")
    assert rows == [("job-1", 10, 45), ("job-2", 0, 0), ("job-3", 0, 0), ("job-5", 0, 0)]
    _invariants(server, target)
    # job-5 was submitted without targets (created_at 1,000): only its missing targets are named.
    assert [(v.kind, v.job_id) for v in dcache.check_store().violations] == [("missing_targets", "job-5")]


HUGE = 200_000


def _killed_in_a_huge_put(url: str, inside: Any) -> None:
    dcache.open_db(url, timeout=TIMEOUT_S)

    def targets() -> Iterator[BatchTarget]:
        for i in range(HUGE):
            if i == HUGE // 2:
                inside.set()
                time.sleep(600)  # SIGKILLed here, half the targets sent
            yield BatchTarget(idx=i, url=f"https://example.com/{i}", options='{"render":false}')

    dcache.put_batch_targets("job-3", targets())


@pytest.mark.slow
def test_client_killed_in_a_huge_put_leaves_nothing_and_no_lock(server: PrivateServer, target: str) -> None:
    dcache.create_batch_job(make_job("job-1", status="running", targets_total=20), make_targets(20))
    dcache.create_batch_job(make_job("job-3", targets_total=HUGE))
    before = _snapshot(server, target)
    (empty,) = _rows(server, target, "SELECT pg_relation_size('batch_target')")[0]
    inside = ctx.Event()
    child = ctx.Process(target=_killed_in_a_huge_put, args=(target, inside))
    child.start()
    assert inside.wait(timeout=LIVENESS_S)
    (sent,) = _rows(server, target, "SELECT pg_relation_size('batch_target')")[0]
    assert sent > empty + 1_000_000  # the server holds many uncommitted target rows of the put
    _kill(child)
    assert _snapshot(server, target) == before
    _other_process_writes(target)
    assert _rows(server, target, "SELECT COUNT(*) FROM batch_target WHERE job_id = 'job-3'") == [(5,)]
    _invariants(server, target)
    # job-3 holds 5 of its targets, job-5 none (both created at 1,000): only that is named.
    found = [(v.kind, v.job_id) for v in dcache.check_store().violations]
    assert found == [("missing_targets", "job-3"), ("missing_targets", "job-5")]


# -- Connecting: wrong password, user, database, port, host; a server that never answers ----------------

WRONG_PASSWORD = "Wr0ng-Pa55word"


def _silent_listener() -> tuple[socket.socket, int]:
    """A TCP port that accepts connections (the kernel completes the handshake) and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port: int = listener.getsockname()[1]
    return listener, port


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


#: Each way to fail connecting, and the cause the message must name.
CONNECT_FAULTS = {
    "wrong-password": f'password authentication failed for user "{PASSWORD_ROLE}"',
    "no-password": "no password supplied",
    "unknown-user": 'role "nobody" does not exist',
    "unknown-database": 'database "no_such_db" does not exist',
    "wrong-port": "Connection refused",
    "wrong-host": "failed to resolve host 'no-such-host.invalid'",
    "silent-server": "connection timeout expired",
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CONNECT_FAULTS))
def test_open_db_names_why_it_cannot_connect(server: PrivateServer, case: str) -> None:
    cause = CONNECT_FAULTS[case]
    listener, silent = _silent_listener()
    url = {
        "wrong-password": server.url(user=PASSWORD_ROLE, password=WRONG_PASSWORD),
        "no-password": server.url(user=PASSWORD_ROLE),
        "unknown-user": server.url(user="nobody"),
        "unknown-database": server.url(database="no_such_db"),
        "wrong-port": server.url(port=_unused_port()),
        "wrong-host": server.url().replace("127.0.0.1", "no-such-host.invalid"),
        "silent-server": server.url(port=silent),
    }[case]
    raised: list[BaseException] = []

    def open_it() -> None:
        try:
            dcache.open_db(f"{url}?schema=faults_auth", timeout=1)
        except BaseException as exc:
            raised.append(exc)

    with listener:
        opener = threading.Thread(target=open_it)  # so that a hang fails the test instead of stalling it
        opener.start()
        opener.join(timeout=LIVENESS_S)
        assert not opener.is_alive(), "open_db hung"
    assert len(raised) == 1 and type(raised[0]) is dcache.StoreUnavailable, raised
    message = str(raised[0])
    shown = url.replace(f":{WRONG_PASSWORD}@", "@")
    assert message.startswith(f"path: cannot open '{shown}?schema=faults_auth' as a batch store: ")
    assert "cannot connect to the PostgreSQL server" in message
    assert cause in message
    everything = "".join(traceback.format_exception(raised[0]))  # the chained driver errors included
    assert WRONG_PASSWORD not in everything and PASSWORD not in everything
    assert repr(db).startswith("<SerializedSqliteDatabase: no store open")


def test_the_right_password_opens_the_store(server: PrivateServer) -> None:
    url = f"{server.url(user=PASSWORD_ROLE, password=PASSWORD)}?schema=faults_password"
    dcache.open_db(url, timeout=TIMEOUT_S)
    try:
        dcache.create_batch_job(make_job("job-1"))
        assert dcache.batch_job("job-1") is not None
        assert PASSWORD not in repr(db)
        assert _rows(server, url, "SELECT id FROM batch_job") == [("job-1",)]
    finally:
        dcache.close_db()


# -- The pool exhausted; a session terminated in the middle of a call -------------------------------------


@pytest.mark.slow
def test_exhausted_pool_names_the_option_and_a_freed_connection_serves(server: PrivateServer) -> None:
    url = f"{server.url()}?schema=faults_pool"
    dcache.open_db(url, max_connections=2, timeout=1)
    db.connect()  # this thread holds one of the two connections, until db.close()
    holding, release = threading.Event(), threading.Event()
    outcomes: list[BaseException | None] = []

    def holder() -> None:
        with db.atomic():  # the other one, until the transaction ends
            dcache.batch_job("x")
            holding.set()
            release.wait(timeout=LIVENESS_S)

    def call() -> None:
        try:
            dcache.batch_job("x")
            outcomes.append(None)
        except BaseException as exc:
            outcomes.append(exc)

    try:
        held = threading.Thread(target=holder)
        held.start()
        assert holding.wait(timeout=LIVENESS_S)
        for _ in range(2):  # the pool is empty, then a connection comes back when its transaction ends
            third = threading.Thread(target=call)
            third.start()
            third.join(timeout=LIVENESS_S)
            release.set()
            held.join(timeout=LIVENESS_S)
    finally:
        release.set()
        dcache.close_db()
    assert isinstance(outcomes[0], dcache.StoreUnavailable)
    assert str(outcomes[0]) == (
        f"database: all 2 pooled connections to {url!r} stayed in use for 1 s, each by a call or a "
        "transaction; raise open_db(max_connections=) above 2 for this process's concurrent calls, or "
        "shorten its transactions"
    )
    assert outcomes[1] is None


def _backend_waiting_on_a_lock(server: PrivateServer) -> int | None:
    with server.admin() as admin:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
            (server.database,),
        ).fetchone()
    return None if row is None else int(str(row[0]))


def test_session_terminated_mid_call_is_store_unavailable_and_the_next_call_works(
    server: PrivateServer,
) -> None:
    url = f"{server.url()}?schema=faults_terminate"
    dcache.open_db(url, timeout=LIVENESS_S)  # the call waits on the lock until its session is ended
    dcache.create_batch_job(make_job("job-1", status="running"), make_targets(3))
    outcomes: list[BaseException | None] = []
    failed, again = threading.Event(), threading.Event()

    def writer() -> None:
        for _ in range(2):  # one thread: its first call is cut off, its second must work
            try:
                dcache.update_batch_target("job-1", 0, "done", result="abc", now=5)
                outcomes.append(None)
            except BaseException as exc:
                outcomes.append(exc)
            failed.set()
            again.wait(timeout=LIVENESS_S)

    try:
        with server.admin() as admin:
            admin.execute("SET search_path = faults_terminate")
            with admin.transaction():
                admin.execute("SELECT 1 FROM batch_job WHERE id = 'job-1' FOR UPDATE")
                thread = threading.Thread(target=writer)
                thread.start()
                _wait_until(
                    "the write waiting on the job's lock",
                    lambda: _backend_waiting_on_a_lock(server) is not None,
                )
                pid = _backend_waiting_on_a_lock(server)
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                assert failed.wait(timeout=LIVENESS_S)
            again.set()  # the lock is released: the same thread calls again
            thread.join(timeout=LIVENESS_S)
        assert len(outcomes) == 2 and outcomes[1] is None, outcomes
        assert type(outcomes[0]) is dcache.StoreUnavailable
        assert getattr(outcomes[0].__cause__, "sqlstate", None) == "57P01"
        assert "the next call reconnects" in str(outcomes[0])
        assert _rows(server, url, "SELECT targets_done, nbytes FROM batch_job") == [(1, 3)]
    finally:
        again.set()
        dcache.close_db()


def test_session_terminated_inside_the_callers_transaction(server: PrivateServer, target: str) -> None:
    dcache.create_batch_job(make_job("job-1", status="running"), make_targets(3))
    before = _snapshot(server, target)
    with pytest.raises(dcache.StoreUnavailable, match="the next call reconnects") as info, db.atomic():
        dcache.update_batch_target("job-1", 0, "done", result="abc", now=5)
        dcache.update_batch_target("job-1", 1, "failed", result="de", error="x", now=5)
        (pid,) = db.execute_sql("SELECT pg_backend_pid()").fetchone()
        with server.admin() as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        dcache.update_batch_target("job-1", 2, "done", result="f", now=5)
    assert getattr(info.value.__cause__, "sqlstate", None) == "57P01"  # the write's error, not the rollback's
    assert not db.in_transaction()
    assert _snapshot(server, target) == before
    dcache.update_batch_target("job-1", 2, "done", result="f", now=6)  # the same thread, reconnected
    assert _rows(server, target, "SELECT targets_done, nbytes FROM batch_job") == [(1, 1)]
