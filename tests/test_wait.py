"""``wait_for_batch_job``: a wait ends when its job is final (or, with ``since``, moved on), woken by the
write itself, from this process or another; at its timeout it returns the job as it is; it never writes."""

from __future__ import annotations

import asyncio
import functools
import math
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import POSTGRES_URL, open_empty_postgres, postgres_target
from helpers import SPAWN, make_job, make_targets, snapshot

from sift import dcache
from sift.dcache import aio, db
from sift.dcache.backends.sqlite import changes as sqlite_changes

# A wait that is never woken ends only at its timeout: these tests give it an hour, and then look whether it
# ended (a join's generous limit says "it was never woken", not how fast it was).
NEVER = 3600.0
ENDED = 120.0


def two_target_job(job_id: str = "j") -> None:
    dcache.create_batch_job(make_job(job_id, targets_total=2), make_targets(2))


def waited(job_id: str, count: int = 1) -> None:
    """Block until ``count`` waits for ``job_id`` are registered in this process, and its feed is armed."""
    waiters = db.backend.job_waiters()
    for _ in range(int(ENDED / 0.01)):
        if len(_wakers(waiters, job_id)) >= count:
            probe = threading.Event()
            waiters.add("probe", probe)  # returns once the feed is armed
            waiters.remove("probe", probe)
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{count} waits for {job_id!r} never started")


def _wakers(waiters: Any, job_id: str) -> set[Any]:
    with waiters._lock:
        return set(waiters._wakers.get(job_id, ()))


class Waiting:
    """A wait in a thread of its own."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,))
        self.thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self.result = call()
        except BaseException as exc:
            self.error = exc

    def ended(self) -> Any:
        self.thread.join(ENDED)
        assert not self.thread.is_alive(), "the wait was never woken"
        if self.error is not None:
            raise self.error
        return self.result


def finish(job_id: str = "j") -> None:
    dcache.update_batch_targets(
        job_id, [{"idx": 0, "status": "done", "result": "a"}, {"idx": 1, "status": "failed", "error": "404"}]
    )
    dcache.finish_batch_job(job_id)


def test_a_final_job_is_returned_as_it_is(store: Any) -> None:
    two_target_job()
    finish()
    job = dcache.wait_for_batch_job("j", timeout=NEVER)
    assert job is not None and (job.status, job.targets_done) == ("partial", 2)


def test_an_unknown_job_is_none(store: Any) -> None:
    assert dcache.wait_for_batch_job("nope", timeout=NEVER) is None


def test_at_its_timeout_a_wait_returns_the_job_as_it_is(store: Any) -> None:
    two_target_job()
    job = dcache.wait_for_batch_job("j", timeout=0.05)
    assert job is not None and (job.status, job.targets_done) == ("queued", 0)
    assert db.backend.job_waiters().job_ids() == []  # the wait let go of its registration


def test_a_wait_ends_when_another_thread_finishes_the_job(store: Any) -> None:
    two_target_job()
    wait = Waiting(lambda: dcache.wait_for_batch_job("j", timeout=NEVER))
    waited("j")
    dcache.update_batch_targets(
        "j", [{"idx": 0, "status": "done", "result": "a"}]
    )  # not final yet: the wait goes on
    finish()
    job = wait.ended()
    assert job is not None and job.status == "partial"


def test_a_write_of_this_process_wakes_the_feed_at_once(
    file_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the feed would look again only in an hour: this process's own commit makes it look now
    monkeypatch.setattr(sqlite_changes, "POLL_SECONDS", NEVER)
    two_target_job()
    wait = Waiting(lambda: dcache.wait_for_batch_job("j", timeout=NEVER))
    waited("j")
    finish()
    job = wait.ended()
    assert job is not None and job.status == "partial"


def test_since_ends_the_wait_at_the_next_counted_target(store: Any) -> None:
    two_target_job()
    first = dcache.batch_job("j")
    wait = Waiting(lambda: dcache.wait_for_batch_job("j", timeout=NEVER, since=first))
    waited("j")
    dcache.update_batch_target("j", 0, "done", result="a")
    job = wait.ended()
    assert job is not None and (job.status, job.targets_done) == ("queued", 1)


def test_since_an_older_read_returns_at_once(store: Any) -> None:
    two_target_job()
    first = dcache.batch_job("j")
    dcache.update_batch_target("j", 0, "done", result="a")
    job = dcache.wait_for_batch_job("j", timeout=NEVER, since=first)
    assert job is not None and job.targets_done == 1


def test_other_jobs_writes_do_not_end_a_wait(store: Any) -> None:
    two_target_job("j")
    two_target_job("other")
    wait = Waiting(lambda: dcache.wait_for_batch_job("j", timeout=NEVER))
    waited("j")
    finish("other")
    wait.thread.join(0.3)
    assert wait.thread.is_alive()
    finish("j")
    assert wait.ended().status == "partial"


def test_a_cancel_ends_a_wait(store: Any) -> None:
    two_target_job()
    wait = Waiting(lambda: dcache.wait_for_batch_job("j", timeout=NEVER))
    waited("j")
    assert dcache.cancel_batch_job("j", reason="stop")
    assert wait.ended().status == "cancelled"


def test_many_waits_for_one_job_all_end(store: Any) -> None:
    two_target_job()
    waits = [Waiting(lambda: dcache.wait_for_batch_job("j", timeout=NEVER)) for _ in range(20)]
    waited("j", 20)
    finish()
    assert {w.ended().status for w in waits} == {"partial"}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"job_id": 5, "timeout": 1}, "job_id"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": math.nan}, "timeout"),
        ({"timeout": math.inf}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"timeout": "1"}, "timeout"),
        ({"timeout": dcache.MAX_WAIT_SECONDS + 1}, "timeout"),
        ({"timeout": 1, "since": "j"}, "since"),
        ({"timeout": 1, "since": make_job("other")}, "since"),
    ],
)
def test_bad_arguments_name_their_field(store: Any, kwargs: dict[str, Any], field: str) -> None:
    two_target_job()
    before = snapshot()
    for wait in (dcache.wait_for_batch_job, lambda *a, **k: asyncio.run(aio.wait_for_batch_job(*a, **k))):
        with pytest.raises(dcache.InvalidBatchInput) as caught:
            wait(**{"job_id": "j", **kwargs})
        assert caught.value.field == field
    assert snapshot() == before


def test_the_asyncio_wait_serves_many_waits_from_one_loop(store: Any) -> None:
    two_target_job()

    found: list[list[tuple[int, str]]] = []
    postgres = str(db.backend.path).startswith("postgresql")

    async def main() -> list[Any]:
        tasks = [asyncio.create_task(aio.wait_for_batch_job("j", timeout=NEVER)) for _ in range(200)]
        await asyncio.to_thread(waited, "j", 200)
        if postgres:
            found.append(await asyncio.to_thread(listeners))  # 200 waits, one listening connection
        await asyncio.to_thread(finish)
        return await asyncio.wait_for(asyncio.gather(*tasks), ENDED)

    jobs = asyncio.run(main())
    assert len(found) == (1 if postgres else 0)
    for rows in found:  # one listening connection, however many waits
        assert [query for _, query in rows] == ["LISTEN sift_batch_job"]
    assert len(jobs) == 200 and {job.status for job in jobs} == {"partial"}
    assert db.backend.job_waiters().job_ids() == []


def test_the_asyncio_wait_returns_at_its_timeout_and_for_an_unknown_job(store: Any) -> None:
    two_target_job()
    job = asyncio.run(aio.wait_for_batch_job("j", timeout=0.05))
    assert job is not None and job.status == "queued"
    assert asyncio.run(aio.wait_for_batch_job("nope", timeout=NEVER)) is None


def test_a_cancelled_asyncio_wait_lets_go(store: Any) -> None:
    two_target_job()

    async def main() -> None:
        task = asyncio.create_task(aio.wait_for_batch_job("j", timeout=NEVER))
        await asyncio.to_thread(waited, "j")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert db.backend.job_waiters().job_ids() == []


def test_closing_the_store_ends_the_waits(store: Any) -> None:
    two_target_job()
    wait = Waiting(lambda: dcache.wait_for_batch_job("j", timeout=NEVER))
    waited("j")
    dcache.close_db()
    with pytest.raises(dcache.BatchError):
        wait.ended()


def _finish_elsewhere(target: str, job_id: str, go: Any) -> None:
    dcache.open_db(target)
    assert go.wait(ENDED)
    finish(job_id)
    dcache.close_db()


@pytest.mark.parametrize("readonly", [False, True], ids=["read-write", "read-only"])
def test_a_write_by_another_process_ends_the_wait(shared_store: str, readonly: bool) -> None:
    """Another process's write ends the wait, on a store open read-only too."""
    two_target_job()
    if readonly:
        dcache.open_db(shared_store, readonly=True)
    go = SPAWN.Event()
    writer = SPAWN.Process(target=_finish_elsewhere, args=(shared_store, "j", go))
    writer.start()
    try:
        wait = Waiting(lambda: dcache.wait_for_batch_job("j", timeout=NEVER))
        waited("j")
        go.set()
        job = wait.ended()
    finally:
        writer.join(ENDED)
    assert writer.exitcode == 0
    assert job is not None and (job.status, job.targets_done) == ("partial", 2)


@pytest.fixture
def pg_store(postgres_schema: str) -> Iterator[str]:
    """The worker's PostgreSQL schema, open and empty."""
    open_empty_postgres(postgres_schema)
    yield postgres_target(postgres_schema)
    dcache.close_db()


def listeners() -> list[tuple[int, str]]:
    rows = db.execute_sql(
        "SELECT pid, query FROM pg_stat_activity WHERE application_name = %s",
        (f"sift listener (pid {os.getpid()})",),
    ).fetchall()
    return [(int(pid), str(query)) for pid, query in rows]


@pytest.mark.postgres
def test_postgres_waits_share_one_listening_connection(pg_store: str) -> None:
    for job_id in ("a", "b"):
        two_target_job(job_id)
    waits = [Waiting(functools.partial(dcache.wait_for_batch_job, j, timeout=NEVER)) for j in "ab" * 20]
    waited("a", 20)
    waited("b", 20)
    found = listeners()
    assert len(found) == 1 and found[0][1] == "LISTEN sift_batch_job"
    finish("a")
    finish("b")
    assert {w.ended().status for w in waits} == {"partial"}


@pytest.mark.postgres
def test_a_lost_listening_connection_is_made_again(pg_store: str) -> None:
    two_target_job()
    wait = Waiting(lambda: dcache.wait_for_batch_job("j", timeout=NEVER))
    waited("j")
    [(pid, _)] = listeners()
    db.execute_sql("SELECT pg_terminate_backend(%s)", (pid,))
    for _ in range(int(ENDED / 0.05)):
        found = listeners()
        if found and found[0][0] != pid and found[0][1].startswith("LISTEN"):
            break
        threading.Event().wait(0.05)
    else:
        raise AssertionError("no new listening connection")
    assert wait.thread.is_alive()  # woken to read again, and still waiting
    finish()
    assert wait.ended().status == "partial"


@pytest.mark.postgres
def test_a_write_of_the_original_service_ends_the_wait(pg_store: str, postgres_schema: str) -> None:
    """A program that writes the tables with its own SQL still announces the change (a trigger does)."""
    import psycopg

    two_target_job()
    wait = Waiting(lambda: dcache.wait_for_batch_job("j", timeout=NEVER))
    waited("j")
    with psycopg.connect(POSTGRES_URL, options=f"-c search_path={postgres_schema}", autocommit=True) as conn:
        conn.execute("UPDATE batch_job SET status = 'cancelled' WHERE id = 'j'")
    assert wait.ended().status == "cancelled"
