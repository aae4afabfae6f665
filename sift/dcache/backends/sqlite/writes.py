"""How the rule functions write on SQLite (see :class:`sift.dcache.backends.Backend`): the SQL pieces their
statements are built from (byte length, the JSON check, insertion order, the byte total), and their write
transactions.

BEGIN IMMEDIATE holds the whole file from the first statement, so no rule needs a row lock, and no
transaction meets a deadlock: the row and key locks are no-ops here (PostgreSQL's backend does the work).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
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

    #: A call's target writes go one statement at a time, in one hold of the lock (see :meth:`direct_write`).
    one_statement_writes = False

    @staticmethod
    def write_targets(job_id: str, writes: Sequence[tuple[Any, ...]], runner: str | None, now: int) -> bool:
        """Never: the caller sends the statements itself, on the connection :meth:`direct_write` gives."""
        return False

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
    #: An UPDATE rewrites the index entries of every column it sets, changed or not.
    rewrites_set_keys = True
    #: BEGIN IMMEDIATE holds the whole file: no rule locks rows.
    row_locks = False

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
        return json.dumps(list(values))

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
