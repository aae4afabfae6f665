"""How the rule functions write on SQLite (see :class:`sift.dcache.backends.Backend`): the SQL pieces their
statements are built from (byte length, the JSON check, insertion order, the byte total), and their write
transactions.

BEGIN IMMEDIATE holds the whole file from the first statement, so no rule needs a row lock, and no
transaction meets a deadlock: the row and key locks are no-ops here (PostgreSQL's backend does the work).
"""

from __future__ import annotations

import functools
import itertools
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any, cast

import peewee

from ...errors import StoreUnavailable
from .base import SqliteBase
from .schema import TOTAL_NBYTES_SQL
from .settings import CLAIMS_NEED_SQLITE
from .transactions import DirectWrite, WriteTransaction

__all__ = ["SqliteWrites"]


class SqliteWrites(SqliteBase):
    """What the rule functions ask of the SQLite store's database to write."""

    def write(self) -> WriteTransaction:
        """The store's write transaction: BEGIN IMMEDIATE under the lock. Inside another transaction it
        is a savepoint. Any driver error leaving the block, a constraint violation included, becomes the
        package's error: StoreUnavailable (a lock held by another process past the busy timeout, say) or
        one of its subclasses."""
        return WriteTransaction(self)

    #: Targets go in INSERTs of many rows: SQLite steps one statement, not one a row.
    rows_per_insert = 128

    @staticmethod
    def claim_targets(
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
    ) -> None:
        """None: the claim's statements run in-process (``ClaimOrder``), each a call, not a round trip."""
        return None

    def write_targets(
        self, job_id: str, writes: Sequence[tuple[Any, ...]], runner: str | None, now: int
    ) -> bool:
        """A runner's step, one target write outside any transaction: its whole transaction here, in one
        hold of the lock and one turn in the writers' queue, when it passes the per-target rule; False,
        having written nothing, when it does not, or for any other call (which :meth:`direct_write` runs)."""
        if len(writes) != 1:
            return False
        state, lock = self._state, self.lock
        lock.acquire()
        try:
            conn = state.conn
            if conn is None or state.closed or state.transactions or self.readonly:
                return False  # connecting, a savepoint or a refusal: the general path says which
            # DirectWrite's steps, written out: a runner makes this call once a target
            self.writers.acquire()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except BaseException as exc:
                self.settle_writers()
                self.raise_store_error(exc)
                raise
            try:
                idx, status, final, size, result, error, hint = writes[0]
                moves = (job_id, runner, now, 1, idx, final, size)
                if (
                    conn.execute(_MOVE_ONE_AT_LEASE, moves).rowcount
                    or conn.execute(_MOVE_ONE, moves).rowcount
                ):
                    one = _WRITE_ONE_UNCLAIMED if status in _UNCLAIMING else _WRITE_ONE
                    conn.execute(one, (job_id, idx, status, result, error, hint))
                    conn.execute("COMMIT")
                    return True
                conn.execute("ROLLBACK")
                return False
            except BaseException as exc:
                self.rollback_if_open()
                self.raise_store_error(exc, constraints=True)
                raise
            finally:
                self.settle_writers()
        finally:
            lock.release()

    def write_target_run(
        self,
        execute: Callable[[str, Sequence[Any]], Any],
        job_id: str,
        writes: Sequence[tuple[Any, ...]],
        runner: str | None,
        now: int,
    ) -> bool:
        """Inside the call's :meth:`direct_write`: checked target writes (idx, status, final, size, result,
        error, hint) naming no idx twice, a chunk at a time: the job moved by the chunk's targets' change if
        every write passes the per-target rule, then the targets written. False when one does not (the
        call's transaction then rolls back what earlier chunks wrote)."""
        if len(writes) == 1:  # a runner's step: its statements prepared once, bound straight away
            idx, status, final, size, result, error, hint = writes[0]
            moves: tuple[Any, ...] = (job_id, runner, now, 1, idx, final, size)
            if not (execute(_MOVE_ONE_AT_LEASE, moves).rowcount or execute(_MOVE_ONE, moves).rowcount):
                return False
            one = _WRITE_ONE_UNCLAIMED if status in _UNCLAIMING else _WRITE_ONE
            execute(one, (job_id, idx, status, result, error, hint))
            return True
        for start in range(0, len(writes), SET_ROWS):
            chunk = writes[start : start + SET_ROWS]
            rows = _padded(chunk)
            moves = (
                job_id,
                runner,
                now,
                len(chunk),
                *itertools.chain.from_iterable((w[0], w[2], w[3]) for w in rows),
            )
            # The lease is left alone when it is ``now`` already: SQLite rewrites the index entries of every
            # column an UPDATE sets, and the lease is in batch_job_lease and batch_job_evictable.
            if not (
                execute(_move_sql(len(rows), True), moves).rowcount
                or execute(_move_sql(len(rows), False), moves).rowcount
            ):
                return False
            self._write_each(job_id, chunk)
        return True

    def _write_each(self, job_id: str, chunk: Sequence[tuple[Any, ...]]) -> None:
        """The chunk's targets written, each by its key with the one target's statement, prepared once and
        run by the connection for every write (``executemany``): one ``UPDATE … FROM (VALUES …)`` for the
        chunk costs more a target as results grow, as SQLite copies the joined rows, results and all, before
        it writes them. Sent on the connection of the call's transaction, whose ``execute`` sent the move:
        the lock the transaction holds keeps it the same."""
        conn = self._state.conn
        kept = [(job_id, w[0], w[1], w[4], w[5], w[6]) for w in chunk if w[1] not in _UNCLAIMING]
        if kept:
            conn.executemany(_WRITE_ONE, kept)
        if len(kept) < len(chunk):  # pending and failed also end the claim
            ended = [(job_id, w[0], w[1], w[4], w[5], w[6]) for w in chunk if w[1] in _UNCLAIMING]
            conn.executemany(_WRITE_ONE_UNCLAIMED, ended)

    def direct_write(self) -> DirectWrite:
        """The write transaction of a hot path: :meth:`write`, giving the block the connection's
        ``execute``, whose statements bind their parameters by position."""
        return DirectWrite(self)

    #: The running byte total kept by the triggers.
    total_nbytes_sql = TOTAL_NBYTES_SQL

    #: The order rows were inserted in: ties in created_at go to the later insert.
    # cast: Peewee's SQL is a ColumnBase (ordering and comparison work on it); its stubs say otherwise.
    insertion_order = cast(peewee.ColumnBase, peewee.SQL("_rowid_"))
    #: A row's address in its table: its rowid.
    row_address = cast(peewee.ColumnBase, peewee.SQL("_rowid_"))

    @staticmethod
    def byte_length(expr: peewee.Node) -> peewee.Node:
        """The UTF-8 byte length of a TEXT expression (NULL stays NULL)."""
        return peewee.fn.length(peewee.Cast(expr, "BLOB"))

    @staticmethod
    def live_lease(lease: peewee.ColumnBase) -> peewee.ColumnBase:
        """``+lease``: SQLite reaches no index through it, so it reads the live jobs from a partial index
        (batch_job_claim), not the history's old leases from batch_job_lease."""
        return cast(peewee.ColumnBase, peewee.NodeList((peewee.SQL("+"), lease), glue=""))

    @staticmethod
    def json_or_null(expr: peewee.Node) -> peewee.Node:
        """``expr`` when it is valid JSON text, else NULL (which the NOT NULL column then rejects)."""
        return peewee.Case(None, [(peewee.fn.json_valid(expr), expr)], None)

    # BEGIN IMMEDIATE holds the whole file from the first statement, so no rule needs a row lock, and no
    # transaction meets a deadlock: these are no-ops here (PostgreSQL's backend does the work).

    @staticmethod
    def bytewise(expr: peewee.Node) -> peewee.ColumnBase:
        """``expr`` as it is: SQLite compares text byte by byte (BINARY) unless told otherwise."""
        return cast(peewee.ColumnBase, expr)

    @staticmethod
    def lock_rows(query: peewee.Node, *, skip_locked: bool = False) -> peewee.Node:
        """``query`` as it is: SQLite has no ``FOR UPDATE``."""
        return query

    @staticmethod
    def among(column: peewee.Node, query: peewee.Node) -> peewee.Node:
        """``column IN (query)``: SQLite runs the query once into an ephemeral index, and finds each row
        by it."""
        return peewee.Expression(column, "IN", query)

    @staticmethod
    def one_of(column: peewee.Node, values: peewee.Node) -> peewee.Node:
        """``column IN (SELECT value FROM json_each(values))``: SQLite binds no list, so the values come as
        one JSON array; each row is found by index."""
        elements = peewee.Select([peewee.fn.json_each(values)], [peewee.SQL("value")])
        return peewee.Expression(column, "IN", elements)

    @staticmethod
    def listed(values: Sequence[str]) -> str:
        """``values`` as a JSON array, for :meth:`one_of`."""
        return "[" + ",".join(map(encode_basestring_ascii, values)) + "]"  # json.dumps's, without its calls

    @staticmethod
    def require_claims() -> None:
        """A claim's statement uses ``UPDATE … FROM``, ``RETURNING`` and a ``MATERIALIZED`` CTE: an older
        SQLite library is refused by name, not with the syntax error it would give."""
        if sqlite3.sqlite_version_info < CLAIMS_NEED_SQLITE:
            raise StoreUnavailable(
                f"database: claim_batch_targets needs SQLite {'.'.join(map(str, CLAIMS_NEED_SQLITE[:2]))} "
                f"or later; this Python's sqlite3 module uses SQLite {sqlite3.sqlite_version}"
            )

    def removals(self) -> WriteTransaction:
        """A sweep or eviction chunk's transaction: the write transaction."""
        return WriteTransaction(self)

    def lock_job(self, job_id: str) -> None:
        pass

    def lock_target(self, job_id: str, idx: int) -> None:
        pass

    def lock_key(self, caller: str, idem_key: str) -> None:
        pass

    def retry(self, conflict: BaseException, run: Callable[[], Any]) -> Any:
        """SQLite raises no StoreConflict; should one arrive, it is not retried."""
        raise conflict


#: The most target writes one move of the job covers (at 3 parameters each, far below SQLite's 32,766); a
#: chunk is padded to a power of two, so a few statements, each prepared once, serve every size.
SET_ROWS = 256
#: A padding row: idx -1 is no target's (idx is at least 0), so it matches nothing.
_PAD = (-1, "pending", 0, 0, None, None, None)
_FINAL = "('done', 'failed')"
_UNCLAIMING = frozenset({"pending", "failed"})


def _padded(chunk: Sequence[tuple[Any, ...]]) -> Sequence[tuple[Any, ...]]:
    """``chunk`` and padding rows, a power of two rows in all."""
    size = 1 << (len(chunk) - 1).bit_length()
    return chunk if size == len(chunk) else [*chunk, *itertools.repeat(_PAD, size - len(chunk))]


def _values(rows: int, width: int, first: int) -> str:
    """``rows`` rows of ``width`` numbered parameters, from ``?first``: a VALUES list to bind by position."""
    numbers = iter(range(first, first + rows * width))
    return ", ".join(
        "(" + ", ".join(f"?{n}" for n in itertools.islice(numbers, width)) + ")" for _ in range(rows)
    )


@functools.cache
def _move_sql(rows: int, at_lease: bool) -> str:
    """The counting rule: the job's count and bytes move by each write's (new - old) of its target, read
    before the targets change (a target's first move into done or failed adds 1, a rewrite 0; a result
    adds its size less the old one's), and only if all ``?4`` writes pass the per-target rule: the target
    exists, a write other than done or failed does not move it back from them, and with ``?2`` the runner
    holds it. ``at_lease``: only if the job's lease is ``?3`` already, left as it is; else set to ``?3``."""
    # No WITH: Python's sqlite3 gives the rowcount only of a statement that starts UPDATE. A VALUES
    # subquery names its columns column1, column2, ...: here idx, final and size. One write binds them
    # itself, which spares SQLite the subquery's rows (a fifth of a runner step's instructions).
    if rows == 1:
        final, size, targets = "?6", "?7", "batch_target AS t WHERE t.job_id = ?1 AND t.idx = ?5"
    else:
        final, size = "w.column2", "w.column3"
        targets = (
            f"(VALUES {_values(rows, 3, 5)}) AS w, batch_target AS t "
            "WHERE t.job_id = ?1 AND t.idx = w.column1"
        )
    return (
        "UPDATE batch_job SET (targets_done, nbytes) = (SELECT "
        f"batch_job.targets_done + sum({final} - (t.status IN {_FINAL})), "
        f"batch_job.nbytes + sum({size} - COALESCE(length(CAST(t.result AS BLOB)), 0)) FROM {targets})"
        f"{'' if at_lease else ', lease = ?3'} "
        f"WHERE id = ?1{' AND lease = ?3' if at_lease else ''} AND ?4 = (SELECT count(*) FROM {targets} "
        f"AND ({final} = 1 OR t.status NOT IN {_FINAL}) AND (CAST(?2 AS TEXT) IS NULL OR t.runner = ?2))"
    )


# One target written, by its key; pending and failed also end its claim (its runner and heartbeat, which
# the other statuses leave unset, so their index entries stay).
_SET_ONE = "UPDATE batch_target SET status = ?3, result = ?4, error = ?5, hint = ?6"
_WRITE_ONE = f"{_SET_ONE} WHERE job_id = ?1 AND idx = ?2"
_WRITE_ONE_UNCLAIMED = f"{_SET_ONE}, runner = NULL, heartbeat = NULL WHERE job_id = ?1 AND idx = ?2"
_MOVE_ONE, _MOVE_ONE_AT_LEASE = _move_sql(1, False), _move_sql(1, True)
