"""How the rule functions write on PostgreSQL (see :class:`sift.dcache.backends.Backend`): the SQL pieces
their statements are built from, their write transactions, and the row and advisory locks that keep the
rules exact under concurrent writers.

Why these locks: under READ COMMITTED a statement's subqueries read rows as of the statement's start, so a
target write first locks its job, then its target (the one order every rule uses: job before target);
sweep and eviction run each chunk under one advisory transaction lock, the sweep's lease-ordered select
taking its jobs ``FOR UPDATE SKIP LOCKED`` (a job a writer holds is being refreshed) and eviction's
``FOR UPDATE``; ``submit_batch_job`` holds an advisory lock on its (caller, key) so a burst makes one job.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import peewee

from ...errors import StoreConflict, StoreReadOnly
from ...sqlfiles import load_sql
from .base import PostgresBase

__all__ = ["CONFLICT_RETRIES", "DirectWrite", "PostgresWrites", "Removals", "Write"]

#: How many times a transaction that met a deadlock or a serialization failure runs again.
CONFLICT_RETRIES = 5

_LOCK_JOB, _LOCK_TARGET, _LOCK_KEY, _LOCK_REMOVALS, _WRITE_TARGETS = (
    load_sql(__package__, "queries.sql")[name][0]
    for name in ("lock_job", "lock_target", "lock_key", "lock_removals", "write_targets")
)
_CLAIM = load_sql(__package__, "claim.sql")["claim"][0]


class Write:
    """The store's write transaction on this thread's connection (a savepoint inside another one)."""

    __slots__ = ("atomic", "database")

    def __init__(self, database: PostgresBase) -> None:
        self.database = database

    def __enter__(self) -> None:
        database = self.database
        if database.readonly:
            raise StoreReadOnly(
                f"database: {database.path!r} is open read-only; "
                "open_db(target) without readonly=True to write"
            )
        with database.read_errors:
            database.usable_connection()
            self.atomic = peewee.PostgresqlDatabase.atomic(database)
            self.atomic.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            self.atomic.__exit__(exc_type, exc, tb)
        except Exception as end_error:
            self.database.raise_store_error(end_error, constraints=True)
            raise
        if exc is not None:
            self.database.raise_store_error(exc, constraints=True)


class DirectWrite(Write):
    """The write transaction of a hot path: the block is given the store's ``run_sql`` on the
    transaction's connection."""

    __slots__ = ()

    def __enter__(self) -> Callable[[str, Sequence[Any]], Any]:  # type: ignore[override]
        super().__enter__()
        return self.database.run_sql


class Removals(Write):
    """A sweep or eviction chunk: the write transaction, holding the store's removal advisory lock."""

    __slots__ = ()

    def __enter__(self) -> None:
        super().__enter__()
        try:
            self.database.run_sql(_LOCK_REMOVALS, (f"sift removals {self.database.schema}",))
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise


class PostgresWrites(PostgresBase):
    """What the rule functions ask of the PostgreSQL store's database to write."""

    total_nbytes_sql = "SELECT COALESCE(SUM(nbytes), 0) FROM batch_totals"
    insertion_order = peewee.SQL("seq")
    #: A row's address in its table: stable while the transaction holds the row's lock.
    row_address = peewee.SQL("ctid")

    @staticmethod
    def byte_length(expr: peewee.Node) -> peewee.Node:
        return peewee.fn.octet_length(expr)

    @staticmethod
    def live_lease(lease: peewee.ColumnBase) -> peewee.ColumnBase:
        """As it is: the partial index batch_job_live_lease holds the live jobs by lease."""
        return lease

    @staticmethod
    def json_or_null(expr: peewee.Node) -> peewee.Node:
        return peewee.Case(None, [(peewee.fn.sift_json_valid(expr), peewee.fn.sift_json(expr))], None)

    @staticmethod
    def bytewise(expr: peewee.Node) -> peewee.ColumnBase:
        """``expr COLLATE "C"``: the collation the ring's and the hosts' indexes are built with."""
        return cast(peewee.ColumnBase, peewee.NodeList((expr, peewee.SQL('COLLATE "C"'))))

    @staticmethod
    def lock_rows(query: peewee.Node, *, skip_locked: bool = False) -> peewee.Node:
        locked: peewee.Node = query.for_update(skip_locked=skip_locked)  # type: ignore[attr-defined]
        return locked

    @staticmethod
    def among(column: peewee.Node, query: peewee.Node) -> peewee.Node:
        """``column = ANY(ARRAY(query))``: the query runs once (an InitPlan); on ``ctid`` the rows are read
        by a TID scan, each once, whatever the statistics say (``IN (query)`` or a join could be planned as a
        nested loop over the query's rows)."""
        return peewee.Expression(column, "=", peewee.fn.ANY(peewee.NodeList((peewee.SQL("ARRAY"), query))))

    @staticmethod
    def one_of(column: peewee.Node, values: peewee.Node) -> peewee.Node:
        """``column = ANY(values)``: the values come as one array; each row is found by index."""
        return peewee.Expression(column, "=", peewee.fn.ANY(values))

    @staticmethod
    def listed(values: Sequence[str]) -> list[str]:
        """``values`` as a list, which psycopg binds as an array, for :meth:`one_of`."""
        return list(values)

    @staticmethod
    def require_claims() -> None:
        """Every PostgreSQL that sift supports can claim."""

    def claim_targets(
        self,
        *,
        limit: int,
        per_job: int,
        per_host: int | None,
        weights: Mapping[str, int] | None,
        fair: bool,
        runner: str,
        now: int,
        now_ms: int,
        slack_ms: int,
    ) -> list[Any]:
        """The claim as one statement, schema version 11's function (claim.sql): the ring's lock, the move
        of due targets, every search and take of ``ClaimOrder``, one round trip instead of one each."""
        classes = list(weights or {})
        turns = [weights[name] for name in classes] if weights else []
        values = (limit, per_job, per_host, fair, classes, turns, runner, now, now_ms, slack_ms)
        return self.fetch_all(_CLAIM, values)

    def write(self) -> Write:
        return Write(self)

    def direct_write(self) -> DirectWrite:
        return DirectWrite(self)

    def removals(self) -> Removals:
        return Removals(self)

    def bulk_writes(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def checkpoint(self) -> None:
        """Nothing to do: PostgreSQL checkpoints and vacuums on its own."""

    #: Targets go one row a statement: psycopg's executemany pipelines them.
    rows_per_insert = 1

    def write_targets(
        self, job_id: str, writes: Sequence[tuple[Any, ...]], runner: str | None, now: int
    ) -> bool:
        """A call's checked target writes (idx, status, final, size, result, error, hint) as one statement
        run on its own, a round trip, when every one passes the per-target rule; False, having written
        nothing, when one does not, when an idx comes twice, or inside a caller's transaction (the caller
        then writes them in a transaction of its own, :meth:`write_target_run` a run)."""
        if self.in_transaction() or len({write[0] for write in writes}) != len(writes):
            return False
        return self.write_target_run(self.run_sql, job_id, writes, runner, now)

    def write_target_run(
        self,
        execute: Callable[[str, Any], Any],
        job_id: str,
        writes: Sequence[tuple[Any, ...]],
        runner: str | None,
        now: int,
    ) -> bool:
        """Checked target writes naming no idx twice, in the one statement (``write_targets`` in
        queries.sql), on ``execute``: the call's :meth:`direct_write`, or the store's own run of one
        statement. False, having written nothing, when one fails the per-target rule; inside a transaction,
        its locks on the job and targets then stay held."""
        idx, status, final, size, result, error, hint = (list(column) for column in zip(*writes, strict=True))
        values = {
            "idx": idx,
            "status": status,
            "final": final,
            "size": size,
            "result": result,
            "error": error,
            "hint": hint,
            "job_id": job_id,
            "runner": runner,
            "n": len(idx),
            "now": now,
        }
        return int(execute(_WRITE_TARGETS, values).rowcount) == len(idx)

    def byte_total(self) -> int:
        row = self.fetch_one(self.total_nbytes_sql, ())
        return 0 if row is None else int(row[0])

    def lock_job(self, job_id: str) -> None:
        self.run_sql(_LOCK_JOB, (job_id,))

    def lock_target(self, job_id: str, idx: int) -> None:
        self.run_sql(_LOCK_TARGET, (job_id, idx))

    def lock_key(self, caller: str, idem_key: str) -> None:
        self.run_sql(_LOCK_KEY, (self.schema, caller, idem_key))

    def retry(self, conflict: BaseException, run: Callable[[], Any]) -> Any:
        """Run a rule's transaction again after a deadlock or serialization failure, up to
        :data:`CONFLICT_RETRIES` more times; inside a caller's transaction, never (that one failed)."""
        if self.in_transaction():
            raise conflict
        for attempt in range(CONFLICT_RETRIES):
            try:
                return run()
            except StoreConflict:
                if attempt == CONFLICT_RETRIES - 1:
                    raise
        raise conflict
