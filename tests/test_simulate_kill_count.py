"""``sift simulate --hosts``' count of the claimed targets the killed host held, on PostgreSQL: a result write
the host sent before it was frozen, still waiting in the server, lands after the kill, so its targets are
not counted held (no survivor requeues them)."""

from __future__ import annotations

import multiprocessing.connection
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from conftest import POSTGRES_URL
from helpers import SPAWN, make_job, make_targets

from sift import dcache
from sift.cli.simulation.coordinator import _Coordinated, _kill_holding, host_target

#: The killed host's connections' application_name, and its one runner's name.
HOST_NAME = "sim-kill-count-host-1"
RUNNER = f"{HOST_NAME}-0"
#: How long a step may take before the test fails naming what did not happen (a hang, not a timing).
DEADLINE_S = 60.0


def write_results(target: str, job_id: str, idxs: list[int]) -> None:
    """The host's runner: the results of ``idxs`` in one ``update_batch_targets`` call, under its name."""
    dcache.open_db(target, timeout=2 * DEADLINE_S)  # its lock wait outlasts the test's hold of the job
    results = [{"idx": idx, "status": "done", "result": f"page {idx}"} for idx in idxs]
    dcache.update_batch_targets(job_id, results, runner=RUNNER)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S:g} s"
        time.sleep(0.01)


def connections(where: str) -> int:
    """The server's connections of the killed host's name that meet ``where`` (SQL)."""
    sql = f"SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND {where}"
    return int(dcache.db.execute_sql(sql, (HOST_NAME,)).fetchone()[0])


@pytest.mark.slow
@pytest.mark.postgres
def test_a_write_sent_before_the_freeze_is_not_counted_held(pg_target: str, tmp_path: Path) -> None:
    """The host claimed targets 0, 1 and 2 and sent the write of 0 and 1, which waits in the server for the
    job's row (the test holds its lock) when the coordinator freezes and kills the host. Released once the
    host is dead, the write lands: the host held target 2 alone."""
    dcache.open_db(pg_target)
    dcache.create_batch_job(make_job("job-1", targets_total=3), make_targets(3))
    assert len(dcache.claim_batch_targets(3, runner=RUNNER)) == 3
    schema = pg_target.rpartition("schema=")[2]
    held: list[int | None] = []
    with psycopg.connect(POSTGRES_URL, options=f"-c search_path={schema}") as job_lock:
        job_lock.execute("SELECT id FROM batch_job WHERE id = 'job-1' FOR UPDATE")
        ours, theirs = SPAWN.Pipe()
        process = SPAWN.Process(
            target=write_results, args=(host_target(pg_target, HOST_NAME), "job-1", [0, 1]), daemon=True
        )
        process.start()
        theirs.close()
        try:
            wait_for(lambda: connections("wait_event_type = 'Lock'") == 1, "write waiting on the job's lock")
            victim = _Coordinated(1, process, ours, str(tmp_path / "host-1.jsonl"), HOST_NAME)
            killer = threading.Thread(
                target=lambda: held.append(_kill_holding(victim, [RUNNER], must_hold=True)), daemon=True
            )
            killer.start()
            dead = multiprocessing.connection.wait([process.sentinel], DEADLINE_S)
            assert dead, f"the host was not killed within {DEADLINE_S:g} s"
            job_lock.rollback()
            killer.join(DEADLINE_S)
            assert not killer.is_alive(), f"the count did not end within {DEADLINE_S:g} s"
        finally:
            if process.is_alive():
                process.kill()
                process.join()
    wait_for(lambda: connections("true") == 0, "end of the killed host's connections")
    rows = dcache.db.execute_sql("SELECT idx, status, runner FROM batch_target ORDER BY idx").fetchall()
    assert [tuple(row) for row in rows] == [(0, "done", RUNNER), (1, "done", RUNNER), (2, "running", RUNNER)]
    assert held == [1]
