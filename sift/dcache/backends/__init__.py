"""The store's backends: what every backend must offer (:class:`Backend`), and which one a target names.

Each backend owns what differs about it (peewee's way: attributes and overridden methods on its database
class), so the rules, the integrity check, space and backup are written once. The SQLite backend is the
process's one :data:`SQLITE` object; the PostgreSQL backend is imported only when a PostgreSQL store is
opened (``import sift.dcache`` adds no driver of its own).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import peewee

from ..errors import StoreUnavailable
from ..waiters import JobWaiters
from .heldwrites import cleared, written_table
from .postgres.urls import parse_target, shown_url
from .sqlite import SerializedSqliteDatabase
from .sqlite.maintenance import INCREMENTAL
from .sqlite.paths import sqlite_url_path
from .sqlite.schema import NEW_FILE_SCHEMA as SQLITE_FILE_SCHEMA
from .sqlite.schema import OWN_TRIGGERS as SQLITE_TRIGGERS
from .sqlite.schema import RECOMPUTE_TOTAL_SQL as SQLITE_RECOMPUTE_TOTAL
from .sqlite.schema import missing_in_file
from .sqlite.settings import BUSY_TIMEOUT_S

__all__ = [
    "BUSY_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "INCREMENTAL",
    "SQLITE",
    "SQLITE_FILE_SCHEMA",
    "SQLITE_RECOMPUTE_TOTAL",
    "SQLITE_TRIGGERS",
    "Backend",
    "ConnectionBlock",
    "Dialect",
    "Maintenance",
    "Transactions",
    "cleared",
    "is_postgres_target",
    "missing_schema",
    "open_postgres",
    "parse_target",
    "shown_url",
    "sqlite_path",
    "written_table",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Pooled connections per process of a PostgreSQL store, unless open_db says otherwise.
DEFAULT_MAX_CONNECTIONS = 20


class ConnectionBlock(Protocol):
    """``db.connection_context()``: a block (or decorator) that needs the store's connection open."""

    def __enter__(self) -> object: ...

    def __exit__(self, *exc_info: object) -> object: ...

    def __call__(self, fn: F) -> F: ...


class Dialect(Protocol):
    """The SQL pieces the rules and the integrity check build their statements from: how this backend
    spells what the other spells differently."""

    #: Statements are compiled once per key: one per backend class, and one more for an older store's reads.
    statement_key: str

    #: The SQL that reads the byte total (one row, one column).
    total_nbytes_sql: str

    #: An expression ordering rows by insertion: ties in created_at go to the later insert.
    insertion_order: peewee.ColumnBase

    #: A row's address in its table (ctid, rowid): stable while the transaction holds the row.
    row_address: peewee.ColumnBase

    def byte_length(self, expr: peewee.Node) -> peewee.Node:
        """The UTF-8 byte length of a text expression (NULL stays NULL)."""

    def json_or_null(self, expr: peewee.Node) -> peewee.Node:
        """``expr`` when it is valid JSON text, else NULL."""

    def live_lease(self, lease: peewee.ColumnBase) -> peewee.ColumnBase:
        """The lease column as a condition on live jobs only must name it: never through an index that
        holds the history's leases too."""

    def bytewise(self, expr: peewee.Node) -> peewee.ColumnBase:
        """A text expression compared and ordered byte by byte (PostgreSQL's ``COLLATE "C"``), so both
        backends order callers and hosts alike."""

    def lock_rows(self, query: peewee.Node, *, skip_locked: bool = False) -> peewee.Node:
        """``query`` locking the rows it selects until the transaction ends (skipping rows another
        transaction holds, with ``skip_locked``), where the backend needs row locks."""

    def among(self, column: peewee.Node, query: peewee.Node) -> peewee.Node:
        """``column`` is one of the values ``query`` selects, evaluated once, each row found by index."""

    def one_of(self, column: peewee.Node, values: peewee.Node) -> peewee.Node:
        """``column`` is one of the values of the parameter ``values`` (bound as :meth:`listed` gives them),
        each row found by index."""

    def listed(self, values: Sequence[str]) -> Any:
        """``values`` as the one parameter of a :meth:`one_of`."""

    #: Peewee's parameter placeholder for this backend.
    param: str

    #: The integrity check's SQL spellings: a count of rows where ``{}`` holds, the UTF-8 bytes of
    #: ``result``, the lesser of ``{a}`` and ``{b}`` (either may be NULL), the test that ``idx`` is an
    #: integer (followed by AND, or empty), that ``options`` is not JSON, a condition that always holds, and
    #: (byte total kept, SUM).
    sql_count_if: str
    sql_result_bytes: str
    sql_least: str
    sql_integer_idx: str
    sql_invalid_options: str
    sql_true: str
    sql_totals: str


class Transactions(Protocol):
    """The open store: its write transaction and locks, the statements run in it, and its driver errors
    turned into the package's."""

    #: Where the store is, as shown in messages; None when nothing is open.
    path: str | None

    readonly: bool

    #: Whether the store has the claims' columns: a read-only open of an older store may not, and then reads
    #: every target as unclaimed, with no attempts.
    claims_stored: bool

    #: Whether the store's hosts are this sift's ``url_host`` (schema version 6): a read-only open of an older
    #: store keeps none or an earlier rule's, and its check then skips the hosts (a copy computes them).
    hosts_stored: bool

    #: Whether the store has the politeness tables (schema version 8): a read-only open of an older store
    #: has none, and reads no policy, back-off or pause.
    politeness_stored: bool

    def write(self) -> AbstractContextManager[None]:
        """The store's write transaction; driver errors leaving it become the package's errors."""

    #: The most rows one INSERT of targets carries (``VALUES (…), (…)``); 1: one statement a row, sent by
    #: :meth:`executemany`.
    rows_per_insert: int

    def write_targets(
        self, job_id: str, writes: Sequence[tuple[Any, ...]], runner: str | None, now: int
    ) -> bool:
        """A call's checked target writes in a transaction of their own, outside any caller's, when the
        backend writes such a call so (PostgreSQL: one statement; SQLite: a runner's step) and every one
        passes the per-target rule; False, having written nothing, otherwise."""

    def write_target_run(
        self,
        execute: Callable[[str, Any], Any],
        job_id: str,
        writes: Sequence[tuple[Any, ...]],
        runner: str | None,
        now: int,
    ) -> bool:
        """The counting rule, inside the call's :meth:`direct_write`: checked target writes (idx, status,
        final, size, result, error, hint) naming no idx twice, each moving its job's count, bytes and lease
        by its target's change, then written; False, when one fails the per-target rule."""

    def direct_write(self) -> AbstractContextManager[Callable[[str, Any], Any]]:
        """The write transaction of a hot path that sends its statements itself: the block is given an
        ``execute(sql, params)`` returning a cursor (its ``rowcount``), parameters bound by position."""

    def bulk_writes(self) -> AbstractContextManager[None]:
        """Around many write transactions in a row (a sweep, an eviction)."""

    def job_waiters(self) -> JobWaiters:
        """This process's waits for jobs to change, woken by the store's change feed."""

    def checkpoint(self) -> None:
        """Between bulk write transactions: let the backend do its housekeeping."""

    def run_sql(self, sql: str, params: Sequence[Any]) -> Any:
        """Execute one statement; return its cursor."""

    def fetch_all(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Every row of a query."""

    def fetch_one(self, sql: str, params: Sequence[Any]) -> Any:
        """The first row of a query, or None."""

    def byte_total(self) -> int:
        """The total of ``nbytes`` over every job (a running total, not a scan)."""

    def executemany(self, sql: str, rows: Any) -> int:
        """Run one statement per row; return the rows changed."""

    def raise_store_error(self, exc: BaseException, *, constraints: bool = False) -> None:
        """Raise the package error for the driver exception ``exc``, if it is one."""

    def close_store(self) -> None:
        """Close the store's connection(s)."""

    def hold(self) -> AbstractContextManager[object]:
        """A block of statements no other thread interleaves with, where the process's threads share one
        connection (rows read from a cursor inside it stay the block's)."""

    def errors(self) -> AbstractContextManager[None]:
        """A block whose driver errors become the package's (as every statement's do)."""

    def require_claims(self) -> None:
        """Raise StoreUnavailable if this backend's engine cannot run a claim's statement."""

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
    ) -> list[Any] | None:
        """Inside the claim's write: the whole claim, in the order and by the rules of ``ClaimOrder``, run by
        the server in one statement; its rows are the target's columns, its host, and whether the claim paced
        that host. None: the backend runs ``ClaimOrder`` in-process instead."""

    def removals(self) -> AbstractContextManager[None]:
        """A sweep or eviction chunk's write transaction: one at a time per store, where that matters."""

    def lock_job(self, job_id: str) -> None:
        """Inside a write: lock the job's row (before its targets), where the backend needs it."""

    def lock_target(self, job_id: str, idx: int) -> None:
        """Inside a write: lock the job's row, then the target's, where the backend needs it."""

    def lock_key(self, caller: str, idem_key: str) -> None:
        """Inside a write: hold (caller, idem_key) until the transaction ends, where the backend needs it."""

    def retry(self, conflict: BaseException, run: Callable[[], Any]) -> Any:
        """After ``conflict`` (a StoreConflict), run the rule's transaction again a bounded number of
        times, or raise."""

    def read_snapshot(self) -> AbstractContextManager[None]:
        """Reads as one snapshot; inside a caller's transaction, that one."""

    def lock_job_range(self, where: str, params: Sequence[Any]) -> None:
        """Inside a write: lock the jobs ``where`` selects (before their targets), where needed."""


class Maintenance(Protocol):
    """What the integrity check, space and backup ask of the store beyond its rules: its schema, its pages
    or relations, and copies of it."""

    @property
    def reads_beside(self) -> bool:
        """Whether whole-store reads run on a connection of their own, beside the shared one."""

    def page_check(self) -> list[str]:
        """What the engine's page-level check finds wrong ([] when nothing, or when it has none)."""

    def read_whole(self, sql: str) -> list[Any]:
        """Rows of a statement that reads the whole store, blocking no other thread if it can."""

    def missing_schema(self) -> list[str]:
        """The parts of the schema the store lacks."""

    def schema_version_problem(self) -> str | None:
        """What is wrong with the schema's recorded version, if anything."""

    def create_missing_schema(self) -> None:
        """Create what is missing of the schema, as ``open_db`` does for a new store."""

    def total_problems(self) -> list[str]:
        """What is wrong with how the byte total is kept, beyond its value."""

    def repair_total(self) -> list[str]:
        """Recompute the byte total if it is wrong, in a write transaction of its own; say what changed."""

    #: Whether the store's space is pages of a file (SQLite), rather than the server's.
    has_pages: bool

    def reclaim_free_pages(self, limit: int) -> int:
        """Give back up to ``limit`` free pages in the caller's write transaction; return how many."""

    def pragma_value(self, name: str) -> int:
        """A page count or setting of the store's file, by its SQLite pragma's name (pages only)."""

    def page_stats(self) -> tuple[int, int, int, int]:
        """The page size, pages, free pages and auto_vacuum mode of the store's file (pages only)."""

    def convert_to_incremental(self) -> None:
        """Rewrite the store's file so that it gives free pages back (pages only)."""

    def relation_sizes(self) -> dict[str, tuple[int, int]]:
        """Each of the store's tables' bytes and dead rows (a server's store only)."""

    def backup_source(self) -> str | None:
        """The file a backup copies page by page, or None when it copies rows; raises StoreUnavailable
        when there is nothing to copy from."""

    def store_file(self) -> str | None:
        """The store's file, or None when it is none."""

    def copy_into(
        self, temp: str, progress: Callable[[int, int], None] | None, *, pages_per_step: int
    ) -> tuple[int, int]:
        """Copy the store's file as of one snapshot, page by page, into the new file ``temp``; its pages,
        page size (a store with a :meth:`backup_source` only)."""

    def copy_rows_into(
        self, dst: sqlite3.Connection, progress: Callable[[int, int], None] | None, *, rows_per_step: int
    ) -> None:
        """Write the store's jobs and targets as of one snapshot into ``dst``, a new SQLite store file's
        connection inside its transaction (a store without a :meth:`backup_source` only)."""


class Backend(Dialect, Transactions, Maintenance, Protocol):
    """What the rules ask of the open store's database, beyond Peewee's ``Database`` API: its dialect,
    its transactions and its maintenance, each a protocol of its own for the modules that need only it."""


#: The one SQLite database object of the process: the backend whenever no other store is open.
SQLITE = SerializedSqliteDatabase()


def is_postgres_target(target: object) -> bool:
    """Whether ``target`` names a PostgreSQL store (a ``postgresql://`` or ``postgres://`` URL)."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def sqlite_path(target: Any) -> Any:
    """What to hand the SQLite backend for ``target``: the path of a ``sqlite:///path`` URL, or ``target``."""
    if isinstance(target, str) and target.startswith("sqlite://"):
        return sqlite_url_path(target)
    return target


def missing_schema(path: str | os.PathLike[str], *, timeout: float = BUSY_TIMEOUT_S) -> list[str]:
    """The parts of the store's schema (tables, indexes, triggers) the existing SQLite file at ``path``
    lacks, read without writing to it (``open_db`` would add them); [] when it is not a readable database
    (opening it says why)."""
    return missing_in_file(os.fspath(path), timeout=timeout)


def open_postgres(
    target: str,
    *,
    timeout: float,
    readonly: bool,
    max_connections: int | None,
    release: Callable[[], None],
    create: bool = True,
) -> Backend:
    """A new PostgreSQL backend for ``target``, its store open (the schema created or upgraded);
    ``release`` closes the store open before, once the target is known to be usable."""
    if max_connections is not None and (type(max_connections) is not int or max_connections < 1):
        raise StoreUnavailable(f"max_connections: must be a positive int, got {max_connections!r}")
    try:
        from .postgres.connection import PostgresStore  # only now: psycopg is sift[postgres]'s
    except ImportError as exc:
        raise StoreUnavailable.of_target(
            f"a PostgreSQL store needs psycopg 3: pip install 'sift[postgres]' ({exc})"
        ) from exc
    release()
    SQLITE.init(None)  # closes the SQLite store; db is deferred until the new store is open
    backend = PostgresStore(
        target,
        timeout=timeout,
        readonly=readonly,
        max_connections=max_connections or DEFAULT_MAX_CONNECTIONS,
        create=create,
    )
    try:
        backend.open_store()
    except Exception as exc:
        backend.close_store()
        shown = backend.path
        if isinstance(exc, StoreUnavailable) and exc.field == "path":  # already says what is wrong
            raise
        kind = type(exc) if isinstance(exc, StoreUnavailable) else StoreUnavailable
        cause = exc.__cause__ if isinstance(exc, StoreUnavailable) and exc.__cause__ is not None else exc
        raise kind.of_target(f"cannot open {shown!r} as a batch store: {exc}") from cause
    return backend


if TYPE_CHECKING:  # the type checker proves that the SQLite backend is a Backend
    _SQLITE_IS_A_BACKEND: Backend = SQLITE
