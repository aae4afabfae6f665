"""The PostgreSQL store's maintenance: what the integrity check, space and backup ask of a backend (see
:class:`sift.dcache.backends.Backend`), in PostgreSQL's terms.

There is no page check: the server keeps its own files whole. Each chunk of the integrity check reads in
one REPEATABLE READ transaction; the schema check reads the catalog (tables, indexes, the total's trigger
and functions, the ``sift_schema`` version), and the byte total is the slot rows summed. Repair stays exact
while other processes write: each chunk's fixes lock their jobs first (the rule every writer follows: job
before target) under the removal advisory lock, and the total is recomputed with ``batch_totals`` locked
against writers (``EXCLUSIVE``: readers go on). A backup is a SQLite store file written from one
REPEATABLE READ READ ONLY snapshot.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...errors import StoreUnavailable
from ...hosts import backfill_hosts
from ...sqlfiles import load_sql
from ...tables import CLAIM_COLUMNS, HOST_COLUMN, JOB_COLUMNS, NOT_BEFORE_COLUMN, STORE_TABLES, TARGET_COLUMNS
from .base import PostgresBase
from .schema import SCHEMA_OBJECTS, SCHEMA_VERSION, TOTAL_SLOTS

__all__ = ["PostgresMaintenance"]

_QUERIES = load_sql(__package__, "queries.sql")
_SCHEMA_PRESENT, _LOCK_JOBS, _LOCK_TOTALS, _RECOMPUTE_SLOTS, _RELATION_SPACE = (
    _QUERIES[name][0]
    for name in ("schema_present", "lock_jobs", "lock_totals", "recompute_slots", "relation_space")
)


class PostgresMaintenance(PostgresBase):
    """Checks, copies and space of the PostgreSQL store's tables."""

    # -- The integrity check's spellings ---------------------------------------------------------------

    #: The store's space is the server's: autovacuum gives it back by itself.
    has_pages = False
    sql_count_if = "SUM(({})::int)"
    sql_result_bytes = "octet_length(result)"
    sql_least = "LEAST({a}, {b})"
    sql_integer_idx = ""  # the column holds only integers
    sql_invalid_options = "FALSE"  # the column's json type holds only JSON
    sql_true = "TRUE"
    # The slot rows summed, in the same statement (one snapshot) as the jobs' sum.
    sql_totals = (
        "SELECT (SELECT COALESCE(SUM(nbytes), 0)::bigint FROM batch_totals), "
        "(SELECT COALESCE(SUM(nbytes), 0)::bigint FROM batch_job)"
    )
    #: Whole-store reads run on the thread's own connection: one snapshot, blocking no one.
    reads_beside = False

    def page_check(self) -> list[str]:
        """None: the server keeps its own files whole."""
        return []

    def read_whole(self, sql: str) -> list[Any]:
        """Rows of a statement that reads the whole store: one snapshot on the thread's connection."""
        return self.fetch_all(sql, ())

    def in_caller_transaction(self) -> bool:
        """Whether this thread's connection is inside a transaction (psycopg's status is not IDLE); a
        thread holding none is in none (and takes none to say so)."""
        conn = self._state.conn
        return conn is not None and bool(conn.info.transaction_status != 0)

    @contextlib.contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """Reads as one snapshot: a REPEATABLE READ transaction on the thread's connection (no lock:
        writers go on); inside a caller's transaction, that one."""
        if self.in_caller_transaction():
            yield
            return
        self.run_sql("BEGIN ISOLATION LEVEL REPEATABLE READ", ())
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # the error raised already says more
                self.run_sql("ROLLBACK", ())
            raise
        self.run_sql("COMMIT", ())

    def missing_schema(self) -> list[str]:
        """The parts of the schema the store lacks, each named with its kind (but tables)."""
        rows = self.fetch_all(_SCHEMA_PRESENT, (self.schema,) * 3)
        missing = sorted(SCHEMA_OBJECTS - {(kind, name) for kind, name in rows})
        return [name if kind == "table" else f"{name} ({kind})" for kind, name in missing]

    def schema_version_problem(self) -> str | None:
        """A ``sift_schema`` version that is not this sift's (a person decides, as for a status)."""
        versions = [row[0] for row in self.fetch_all("SELECT version FROM sift_schema", ())]
        if versions == [SCHEMA_VERSION]:
            return None
        return f"sift_schema holds version(s) {versions}; this sift writes version {SCHEMA_VERSION}"

    def create_missing_schema(self) -> None:
        """Create what is missing of the schema, as ``open_db`` does for a new store."""
        self.create_schema()

    def total_problems(self) -> list[str]:
        """The byte total's slot rows are exactly 0..TOTAL_SLOTS-1 (a missing one loses what the trigger
        adds to it; an extra one counts in the sum)."""
        slots = {row[0] for row in self.fetch_all("SELECT slot FROM batch_totals", ())}
        missing, extra = sorted(set(range(TOTAL_SLOTS)) - slots), sorted(slots - set(range(TOTAL_SLOTS)))
        if not (missing or extra):
            return []
        detail = f"batch_totals should have the slot rows 0..{TOTAL_SLOTS - 1}: "
        return [
            detail
            + "; ".join(
                text for text in (missing and f"{missing} missing", extra and f"{extra} extra") if text
            )
        ]

    def lock_job_range(self, where: str, params: Sequence[Any]) -> None:
        """Lock a repair chunk's jobs, in one order, before their targets are read again."""
        self.run_sql(_LOCK_JOBS.format(where=where), params)

    def repair_total(self) -> list[str]:
        """Slot 0 gets the sum and the others 0 (missing slot rows are made, others deleted), with
        ``batch_totals`` locked so no writer adds to a slot meanwhile; return what changed."""
        repairs = []
        with self.write():
            self.run_sql(_LOCK_TOTALS, ())
            # Every transaction that added to a slot has ended; a statement that changes nbytes later adds
            # its own delta after this commit, to the sum read here without it: the total stays exact.
            kept, actual = self.fetch_one(self.sql_totals, ())
            slots = [row[0] for row in self.fetch_all("SELECT slot FROM batch_totals ORDER BY slot", ())]
            if slots != list(range(TOTAL_SLOTS)):
                self.run_sql("DELETE FROM batch_totals WHERE slot NOT BETWEEN 0 AND %s", (TOTAL_SLOTS - 1,))
                self.run_sql(
                    "INSERT INTO batch_totals (slot, nbytes) SELECT g, 0 FROM generate_series(0, %s) g "
                    "ON CONFLICT (slot) DO NOTHING",
                    (TOTAL_SLOTS - 1,),
                )
                repairs.append(f"slot rows {slots} -> 0..{TOTAL_SLOTS - 1}")
            elif kept == actual:
                return repairs
            self.run_sql(_RECOMPUTE_SLOTS, ())
            if kept != actual:
                repairs.append(f"{kept!r} -> {actual} (slot 0; the others 0)")
        return repairs

    # -- Space -----------------------------------------------------------------------------------------

    def relation_sizes(self) -> dict[str, tuple[int, int]]:
        """Each of the store's tables: its bytes (with indexes and TOAST) and its dead rows."""
        rows = self.fetch_all(_RELATION_SPACE, (self.schema, list(STORE_TABLES)))
        return {name: (int(size), int(dead)) for name, size, dead in rows}

    def reclaim_free_pages(self, limit: int) -> int:
        """Nothing: autovacuum makes dead rows' space reusable by itself."""
        return 0

    # -- Backup ----------------------------------------------------------------------------------------

    def backup_source(self) -> str | None:
        """None: a backup reads rows, not a file."""
        return None

    def store_file(self) -> str | None:
        """None: the store is no file."""
        return None

    def copy_into(
        self, temp: str, progress: Callable[[int, int], None] | None, *, pages_per_step: int
    ) -> tuple[int, int]:
        """Never: the store is no file (:meth:`backup_source` is None); a backup copies its rows."""
        raise StoreUnavailable("database: a PostgreSQL store is backed up row by row, not page by page")

    def copy_rows_into(
        self, dst: sqlite3.Connection, progress: Callable[[int, int], None] | None, *, rows_per_step: int
    ) -> None:
        """Write the store's rows into ``dst`` (a new SQLite store file, inside its transaction) from one
        snapshot, so the copy is consistent while others write, and blocks no one. Jobs go in insertion
        order (``seq``), so the copy's ``_rowid_`` keeps the newest-wins tiebreak; ``options`` as the text
        stored, and each target's claim (runner, heartbeat, attempts); ``progress`` counts rows."""
        if self.in_caller_transaction():
            raise StoreUnavailable("database: backup_store cannot run inside a transaction; call it after")
        try:
            total = self._copy_rows(dst, progress, rows_per_step)
        except sqlite3.Error:
            raise
        except Exception as exc:
            self.raise_store_error(exc)
            raise
        if progress is not None and total == 0:
            progress(0, 0)
        if not self.hosts_stored:
            backfill_hosts(lambda sql, params: dst.execute(sql, params).fetchall(), dst.executemany, "?")

    def _copy_rows(
        self, dst: sqlite3.Connection, progress: Callable[[int, int], None] | None, rows_per_step: int
    ) -> int:
        """Copy every job and target into ``dst`` in one READ ONLY snapshot; return how many rows."""
        conn = self.usable_connection()
        self.run_sql("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", ())
        try:
            jobs, targets = self.fetch_one(
                "SELECT (SELECT COUNT(*) FROM batch_job), (SELECT COUNT(*) FROM batch_target)", ()
            )
            total, done = jobs + targets, 0
            # each target's claim as stored; a version 2 store (open read-only) has none: unclaimed
            claims = CLAIM_COLUMNS if self.claims_stored else ()
            # a store older than version 6 keeps no hosts, or an earlier rule's: the copy computes them
            host = HOST_COLUMN if self.hosts_stored else "''"
            # a retried target's wait as stored; a store older than version 9 has none: claimable at once
            delayed = (NOT_BEFORE_COLUMN,) if self.delays_stored else ()
            for table, columns, selected, order in (
                ("batch_job", JOB_COLUMNS, JOB_COLUMNS, "seq"),  # insertion order: the copy's _rowid_ too
                (
                    "batch_target",
                    (*TARGET_COLUMNS, *claims, HOST_COLUMN, *delayed),
                    (*TARGET_COLUMNS, *claims, host, *delayed),
                    "job_id, idx",
                ),
            ):
                names = ", ".join(columns)
                insert = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})"
                with conn.cursor(name=f"sift_backup_{table}") as cursor:  # server-side: streamed
                    cursor.itersize = rows_per_step
                    cursor.execute(f"SELECT {', '.join(selected)} FROM {table} ORDER BY {order}")
                    while rows := cursor.fetchmany(rows_per_step):
                        dst.executemany(insert, rows)
                        done += len(rows)
                        if progress is not None:
                            progress(done, total)
            self.run_sql("COMMIT", ())
        except BaseException:
            with contextlib.suppress(Exception):  # the error raised already says more
                self.run_sql("ROLLBACK", ())
            raise
        return int(total)
