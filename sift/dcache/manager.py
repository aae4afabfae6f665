"""The batch store's rules: one short function per rule, each one transaction.

Every rule is conditional SQL built with Peewee (``UPDATE … WHERE`` with rowcounts, ``SUM``,
``ORDER BY … LIMIT``) and compiled once; nothing reads a row into Python to change it and write it back.
Sweep and eviction work in bounded chunks, one transaction each, so no transaction holds the shared
connection for long; each call still removes everything due before it returns.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NoReturn

import peewee

from . import driver_errors, space, validation
from .clock import unix_now
from .counters import counters
from .database import db, retried, run_retried
from .errors import (
    ClaimLost,
    DuplicateJob,
    InvalidBatchInput,
    JobNotFound,
    StoreConflict,
    TargetNotFound,
)
from .hosts import url_host
from .models import (
    FINAL_TARGET_STATUSES,
    FINISHED_JOB_STATUSES,
    IDEM_JOB_STATUSES,
    JOB_COLUMNS,
    LIVE_JOB_STATUSES,
    TARGET_COLUMNS,
    BatchJob,
    BatchTarget,
    JobStatus,
    target_host,
)
from .space import TRANSACTIONS_PER_CHECKPOINT
from .statements import Slot, Statement, literal
from .validation import Duration

J = BatchJob
T = BatchTarget
#: Values written into the SQL as literals, not bound: SQLite matches a partial index only so.
Inline = peewee.ValueLiterals

#: Roughly how many rows one sweep or eviction transaction deletes (a job and its targets count
#: together; a single job larger than this is still deleted whole, in one transaction).
ROWS_PER_TRANSACTION = 500
#: How many candidate jobs one sweep or eviction transaction looks at.
JOBS_PER_TRANSACTION = 256
#: Targets read from the caller's iterable and checked before each statement that inserts them.
TARGETS_PER_STATEMENT = 1000


def _target_value(expr: peewee.Node) -> peewee.Node:
    """``expr`` evaluated on the target (job_id, idx) named by the call."""
    return T.select(expr).where((T.job_id == Slot("job_id")) & (T.idx == Slot("idx")))


_INSERT_JOB = Statement(lambda: J.insert({getattr(J, name): Slot(name) for name in JOB_COLUMNS}))
# Invalid JSON options become NULL, which the NOT NULL column rejects for that very row.
_INSERT_TARGET = Statement(
    lambda: T.insert(
        {
            T.job_id: Slot("job_id"),
            T.idx: Slot("idx"),
            T.url: Slot("url"),
            T.options: db.backend.json_or_null(Slot("options")),
            T.status: Inline(peewee.Value("pending")),
            T.attempts: Inline(peewee.Value(0)),  # else Peewee binds the model's default as one more slot
            target_host(): Slot("host"),
        }
    )
)
JOB_FIELDS = [getattr(J, name) for name in JOB_COLUMNS]
#: What a read of an older store without the claims' columns (opened read-only) shows in their place.
_UNCLAIMED = {"runner": None, "heartbeat": None, "attempts": 0}


def _target_fields() -> list[peewee.Node]:
    """The target's columns as the store's reads return them; an older store opened read-only has no
    claims' columns, and its targets read as unclaimed, with no attempts."""
    if db.backend.claims_stored:
        return [getattr(T, name) for name in TARGET_COLUMNS]
    return [
        Inline(peewee.Value(_UNCLAIMED[name])).alias(name) if name in _UNCLAIMED else getattr(T, name)
        for name in TARGET_COLUMNS
    ]


_SELECT_JOB = Statement(lambda: J.select(*JOB_FIELDS).where(J.id == Slot("job_id")))
_TARGETS_TOTAL = Statement(lambda: J.select(J.targets_total).where(J.id == Slot("job_id")))
# One statement, one snapshot: no rows for an unknown job, one all-NULL row for a job without targets.
_SELECT_TARGETS = Statement(
    lambda: (
        J.select(*_target_fields())
        .join(T, peewee.JOIN.LEFT_OUTER, on=(T.job_id == J.id))
        .where(J.id == Slot("job_id"))
        .order_by(T.idx)
    )
)
# A page: one range read of the target's primary key, (job_id, idx) from ``after`` on.
_PAGE = Statement(
    lambda: (
        T.select(*_target_fields())
        .where((T.job_id == Slot("job_id")) & (T.idx > Slot("after_idx")))
        .order_by(T.idx)
        .limit(Slot("limit"))
    )
)
_IDEM = Statement(
    lambda: (
        J.select(J.id)
        .where(
            (J.caller == Slot("caller"))
            & (J.idem_key == Slot("idem_key"))
            & (J.lease > Slot("cutoff"))
            & Inline(J.status.in_(IDEM_JOB_STATUSES))
        )
        .order_by(J.created_at.desc(), db.backend.insertion_order.desc())
        .limit(literal(1))
    )
)
_LIVE = Statement(
    lambda: J.select(peewee.fn.COUNT(peewee.SQL("*"))).where(
        (J.caller == Slot("caller")) & Inline(J.status.in_(LIVE_JOB_STATUSES))
    )
)
_LIVE_TOTAL = Statement(
    lambda: J.select(peewee.fn.COUNT(peewee.SQL("*"))).where(Inline(J.status.in_(LIVE_JOB_STATUSES)))
)


#: The final statuses as plain str, for the result write's quick check.
FINAL_STATUS_VALUES = frozenset(status.value for status in FINAL_TARGET_STATUSES)
_TARGET_STATUS = Statement(lambda: _target_value(T.status))
_TARGET_RUNNER = Statement(lambda: _target_value(T.runner))
_SET_JOB_STATUS = Statement(
    lambda: J.update({J.status: Slot("status"), J.error: Slot("error"), J.lease: Slot("now")}).where(
        J.id == Slot("job_id")
    )
)
_TOUCH = Statement(lambda: J.update({J.lease: Slot("now")}).where(J.id == Slot("job_id")))


def _fail_live(where: peewee.ColumnBase | None = None) -> peewee.Node:
    """Live jobs (also matching ``where``) become failed, with the reason as their error."""
    live = Inline(J.status.in_(LIVE_JOB_STATUSES))
    return J.update(
        {
            J.status: Inline(peewee.Value(JobStatus.FAILED.value)),
            J.error: Slot("reason"),
            J.lease: Slot("now"),
        }
    ).where(live if where is None else live & where)


_MARK_FAILED = Statement(_fail_live)
_RESCUE = Statement(lambda: _fail_live(db.backend.live_lease(J.lease) <= Slot("cutoff")))


def _evictable() -> peewee.Node:
    """Jobs eviction may take: finished and holding bytes (a partial index holds exactly these). The
    statuses are ORed as in the index's definition, which a query must repeat for SQLite to use it."""
    finished = functools.reduce(operator.or_, [J.status == status for status in FINISHED_JOB_STATUSES])
    return Inline((J.nbytes > 0) & finished)


# A job a writer holds is being refreshed: sweep skips it. Eviction waits for it (see PostgreSQL's rules).
# ORDER BY lease: without it PostgreSQL's generic plan (psycopg prepares a statement run 5 times) may guess a
# third of the jobs expired and pick a sequential scan, reading every row when none is.
_ANY_EXPIRED = Statement(
    lambda: J.select(peewee.SQL("1")).where(J.lease <= Slot("cutoff")).order_by(J.lease).limit(literal(1))
)
_EXPIRED = Statement(
    lambda: db.backend.lock_rows(
        J.select(J.id, J.targets_total, J.nbytes)
        .where(J.lease <= Slot("cutoff"))
        .order_by(J.lease)
        .limit(literal(JOBS_PER_TRANSACTION)),
        skip_locked=True,
    )
)
_EVICTABLE = Statement(
    lambda: db.backend.lock_rows(
        J.select(J.id, J.targets_total, J.nbytes)
        .where(_evictable())
        .order_by(J.lease, J.created_at, J.id)
        .limit(literal(JOBS_PER_TRANSACTION))
    )
)
_SWEEP_CANDIDATES = Statement(
    lambda: J.select(*JOB_FIELDS).where(J.lease <= Slot("cutoff")).order_by(J.lease, J.created_at, J.id)
)
_EVICT_CANDIDATES = Statement(
    lambda: J.select(*JOB_FIELDS).where(_evictable()).order_by(J.lease, J.created_at, J.id)
)
_DELETE_TARGETS = Statement(lambda: T.delete().where(T.job_id == Slot("job_id")))
_DELETE_JOB = Statement(lambda: J.delete().where(J.id == Slot("job_id")))


# -- Writes --------------------------------------------------------------------------------------------


def create_batch_job(job: BatchJob, targets: Iterable[BatchTarget] | None = None) -> None:
    """Store the unsaved ``job`` as given (lease and created_at included); ``targets_done`` and ``nbytes``
    follow its targets, which are stored pending, so they must be 0 (or unset).

    With ``targets``, the job and its targets are stored in one transaction, all or nothing, and they must
    be all ``targets_total`` of them. Without, ``put_batch_targets`` adds them later.
    """
    values = _job_values(job)
    with db.write():
        put = _insert_job(values, targets)
    counters.add("jobs_created")
    counters.add("targets_put", put)


def submit_batch_job(
    job: BatchJob, targets: Iterable[BatchTarget] | None, ttl: Duration, *, now: int | None = None
) -> tuple[str, bool]:
    """The idempotent create, in one write transaction: ``(id, False)`` for the job ``batch_job_by_idem``
    finds for ``(job.caller, job.idem_key)``, writing nothing (``targets`` are not read); otherwise
    ``create_batch_job(job, targets)`` and ``(job.id, True)``. An empty key always creates. ``targets``
    may be None (they follow through ``put_batch_targets``); given, they must be all ``targets_total`` of
    the job's, and at least one."""
    values = _job_values(job)
    cutoff = validation.cutoff(validation.now(now), ttl)
    caller, idem_key = values["caller"], values["idem_key"]
    with db.write():
        if idem_key:
            db.backend.lock_key(caller, idem_key)  # one submit of this (caller, key) at a time
        found = _IDEM.scalar(caller=caller, idem_key=idem_key, cutoff=cutoff) if idem_key else None
        put = _insert_job(values, targets, whole=True) if found is None else 0
    if found is not None:
        counters.add("batch_idem_hit")
        return str(found), False
    counters.add("batch_idem_miss")
    counters.add("jobs_created")
    counters.add("targets_put", put)
    return values["id"], True


def put_batch_targets(job_id: str, targets: Iterable[BatchTarget]) -> None:
    """Store ``targets`` as pending targets of the job, all or nothing, streaming the iterable.

    Each idx must lie in ``0..targets_total-1`` and not be stored yet; ``job_id`` and ``status`` may be unset.
    """
    job_id = validation.job_id(job_id)
    with db.write():
        db.backend.lock_job(job_id)  # a sweep cannot delete the job between these statements
        total = _TARGETS_TOTAL.scalar(job_id=job_id)
        if total is None:
            _write_miss(JobNotFound(job_id))
        put = _insert_targets(job_id, total, targets)
    counters.add("targets_put", put)


#: One target's write, checked: (idx, status, final, size, result, error, hint); ``final`` is 1 or 0, an int,
#: which sqlite3 binds as it is (a bool goes through its adaptation first).
TargetWrite = tuple[int, str, int, int, str | None, str | None, str | None]
#: The keys of one entry of update_batch_targets' results.
_TARGET_WRITE_FIELDS = ("idx", "status", "result", "error", "hint")
TARGET_WRITE_KEYS = frozenset(_TARGET_WRITE_FIELDS)


def update_batch_target(
    job_id: str,
    idx: int,
    status: str,
    *,
    result: str | None = None,
    error: str | None = None,
    hint: str | None = None,
    runner: str | None = None,
    now: int | None = None,
) -> None:
    """Write a target's status, result, error and hint as given, and set the job's lease to ``now``.

    The job's targets_done counts each target once, on its first move into done/failed; its nbytes
    follows the UTF-8 size of the stored results. A finished target cannot go back to pending/running.
    With ``runner``, the write is the runner's: it is refused with ``ClaimLost`` (writing nothing) unless
    that runner holds the target's claim, so a late write after a requeue never lands or counts twice.
    """
    # The usual write (a plain ASCII id, an ASCII result without error or hint) passes each check in one
    # expression; anything else is checked in full, in the same order, so the same field is named.
    if type(job_id) is not str or not job_id or not job_id.isascii() or "\x00" in job_id:
        job_id = validation.job_id(job_id)
    write = _quick_write(idx, status, result, error, hint) or _target_write(idx, status, result, error, hint)
    if runner is not None:
        runner = validation.optional_key("runner", runner)
    if now is None:
        now = unix_now()
    elif type(now) is not int or not 0 <= now <= validation.MAX_INT:
        now = validation.count("now", now)  # which refuses it
    writes = (write,)
    try:  # what @retried and _write_targets do, written out: the hot path spares two calls
        if not db.backend.write_targets(job_id, writes, runner, now):
            _write_in_transaction(job_id, writes, runner, now)
    except StoreConflict as conflict:
        db.backend.retry(conflict, lambda: _write_targets(job_id, writes, runner, now))
    counters.add("target_writes")


def update_batch_targets(
    job_id: str, results: Iterable[Any], *, runner: str | None = None, now: int | None = None
) -> int:
    """Write many targets of one job in one transaction, each exactly as ``update_batch_target`` would, in
    the order given; ``results`` holds mappings of its arguments (``idx``, ``status``, and optionally
    ``result``, ``error``, ``hint``). Any bad entry, missing target or lost claim (``ClaimLost``, with
    ``runner``) refuses the whole call, writing nothing. Returns how many targets were written."""
    if type(job_id) is not str or not job_id or not job_id.isascii() or "\x00" in job_id:
        job_id = validation.job_id(job_id)  # as update_batch_target checks it
    # a list, the usual call, is an Iterable: the ABC's check is spared
    if type(results) is not list and (isinstance(results, (str, bytes)) or not isinstance(results, Iterable)):
        validation.invalid("results", f"must be an iterable of mappings, got {type(results).__name__}")
    writes = [_target_write_of(i, entry) for i, entry in enumerate(results)]
    runner = validation.optional_key("runner", runner)
    now = validation.now(now)
    if not writes:
        return 0
    run_retried(lambda: _write_targets(job_id, writes, runner, now))  # results are read once, above
    counters.add("target_writes", len(writes))
    return len(writes)


def _quick_write(idx: Any, status: Any, result: Any, error: Any, hint: Any) -> TargetWrite | None:
    """The usual write, a runner's ASCII result, checked in one expression: what ``_target_write`` returns
    for it; None for any other write, which ``_target_write`` checks in full."""
    if (
        type(idx) is int
        and 0 <= idx <= validation.MAX_INT
        and type(status) is str
        and status in FINAL_STATUS_VALUES
        and type(result) is str
        and result.isascii()
        and len(result) <= validation.MAX_RESULT_BYTES
        and "\x00" not in result
        and error is None
        and hint is None
    ):
        return idx, status, 1, len(result), result, None, None
    return None


def _target_write(idx: Any, status: Any, result: Any, error: Any, hint: Any) -> TargetWrite:
    """One target's write, checked: what update_batch_target and update_batch_targets refuse alike."""
    idx = validation.count("idx", idx)
    status = validation.target_status(status)
    final = int(status in FINAL_TARGET_STATUSES)
    if not final and (result is not None or error is not None or hint is not None):
        field = "result" if result is not None else "error" if error is not None else "hint"
        validation.invalid(field, f"may only be given with status done or failed, not {status}")
    size = 0 if result is None else validation.utf8_size("result", result)
    if size > validation.MAX_RESULT_BYTES:
        validation.invalid(
            "result", f"must be at most {validation.MAX_RESULT_BYTES} bytes of UTF-8, got {size}"
        )
    error = validation.optional_message("error", error)
    hint = validation.optional_message("hint", hint)
    return idx, status, final, size, result, error, hint


def _target_write_of(position: int, entry: Any) -> TargetWrite:
    """Entry ``position`` of update_batch_targets' results, checked; a refusal names it
    (``results[3].status``)."""
    if type(entry) is dict and entry.keys() <= TARGET_WRITE_KEYS and "idx" in entry and "status" in entry:
        quick = _quick_write(
            entry["idx"], entry["status"], entry.get("result"), entry.get("error"), entry.get("hint")
        )
        if quick is not None:
            return quick
    where = f"results[{position}]"
    validation.entry(where, entry, _TARGET_WRITE_FIELDS, ("idx", "status"), "a target's write")
    try:
        return _target_write(
            entry["idx"], entry["status"], entry.get("result"), entry.get("error"), entry.get("hint")
        )
    except InvalidBatchInput as exc:
        raise InvalidBatchInput(f"{where}.{exc.field}", exc.problem) from None


def _write_targets(job_id: str, writes: Sequence[TargetWrite], runner: str | None, now: int) -> None:
    """The target writes of one call, in one write transaction, each by the per-target rule, which each
    backend's statements hold (``Transactions.write_target_run``): the job's count, bytes and lease move by
    the targets' change, then the targets are written. A write naming a target written before it in the call
    sees that write. A missing target, a move back or (with ``runner``) a claim the runner no longer holds
    writes nothing and raises; the store's reads then name which write, and why."""
    if not db.backend.write_targets(job_id, writes, runner, now):
        _write_in_transaction(job_id, writes, runner, now)


def _write_in_transaction(job_id: str, writes: Sequence[TargetWrite], runner: str | None, now: int) -> None:
    """``_write_targets`` in the call's own write transaction, a run of writes at a time."""
    backend = db.backend
    with backend.direct_write() as execute:
        for run in (writes,) if len(writes) == 1 else _runs(writes):
            if not backend.write_target_run(execute, job_id, run, runner, now):
                _explain_refusal(job_id, run, runner)


def _runs(writes: Sequence[TargetWrite]) -> Iterator[Sequence[TargetWrite]]:
    """``writes`` cut, in order, into runs that name no target twice: each run's statements read the
    targets as the runs before it left them."""
    if len({write[0] for write in writes}) == len(writes):  # the usual call: one run
        yield writes
        return
    start, seen = 0, set[int]()
    for at, write in enumerate(writes):
        if write[0] in seen:
            yield writes[start:at]
            start, seen = at, set()
        seen.add(write[0])
    yield writes[start:]


def _explain_refusal(job_id: str, run: Sequence[TargetWrite], runner: str | None) -> NoReturn:
    """Raise what refused a run of target writes, read in the call's transaction (which the backend's
    statements left as it was, locks held): the first write, in order, that the per-target rule refuses."""
    if _TARGETS_TOTAL.scalar(job_id=job_id) is None:
        _write_miss(JobNotFound(job_id))
    for idx, status, final, *_ in run:
        current = _TARGET_STATUS.scalar(job_id=job_id, idx=idx)
        if current is None:
            _write_miss(TargetNotFound(job_id, idx))
        holder = _TARGET_RUNNER.scalar(job_id=job_id, idx=idx)
        if runner is not None and holder != runner:
            counters.add("late_writes_refused")
            raise ClaimLost(job_id, idx, runner, holder)
        if not final and current in FINAL_STATUS_VALUES:
            validation.invalid("status", f"target {idx} is already {current} and cannot go back to {status}")
    # Every write passes as the store is now: nothing here explains the refusal. Not expected while the
    # transaction holds the targets; the call runs again (PostgreSQL) or fails as a conflict.
    raise StoreConflict(f"the writes to job {job_id!r} were refused, and then passed the rule")


@retried
def set_batch_job_status(job_id: str, status: str, error: str = "", *, now: int | None = None) -> None:
    """Set the job's status and error, and its lease to ``now``.

    The original design's call, kept as it was: any status, a finished job's too (an operator's repair), and
    it leaves the targets alone. A finished job's status set back to live through the models is refused.
    """
    job_id = validation.job_id(job_id)
    status = validation.job_status(status)
    error = validation.message("error", error)
    now = validation.now(now)
    with db.write():
        if not _SET_JOB_STATUS.run(job_id=job_id, status=status, error=error, now=now):
            _write_miss(JobNotFound(job_id))


@retried
def touch_batch_job(job_id: str, *, now: int | None = None) -> None:
    """Set the job's lease to ``now``: a consumer's read keeps the job alive through this call."""
    job_id = validation.job_id(job_id)
    now = validation.now(now)
    with db.write():
        if not _TOUCH.run(job_id=job_id, now=now):
            _write_miss(JobNotFound(job_id))


@retried
def mark_in_flight_failed(reason: str, *, now: int | None = None) -> int:
    """Restart reconciliation: every queued or running job becomes failed with ``error = reason``
    and ``lease = now``. Returns how many jobs changed."""
    reason = validation.message("reason", reason)
    now = validation.now(now)
    with db.write():
        marked = _MARK_FAILED.run(reason=reason, now=now)
    counters.add("jobs_marked_failed", marked)
    return marked


@retried
def rescue_stale_jobs(stale_after: Duration, reason: str, *, now: int | None = None) -> int:
    """Every queued or running job whose lease is at least ``stale_after`` old (``lease + stale_after <=
    now``) becomes failed with ``error = reason`` and ``lease = now``; its targets stay as they are.
    Returns how many jobs changed. Safe from every host at any time."""
    reason = validation.message("reason", reason)
    now = validation.now(now)
    cutoff = validation.cutoff(now, stale_after, "stale_after")
    with db.write():
        rescued = _RESCUE.run(reason=reason, now=now, cutoff=cutoff)
    counters.add("jobs_rescued", rescued)
    return rescued


def sweep_batch(ttl: Duration, *, now: int | None = None) -> int:
    """Delete every job, whatever its status, whose ``lease + ttl <= now``, with its targets.

    The only removal by time. Returns the number of jobs deleted.
    """
    cutoff = validation.cutoff(validation.now(now), ttl)
    if not _ANY_EXPIRED.rows(cutoff=cutoff):  # the usual case: one read, locking nothing
        return 0
    swept = chunks = 0
    with db.bulk_writes():
        while True:
            deleted = _sweep_chunk(cutoff)
            if not deleted:
                break
            space.reclaim_all()  # what big results freed beyond that step, in short transactions
            counters.add("jobs_swept", deleted)  # per chunk, so a long sweep shows progress in stats()
            swept += deleted
            chunks += 1
            if chunks % TRANSACTIONS_PER_CHECKPOINT == 0:
                db.checkpoint()
    return swept


def evict_batch_oldest(max_bytes: int) -> int:
    """Evict whole finished jobs holding bytes, oldest lease first (then created_at, then id),
    until ``batch_nbytes() <= max_bytes``. Queued and running jobs are never evicted."""
    if type(max_bytes) is not int or not 0 <= max_bytes <= validation.MAX_INT:
        validation.count("max_bytes", max_bytes)  # which refuses it
    if db.backend.byte_total() <= max_bytes:  # the runner's usual case: one read, no transaction
        return 0
    evicted = chunks = 0
    with db.bulk_writes():
        while batch_nbytes() > max_bytes:
            deleted, chosen = _evict_chunk(max_bytes)
            if not deleted:
                break
            space.reclaim_all()
            counters.add("jobs_evicted", deleted)  # per chunk, so a long eviction shows progress in stats()
            counters.add("bytes_evicted", sum(nbytes for _, _, nbytes in chosen))
            evicted += deleted
            chunks += 1
            if chunks % TRANSACTIONS_PER_CHECKPOINT == 0:
                db.checkpoint()
    return evicted


@retried
def _sweep_chunk(cutoff: int) -> int:
    with db.removals():  # reads its chunk again: another process may have touched it meanwhile
        deleted = _delete_jobs(_take_rows(_EXPIRED.rows(cutoff=cutoff), excess=None))
        space.reclaim_free_pages()  # the file shrinks with the data, a bounded step per chunk
        return deleted


@retried
def _evict_chunk(max_bytes: int) -> tuple[int, list[Any]]:
    with db.removals():
        excess = batch_nbytes() - max_bytes
        chosen = _take_rows(_EVICTABLE.rows(), excess) if excess > 0 else []
        deleted = _delete_jobs(chosen)
        space.reclaim_free_pages()
        return deleted, chosen


def sweep_candidates(ttl: Duration, *, now: int | None = None) -> list[BatchJob]:
    """The jobs ``sweep_batch(ttl, now=now)`` would delete, oldest lease first. Reads only."""
    cutoff = validation.cutoff(validation.now(now), ttl)
    return BatchJob.from_rows(JOB_COLUMNS, _SWEEP_CANDIDATES.rows(cutoff=cutoff))


def evict_candidates(max_bytes: int) -> list[BatchJob]:
    """The jobs ``evict_batch_oldest(max_bytes)`` would evict, in its order. Reads only."""
    max_bytes = validation.count("max_bytes", max_bytes)
    chosen: list[BatchJob] = []
    with db.backend.hold():
        excess = batch_nbytes() - max_bytes
        if excess > 0:
            with db.backend.errors():
                for row in db.backend.run_sql(*_EVICT_CANDIDATES.bind({})):  # streamed: stops at the excess
                    chosen.append(BatchJob.from_row(JOB_COLUMNS, row))
                    excess -= chosen[-1].nbytes
                    if excess <= 0:
                        break
    return chosen


# -- Reads: they never write ---------------------------------------------------------------------------


def batch_job(job_id: str) -> BatchJob | None:
    """The job, or None."""
    rows = _SELECT_JOB.rows(job_id=_read_id(job_id))
    if not rows:
        counters.add("batch_job_miss")
        return None
    counters.add("batch_job_hit")
    return BatchJob.from_row(JOB_COLUMNS, rows[0])


def batch_targets(
    job_id: str, *, after: int | None = None, limit: int | None = None
) -> list[BatchTarget] | None:
    """The job's targets in idx order (``[]`` for a job without targets), or None for an unknown job.

    A page with ``after`` and/or ``limit``: the targets with ``idx > after``, at most ``limit`` (at least 1)
    of them, read as one range of the index; ``[]`` past the last target."""
    if after is not None or limit is not None:
        return _targets_page(_read_id(job_id), after, limit)
    rows = _SELECT_TARGETS.rows(job_id=_read_id(job_id))
    if not rows:
        counters.add("batch_targets_miss")
        return None
    counters.add("batch_targets_hit")
    if rows[0][1] is None:  # the job's LEFT JOIN row: no targets
        return []
    return BatchTarget.from_rows(TARGET_COLUMNS, rows)


def _targets_page(job_id: str, after: int | None, limit: int | None) -> list[BatchTarget] | None:
    after = -1 if after is None else validation.count("after", after)
    limit = validation.MAX_INT if limit is None else validation.positive("limit", limit)
    rows = _PAGE.rows(job_id=job_id, after_idx=after, limit=limit)
    if not rows and _TARGETS_TOTAL.scalar(job_id=job_id) is None:  # an empty page, or no such job
        counters.add("batch_targets_miss")
        return None
    counters.add("batch_targets_hit")
    return BatchTarget.from_rows(TARGET_COLUMNS, rows)


def batch_job_by_idem(caller: str, idem_key: str, ttl: Duration, *, now: int | None = None) -> str | None:
    """The id of this caller's newest job with this idem_key whose ``lease + ttl > now`` and whose
    status is queued, running, done or partial; an empty key never matches."""
    caller = validation.text("caller", caller)
    idem_key = validation.text("idem_key", idem_key)
    cutoff = validation.cutoff(validation.now(now), ttl)
    found = _IDEM.scalar(caller=caller, idem_key=idem_key, cutoff=cutoff) if idem_key else None
    counters.add("batch_idem_miss" if found is None else "batch_idem_hit")
    return None if found is None else str(found)


def live_batch_jobs(caller: str) -> int:
    """How many of this caller's jobs are queued or running."""
    return int(_LIVE.scalar(caller=validation.text("caller", caller)))


def live_batch_jobs_total() -> int:
    """How many jobs are queued or running, for all callers."""
    return int(_LIVE_TOTAL.scalar())


def batch_nbytes() -> int:
    """The total of ``nbytes`` over every job (a running total, not a scan)."""
    return db.backend.byte_total()


# -- Helpers -------------------------------------------------------------------------------------------


def _read_id(job_id: Any) -> str:
    return validation.text("job_id", job_id)  # the empty id is allowed here: it is simply a miss


def _write_miss(exc: LookupError) -> NoReturn:
    counters.add("batch_write_miss")
    raise exc


def _job_values(job: Any) -> dict[str, Any]:
    if not isinstance(job, BatchJob):
        validation.invalid("job", f"must be a BatchJob, got {type(job).__name__}")
    data = job.__data__
    values: dict[str, Any] = {
        "id": validation.key("id", data.get("id")),
        "caller": validation.key("caller", data.get("caller")),
        "caller_class": validation.caller_class(data.get("caller_class")),
        "idem_key": validation.key("idem_key", data.get("idem_key"), allow_empty=True),
        "status": validation.job_status(data.get("status")),
        "error": validation.message("error", data.get("error")),
    }
    for name in ("targets_total", "targets_done", "created_at", "lease", "nbytes"):
        values[name] = validation.count(name, data.get(name))
    if values["targets_done"] > values["targets_total"]:
        validation.invalid("targets_done", f"must be at most targets_total ({values['targets_total']})")
    for name in ("targets_done", "nbytes"):  # a count that no target backs would never be undone
        if values[name]:
            validation.invalid(
                name, f"follows the job's targets, which start pending: must be 0, got {values[name]}"
            )
    return values


def _insert_job(values: dict[str, Any], targets: Iterable[BatchTarget] | None, *, whole: bool = False) -> int:
    """Insert the job and its targets inside the caller's transaction; return how many targets. Targets
    given must be all of the job's; ``whole`` (a submit) also refuses an empty iterable."""
    try:
        _INSERT_JOB.run(**values)
    except peewee.IntegrityError as exc:
        if driver_errors.violated(exc) == driver_errors.PRIMARY_KEY:
            raise DuplicateJob(values["id"]) from exc
        raise
    if targets is None:
        return 0
    total = values["targets_total"]
    put = _insert_targets(values["id"], total, targets)
    # Checked after the rows, so a bad row is named first; raising here rolls the job back too.
    if put == 0 and whole:
        validation.invalid("targets", "must not be empty: a job without targets never finishes")
    if put != total:
        validation.invalid(
            "targets_total", f"is {total}, but {_plural(put)} given: a job's targets come together"
        )
    return put


def _plural(n: int) -> str:
    return f"{n} target was" if n == 1 else f"{n} targets were"


def _insert_targets(job_id: str, total: int, targets: Iterable[BatchTarget]) -> int:
    """Insert the targets, read in chunks of :data:`TARGETS_PER_STATEMENT`; on failure name the field of
    the bad row."""
    last: list[tuple[Any, ...]] = [()]  # the row SQLite ran last, to name the field when it fails
    try:
        targets = iter(targets)
    except TypeError:
        validation.invalid("targets", f"must be an iterable of BatchTarget, got {type(targets).__name__}")
    rows = _target_rows(job_id, total, targets, last)
    chunk: list[tuple[Any, ...]] = []
    inserted = 0
    try:
        # Each chunk is read from the iterable before the driver is called: psycopg holds its connection's
        # lock while it pulls rows, so an iterable that reads the store would wait for itself for ever.
        while chunk := list(itertools.islice(rows, TARGETS_PER_STATEMENT)):
            inserted += _insert_rows(chunk, last)
    except UnicodeEncodeError:
        _, idx, url, _, _, _ = last[0]
        validation.invalid(
            "url" if not _encodes(url) else "options", f"is not valid UTF-8 text (target {idx})"
        )
    except peewee.IntegrityError as exc:
        idx = driver_errors.failing_idx(exc, job_id)
        idx = last[0][1] if idx is None else idx
        violated = driver_errors.violated(exc)
        if violated == driver_errors.NOT_NULL:  # the only NULL a checked row can hold: json_or_null's
            validation.invalid("options", f"is not valid JSON text (target {idx})")
        if violated == driver_errors.PRIMARY_KEY:
            validation.invalid("idx", f"target {idx} of job {job_id!r} is given twice or already stored")
        raise
    return inserted


_INSERT_NAMES = ("job_id", "idx", "url", "options", "options", "host")


def _insert_rows(rows: list[tuple[Any, ...]], last: list[tuple[Any, ...]]) -> int:
    """Insert ``rows`` in INSERTs of many rows where the backend takes them (sizes of powers of two, so a
    few statements serve every count); a statement refused wrote nothing, and its rows go again one by one,
    so the error names the row that failed as it always did."""
    most = db.backend.rows_per_insert
    if most <= 1:
        return _INSERT_TARGET.run_many(_INSERT_NAMES, _sent(rows, last))
    inserted = start = 0
    while start < len(rows):
        size = min(most, 1 << ((len(rows) - start).bit_length() - 1))
        part = rows[start : start + size]
        start += size
        if size == 1:
            inserted += _INSERT_TARGET.run_many(_INSERT_NAMES, _sent(part, last))
            continue
        try:
            inserted += db.backend.run_sql(
                _insert_sql(size), list(itertools.chain.from_iterable(part))
            ).rowcount
        except (peewee.IntegrityError, UnicodeEncodeError):
            inserted += _INSERT_TARGET.run_many(_INSERT_NAMES, _sent(part, last))
    return inserted


@functools.cache
def _insert_sql_of(sql: str, size: int) -> str:
    head, values = sql.split(" VALUES ", 1)
    return f"{head} VALUES {', '.join([values] * size)}"


def _insert_sql(size: int) -> str:
    """The INSERT of ``size`` targets: _INSERT_TARGET's row ``size`` times, its parameters in the order of
    the rows' values."""
    if [getattr(p, "name", p) for p in _INSERT_TARGET.template] != list(_INSERT_NAMES):
        raise AssertionError(f"statement parameters are {_INSERT_TARGET.template}, not {_INSERT_NAMES}")
    return _insert_sql_of(_INSERT_TARGET.sql, size)


def _sent(rows: list[tuple[Any, ...]], last: list[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """``rows``, each kept in ``last`` as the driver takes it: SQLite's is the one that failed."""
    for row in rows:
        last[0] = row
        yield row


def _target_rows(
    job_id: str, total: int, targets: Iterable[BatchTarget], last: list[tuple[Any, ...]]
) -> Iterator[tuple[Any, ...]]:
    """Check each target (cheap checks in Python, JSON and UTF-8 by SQLite) and yield its row."""
    for target in targets:
        if not isinstance(target, BatchTarget):
            validation.invalid("targets", f"each target must be a BatchTarget, got {type(target).__name__}")
        data = target.__data__
        idx = data.get("idx")
        if type(idx) is not int or not 0 <= idx < total:
            validation.invalid("idx", f"must be an int in 0..{total - 1} (targets_total - 1), got {idx!r}")
        url = data.get("url")
        if type(url) is not str and isinstance(url, str):
            url = validation.plain(url)
        if type(url) is not str or not url:
            validation.invalid("url", f"must be a non-empty str (target {idx})")
        if "\x00" in url:
            validation.invalid("url", f"{validation.NUL_PROBLEM} (target {idx})")
        validation.at_most("url", url, validation.MAX_URL_BYTES)
        options = data.get("options")
        if type(options) is not str:
            options = validation.options_text(options)  # a str subclass's text as a plain str
        validation.at_most("options", options, validation.MAX_OPTIONS_BYTES)
        if "\x00" in options:  # never JSON, and SQLite's json_valid stops reading at a NUL
            validation.invalid("options", f"is not valid JSON text (target {idx})")
        if validation.json_too_deep(options):  # one limit for both backends: SQLite's
            validation.invalid(
                "options", f"is nested deeper than {validation.MAX_JSON_DEPTH} levels (target {idx})"
            )
        # idx, url, options, status and attempts (the model's defaults) are set; anything more is checked
        if len(data) > 5 or data.get("status") != "pending" or data.get("attempts") != 0:
            _check_unset_fields(data, job_id, idx)
        last[0] = (job_id, idx, url, options, options, url_host(url))
        yield last[0]


def _check_unset_fields(data: dict[str, Any], job_id: str, idx: int) -> None:
    """A target to put may name its own job and the pending status, and nothing a run writes."""
    if data.get("job") not in (None, job_id):
        validation.invalid("job_id", f"target {idx} names job {data['job']!r}, not {job_id!r}")
    if data.get("status") not in (None, "pending"):
        validation.invalid("status", f"target {idx} must be put as pending, got {data['status']!r}")
    for name in ("result", "error", "hint", "runner", "heartbeat"):
        if data.get(name) is not None:
            validation.invalid(name, f"target {idx} cannot have a {name} before it runs")
    if data.get("attempts") not in (None, 0):
        validation.invalid("attempts", f"target {idx} must be put with 0 attempts, got {data['attempts']!r}")


def _encodes(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _take_rows(rows: list[Any], excess: int | None) -> list[Any]:
    """The leading rows (id, targets_total, nbytes) worth one transaction; with ``excess``, stop once
    they free that many bytes."""
    chosen, budget, freed = [], 0, 0
    for row in rows:
        chosen.append(row)
        budget += row[1] + 1
        freed += row[2]
        if budget >= ROWS_PER_TRANSACTION or (excess is not None and freed >= excess):
            break
    return chosen


def _delete_jobs(rows: list[Any]) -> int:
    """Delete the jobs (rows of id, ...) and their targets; return how many jobs went."""
    ids = [(row[0],) for row in rows]
    _DELETE_TARGETS.run_many(("job_id",), ids)
    return _DELETE_JOB.run_many(("job_id",), ids)
