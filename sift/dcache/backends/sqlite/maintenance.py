"""The SQLite store's maintenance: its page-level integrity check, reads of the whole file beside the
shared connection, the page copy a backup makes, and free pages given back to the file system.

What :mod:`sift.dcache.integrity`, :mod:`sift.dcache.space` and :mod:`sift.dcache.backup` ask of a backend
(see :class:`sift.dcache.backends.Backend`), in SQLite's terms.
"""

from __future__ import annotations

import contextlib
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...errors import BatchError, StoreCorrupt, StoreUnavailable
from .base import SqliteBase
from .schema import BASE_SCHEMA, RECOMPUTE_TOTAL_SQL, SCHEMA_NAMES, SPEED_SCHEMA, TOTAL_NBYTES_SQL

__all__ = ["INCREMENTAL", "SqliteMaintenance"]

#: ``PRAGMA auto_vacuum``'s value for INCREMENTAL (0 is NONE, 1 FULL).
INCREMENTAL = 2


class SqliteMaintenance(SqliteBase):
    """Checks, copies and space of the SQLite store's file."""

    # -- The integrity check's spellings ---------------------------------------------------------------

    #: The store's space is pages of a file, which SQLite checks and gives back itself.
    has_pages = True
    #: Counts the rows where a condition holds.
    sql_count_if = "SUM({})"
    #: The UTF-8 bytes of ``result``.
    sql_result_bytes = "length(CAST(result AS BLOB))"
    # SQLite's min() of two values skips neither NULL: coalesce each with the other. SQLite also orders an
    # id another program wrote as a number; PostgreSQL's columns hold only what their types allow.
    sql_least = "min(coalesce({a}, {b}), coalesce({b}, {a}))"
    #: The condition that ``idx`` holds an integer (another program may have written text).
    sql_integer_idx = "typeof(idx) = 'integer' AND "
    #: The condition that ``options`` is not JSON (a column of TEXT holds what another program wrote).
    sql_invalid_options = "NOT json_valid(options)"
    #: A condition that always holds.
    sql_true = "1"
    #: The byte total kept and the total of the jobs, in one statement.
    sql_totals = f"SELECT ({TOTAL_NBYTES_SQL}), (SELECT COALESCE(SUM(nbytes), 0) FROM batch_job)"

    def page_check(self) -> list[str]:
        """What SQLite's ``quick_check`` finds wrong with the file's pages ([] when nothing)."""
        try:
            rows = self.read_whole("PRAGMA quick_check")
        except StoreCorrupt as exc:  # too damaged for quick_check to finish
            rows = [(str(exc.__cause__ or exc),)]
        return [] if rows == [("ok",)] else [str(row[0]) for row in rows]

    @property
    def reads_beside(self) -> bool:
        """Whether whole-file reads run on a connection of their own (a file), not the shared one."""
        return self.database not in (":memory:", "")

    def read_whole(self, sql: str) -> list[Any]:
        """Rows of a statement that reads the whole file: on a private read-only connection for a file (no
        lock held, nothing blocked); an in-memory store has only the shared connection."""
        if self.deferred or not self.reads_beside:
            with self.lock:
                return self.fetch_all(sql, ())
        conn = self.private_reader()
        try:
            with self.read_errors:
                return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def private_reader(self) -> sqlite3.Connection:
        """A read-only connection of its own to the store file, any thread may use (``query_only``)."""
        with self.read_errors:  # self.database is the path, or the mode=ro URI of a read-only store
            conn = sqlite3.connect(
                self.database,
                timeout=self.timeout,
                isolation_level=None,
                check_same_thread=False,
                uri=self.readonly,
            )
            conn.execute("PRAGMA query_only = 1")
        return conn

    @contextlib.contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """Reads as one snapshot, under the lock; inside a caller's transaction, that one."""
        with self.lock:
            conn: sqlite3.Connection = self.connection()
            if conn.in_transaction:
                yield
                return
            self.run_sql("BEGIN", ())
            try:
                yield
            except BaseException:
                with contextlib.suppress(sqlite3.Error, BatchError):  # the error raised already says more
                    self.run_sql("ROLLBACK", ())
                raise
            if conn.in_transaction:
                self.run_sql("COMMIT", ())

    def missing_schema(self) -> list[str]:
        """The parts of the schema the store lacks."""
        with self.read_snapshot():
            present = {row[0] for row in self.fetch_all("SELECT name FROM sqlite_master", ())}
        return sorted(SCHEMA_NAMES - present)

    def schema_version_problem(self) -> str | None:
        """SQLite's schema has no version row."""
        return None

    def create_missing_schema(self) -> None:
        """Create what is missing of the schema, as ``open_db`` does for a new store."""
        with self.write():
            for statement in BASE_SCHEMA + SPEED_SCHEMA:
                self.run_sql(statement, ())

    def total_problems(self) -> list[str]:
        """A single total row: nothing to check beyond its value."""
        return []

    def lock_job_range(self, where: str, params: Sequence[Any]) -> None:
        """Nothing to lock: the write transaction holds the whole file."""

    def repair_total(self) -> list[str]:
        """Recompute the byte total if it differs from SUM(nbytes), in one write transaction (a full
        scan); return what changed."""
        with self.write():
            kept, actual = self.fetch_one(self.sql_totals, ())
            if kept == actual:
                return []
            self.run_sql(RECOMPUTE_TOTAL_SQL, ())
        shown = "no row" if kept is None else repr(kept)
        return [f"{shown} -> {actual}"]

    # -- Space -----------------------------------------------------------------------------------------

    def pragma_value(self, name: str) -> int:
        """An integer pragma of the store's connection (page_size, freelist_count, ...)."""
        return int(self.fetch_one(f"PRAGMA {name}", ())[0])

    def page_stats(self) -> tuple[int, int, int, int]:
        """The page size, pages, free pages and auto_vacuum mode, read together under the lock."""
        with self.lock:
            names = ("page_size", "page_count", "freelist_count", "auto_vacuum")
            size, count, free, mode = (self.pragma_value(name) for name in names)
            return size, count, free, mode

    def reclaim_free_pages(self, limit: int) -> int:
        """Give back up to ``limit`` free pages, in the caller's write transaction; return how many. Does
        nothing on a file without incremental auto_vacuum."""
        with self.lock:
            if self.pragma_value("auto_vacuum") != INCREMENTAL:
                return 0
            pages = min(limit, self.pragma_value("freelist_count"))
            # Each execution moves one page: the pragma yields a row per page, with no columns, and the
            # sqlite3 module steps a statement without columns only once.
            for _ in range(pages):
                self.run_sql("PRAGMA incremental_vacuum", ())
            return pages

    def convert_to_incremental(self) -> None:
        """Rewrite the whole file with incremental auto_vacuum (``VACUUM``), the lock held throughout."""
        with self.lock:
            self.execute_sql(f"PRAGMA auto_vacuum = {INCREMENTAL}")
            self.execute_sql("VACUUM")

    def relation_sizes(self) -> dict[str, tuple[int, int]]:
        """None: a file has no server tables (see :meth:`page_stats`)."""
        return {}

    # -- Backup ----------------------------------------------------------------------------------------

    def backup_source(self) -> str | None:
        """The store file's resolved path, which a backup copies page by page."""
        if self.file in (None, ":memory:"):
            raise StoreUnavailable("database: an in-memory store has no file to back up")
        return self.file

    def store_file(self) -> str | None:
        """The store file's resolved path, or None in memory."""
        return None if self.file in (None, ":memory:") else self.file

    def copy_into(
        self, temp: str, progress: Callable[[int, int], None] | None, *, pages_per_step: int
    ) -> tuple[int, int]:
        """Copy the store's pages into the new file ``temp`` in steps, all inside one read transaction of
        the store; return its pages and page size."""
        source = self.backup_source()
        assert source is not None
        uri = f"file:{urllib.parse.quote(source)}?mode=ro"
        src = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=self.timeout or 0)
        try:
            dst = sqlite3.connect(temp, isolation_level=None)
            try:
                dst.execute("PRAGMA journal_mode = OFF")  # the copy is not the store until it is renamed
                dst.execute("PRAGMA synchronous = OFF")  # the backup fsyncs the finished file
                # Without this transaction each step would read the store as it is then, and the backup
                # would start over whenever another connection wrote between two steps.
                src.execute("BEGIN")
                src.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()  # the snapshot starts here
                pages = src.execute("PRAGMA page_count").fetchone()[0]
                page_size = src.execute("PRAGMA page_size").fetchone()[0]

                def report(status: int, remaining: int, total: int) -> None:
                    if progress is not None:
                        progress(total - remaining, total)

                src.backup(dst, pages=pages_per_step, progress=report)
                src.execute("COMMIT")
            finally:
                dst.close()
        finally:
            src.close()
        return int(pages), int(page_size)

    def copy_rows_into(
        self, dst: sqlite3.Connection, progress: Callable[[int, int], None] | None, *, rows_per_step: int
    ) -> None:
        """Never: a store file is backed up page by page (:meth:`copy_into`)."""
        raise StoreUnavailable("database: a SQLite store is backed up page by page, not row by row")
