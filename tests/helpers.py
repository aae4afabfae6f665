"""Shared test helpers: job and target factories, and a full snapshot of the store's tables."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import signal
import sqlite3
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sift import dcache, testing
from sift.dcache import BatchJob, BatchTarget, claimorder, claims, client, db, load, manager, retries
from sift.dcache.backends.sqlite.transactions import DirectWrite
from sift.dcache.statements import Statement


def make_job(job_id: str = "job-1", **fields: Any) -> BatchJob:
    """An unsaved job of three targets at time 1,000 (the tests' fixed clock); ``fields`` override any
    column."""
    values: dict[str, Any] = {"caller": "alice", "targets_total": 3, "created_at": 1_000, "lease": 1_000}
    return testing.make_job(**{**values, "id": job_id, **fields})


def make_targets(count: int, start: int = 0, **fields: Any) -> list[BatchTarget]:
    """Unsaved targets ``start..start+count-1``, as :func:`make_target` makes them."""
    return [make_target(i, **fields) for i in range(start, start + count)]


#: update_batch_target's signature: that function, or the same write made through update_batch_targets.
TargetWriter = Callable[..., None]


def write_in_bulk(job_id: str, idx: int, status: str, *, now: int | None = None, **fields: Any) -> None:
    """update_batch_target's call, made as update_batch_targets of that one target."""
    assert dcache.update_batch_targets(job_id, [{"idx": idx, "status": status, **fields}], now=now) == 1


class ListedKeys(Mapping[str, Any]):
    """A mapping whose ``keys()`` is a list, as some hand-written mappings' is: entries of the batch calls
    are read through the mapping's own iteration, never a set operation on its keys."""

    def __init__(self, **items: Any) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def keys(self) -> list[str]:  # type: ignore[override]
        return list(self._items)


def snapshot() -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table in the open store, in a stable order: compare before and after."""
    tables = db.get_tables()
    return {t: sorted(db.execute_sql(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}


def make_target(idx: int = 0, **fields: Any) -> BatchTarget:
    """One unsaved target at ``idx`` with no status (the store's functions set it); ``fields`` override url,
    options or any other column."""
    values: dict[str, Any] = {"idx": idx, "url": f"https://example.com/{idx}", "options": '{"render":false}'}
    values.update(fields)
    return BatchTarget(**values)


@contextmanager
def session() -> Iterator[None]:
    """Peewee's session calls as a request's hooks make them: start, then commit, or roll back on error."""
    db.session_start()
    try:
        yield
    except BaseException:
        db.session_rollback()
        raise
    db.session_commit()


#: multiprocessing's 'spawn' context: each process imports the package afresh and opens its own store.
SPAWN = multiprocessing.get_context("spawn")


def run_processes(
    worker: Callable[..., dict[str, Any]], args: list[tuple[Any, ...]], timeout: float = 300.0
) -> list[dict[str, Any]]:
    """Run ``worker(*args[i], barrier)`` in one spawned process per entry, all released at once by the
    barrier; return what each returned (an exception it raised becomes ``{"errors": [...]}``)."""
    barrier = SPAWN.Barrier(len(args))
    results = SPAWN.Queue()
    processes = [SPAWN.Process(target=_process_entry, args=(worker, a, barrier, results)) for a in args]
    for process in processes:
        process.start()
    try:
        reports = [results.get(timeout=timeout) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert [process.exitcode for process in processes] == [0] * len(processes)
    return reports


def killed_after_it_reports(worker: Callable[[str, Any], None], target: str) -> Any:
    """Run ``worker(target, queue)`` in a spawned process that puts what it claimed, then its pid, and
    hangs; kill it with SIGKILL once both are in and return what it claimed."""
    ready = SPAWN.Queue()
    process = SPAWN.Process(target=worker, args=(target, ready))
    process.start()
    try:
        claimed = ready.get(timeout=120)
        pid = ready.get(timeout=120)
    finally:
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=30)
    assert pid == process.pid and process.exitcode == -signal.SIGKILL
    return claimed


def _process_entry(
    worker: Callable[..., dict[str, Any]], args: tuple[Any, ...], barrier: Any, results: Any
) -> None:
    try:
        out = worker(*args, barrier)
    except BaseException as exc:  # reported, so the test names it instead of timing out
        out = {"errors": [f"{type(exc).__name__}: {exc}"]}
    results.put(out)


def job_with_bytes(job_id: str, nbytes: int, **fields: Any) -> None:
    """A job holding ``nbytes`` real result bytes in its target 0 (so nbytes follows rule 4), stored with
    all its targets (``targets_total``, default 2); its status (default done) and lease (default 1,000) are
    set as given after the write, which ran at that lease. ``fields`` override any other column."""
    status = fields.pop("status", "done")
    lease = fields.pop("lease", 1_000)
    total = fields.pop("targets_total", 2)
    dcache.create_batch_job(make_job(job_id, targets_total=total, lease=lease, **fields), make_targets(total))
    if nbytes:
        dcache.update_batch_target(job_id, 0, "done", result="x" * nbytes, now=lease)
    dcache.set_batch_job_status(job_id, status, now=lease)


def stored_job(
    job: BatchJob, targets: list[BatchTarget] | None = None, *, nbytes: int = 0, targets_done: int = 0
) -> None:
    """``create_batch_job(job, targets)``, then the job's ``nbytes`` and ``targets_done`` set by plain SQL:
    counts that no target backs, as a damaged or restored store could hold (``create_batch_job`` refuses
    them, since they follow the targets). The store's triggers keep the byte total in step; the lease and
    every other column stay as stored. For where real results cannot hold the count (a job of no target,
    2**62 bytes) or the test is about a count as stored; :func:`job_with_bytes` makes real bytes."""
    dcache.create_batch_job(job, targets)
    if nbytes or targets_done:
        mark = db.param  # "?" on SQLite, "%s" on PostgreSQL
        with db.write():
            db.execute_sql(
                f"UPDATE batch_job SET nbytes = {mark}, targets_done = {mark} WHERE id = {mark}",
                (nbytes, targets_done, job.id),
            )


def create_partial(job: BatchJob, targets: list[BatchTarget]) -> None:
    """The two-call path: ``job`` alone, then ``targets``, fewer than its ``targets_total`` (a
    ``create_batch_job`` given targets must give all of them)."""
    dcache.create_batch_job(job)
    dcache.put_batch_targets(job.id, targets)


#: The modules whose compiled statements are the store's rules (and its reads of who waits, ``load``;
#: the client's calls, ``client``).
RULE_MODULES = (manager, claims, claimorder, load, client, retries)


def rule_statements() -> dict[str, Statement]:
    """Every compiled statement of the rules' modules, by name."""
    return {
        name: value
        for module in RULE_MODULES
        for name, value in vars(module).items()
        if isinstance(value, Statement)
    }


def count_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the store's functions run from now on, by its SQL: the compiled ones run by name, and
    what a hot path's write transaction sends itself (a claim's walk), but for its BEGIN and COMMIT."""
    seen: list[str] = []
    for name in ("rows", "run", "scalar"):
        original = getattr(Statement, name)

        def counted(self: Statement, original: Any = original, **values: Any) -> Any:
            seen.append(self.sql)
            return original(self, **values)

        monkeypatch.setattr(Statement, name, counted)
    enter = DirectWrite.__enter__

    def counting(self: DirectWrite) -> Any:
        execute = enter(self)

        def counted(sql: str, params: Any = ()) -> Any:
            seen.append(sql)
            return execute(sql, params)

        return counted

    monkeypatch.setattr(DirectWrite, "__enter__", counting)
    return seen


def count_round_trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """PostgreSQL: every statement sent to the server from now on, one a round trip."""
    import psycopg

    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    return sent


def claim_buffers() -> int:
    """PostgreSQL: the shared buffers ``claim_batch_targets(10, runner="r", now=5)`` reads (hit or read),
    its function's nested statements included, planning left out: EXPLAIN (ANALYZE, BUFFERS) of the call,
    rolled back; the third of three, once the session has compiled the function and cached its plans."""
    sql = (
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM sift_claim_batch(10, 10, NULL, TRUE, "
        "ARRAY[]::text[], ARRAY[]::bigint[], 'r', 5, 5000, 100)"
    )
    blocks = 0
    for _ in range(3):
        with db.atomic() as transaction:
            plan = db.execute_sql(sql).fetchone()[0]
            transaction.rollback()
        node = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
        blocks = int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])
    return blocks


def one_of_two_targets_waiting() -> None:
    """Job ``job-1`` of two targets, both claimed by ``r1``; target 1 retried, waiting until 500."""
    dcache.create_batch_job(make_job("job-1", targets_total=2), make_targets(2))
    assert len(dcache.claim_batch_targets(2, runner="r1", now=50)) == 2
    dcache.retry_batch_target("job-1", 1, runner="r1", error="503", not_before=500, now=60)


def assert_target_still_waits() -> None:
    """What :func:`one_of_two_targets_waiting` wrote holds in the open store: target 1 is pending with its
    error, unclaimable before 500 and claimed at 500, and the store checks clean."""
    waiting = dcache.db.execute_sql("SELECT idx, status, error, not_before FROM batch_target WHERE idx = 1")
    assert waiting.fetchall() == [(1, "pending", "503", 500)]
    assert dcache.claim_batch_targets(5, runner="r2", now=499) == []
    assert [t.idx for t in dcache.claim_batch_targets(5, runner="r2", now=500)] == [1]
    assert dcache.check_store().ok


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` imported as the module ``name``, registered in ``sys.modules`` (its
    dataclasses need their module registered)."""
    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_on_file(path: Path, *statements: str) -> None:
    """Run ``statements`` on the SQLite file at ``path`` as another program would, and commit."""
    with closing(sqlite3.connect(path)) as conn:
        for statement in statements:
            conn.execute(statement)
        conn.commit()


#: Two sites written seven ways: 127.0.0.1 five, exämple.com two (in Unicode and in punycode).
SITE_SPELLINGS = [
    "http://127.0.0.1/",
    "http://2130706433/",
    "http://0x7f000001/",
    "http://127.1/",
    "http://[::ffff:127.0.0.1]/",
    "https://exämple.com/",
    "https://xn--exmple-cua.com/",
]


def refuse_each(cases: Iterable[tuple[str, Callable[[], object], str]]) -> None:
    """Each ``(name, call, field)`` in turn: the call raises InvalidBatchInput naming ``field`` and leaves the
    store as it was, so the next meets the store the test made."""
    before = snapshot()
    for name, call, field in cases:
        try:
            call()
        except dcache.InvalidBatchInput as exc:
            assert exc.field == field, f"{name}: {exc}"
        else:
            pytest.fail(f"{name}: raised nothing")
        assert snapshot() == before, name
