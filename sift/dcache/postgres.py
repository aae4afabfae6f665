"""PostgreSQL's backend: pooled connections (one per thread), the schema, the row and advisory locks that keep
the rules exact under concurrent writers, and PostgreSQL's spellings of what the rules need.

Imported only when a PostgreSQL store is opened (``import sift.dcache`` adds no driver of its own).

Why these locks (measured in ``research/postgres.md``): under READ COMMITTED a statement's subqueries read
rows as of the statement's start, so a target write first locks its job, then its target (the one order
every rule uses: job before target); sweep and eviction run each chunk under one advisory transaction lock,
the sweep's lease-ordered select taking its jobs ``FOR UPDATE SKIP LOCKED`` (a job a writer holds is being
refreshed) and eviction's ``FOR UPDATE``; ``submit_batch_job`` holds an advisory lock on its
(caller, key) so a burst makes one job. The byte total is 16 slot rows kept by a trigger, each connection
adding to the slot of its backend pid, so writers do not queue on one row.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import peewee
from playhouse.pool import MaxConnectionsExceeded, PooledPostgresqlDatabase
from psycopg.types.string import TextLoader

from .driver_errors import store_error
from .errors import StoreConflict, StoreNotOpen, StoreReadOnly, StoreUnavailable

__all__ = ["SCHEMA_VERSION", "PostgresStore", "parse_target"]

#: The version the ``sift_schema`` row records; a store of an earlier version is migrated at open.
SCHEMA_VERSION = 2

#: How many times a transaction that met a deadlock or a serialization failure runs again.
CONFLICT_RETRIES = 5

#: The byte-total slot rows: writers add to ``pg_backend_pid() % TOTAL_SLOTS``.
TOTAL_SLOTS = 16

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

#: Version 2: what claim_batch_targets reads (live jobs in claim order, each job's pending targets), and
#: what rescue_stale_jobs reads (live jobs by lease).
VERSION_2_INDEXES = (
    "CREATE INDEX IF NOT EXISTS batch_job_claim ON batch_job(created_at, seq) "
    "WHERE status IN ('queued', 'running')",
    "CREATE INDEX IF NOT EXISTS batch_target_pending ON batch_target(job_id, idx) WHERE status = 'pending'",
    # rescue_stale_jobs: live jobs by lease (batch_job_lease holds the history too)
    "CREATE INDEX IF NOT EXISTS batch_job_live_lease ON batch_job(lease) "
    "WHERE status IN ('queued', 'running')",
)

#: What takes a store from the version given to the next one, in the transaction that records the next.
MIGRATIONS: dict[int, tuple[str, ...]] = {1: VERSION_2_INDEXES}

#: The schema, created in one transaction under an advisory lock (see :meth:`PostgresStore._prepare_schema`).
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS batch_job (
    id TEXT PRIMARY KEY, caller TEXT NOT NULL, caller_class TEXT NOT NULL, idem_key TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', targets_total BIGINT NOT NULL,
    targets_done BIGINT NOT NULL DEFAULT 0, created_at BIGINT NOT NULL, lease BIGINT NOT NULL,
    nbytes BIGINT NOT NULL DEFAULT 0, seq BIGSERIAL NOT NULL)""",
    # options is json, not jsonb: json keeps the caller's text verbatim (jsonb rewrites it).
    """CREATE TABLE IF NOT EXISTS batch_target (
    job_id TEXT NOT NULL, idx BIGINT NOT NULL, url TEXT NOT NULL, options JSON NOT NULL,
    status TEXT NOT NULL, result TEXT, error TEXT, hint TEXT, PRIMARY KEY (job_id, idx))""",
    "CREATE INDEX IF NOT EXISTS batch_job_idem ON batch_job(caller, idem_key)",
    "CREATE INDEX IF NOT EXISTS batch_job_lease ON batch_job(lease)",
    "CREATE INDEX IF NOT EXISTS batch_job_live ON batch_job(caller) WHERE status IN ('queued', 'running')",
    "CREATE INDEX IF NOT EXISTS batch_job_evictable ON batch_job(lease, created_at, id) "
    "WHERE nbytes > 0 AND status IN ('done', 'partial', 'failed', 'cancelled')",
    *VERSION_2_INDEXES,
    # Its own autovacuum settings: the slot rows are updated by every write and bloat otherwise.
    "CREATE TABLE IF NOT EXISTS batch_totals (slot SMALLINT PRIMARY KEY, nbytes BIGINT NOT NULL) "
    "WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000)",
    f"INSERT INTO batch_totals (slot, nbytes) SELECT g, 0 FROM generate_series(0, {TOTAL_SLOTS - 1}) g "
    "ON CONFLICT (slot) DO NOTHING",
    f"""CREATE OR REPLACE FUNCTION batch_totals_track() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
    DECLARE delta BIGINT;
    BEGIN
        IF TG_OP = 'INSERT' THEN delta := NEW.nbytes;
        ELSIF TG_OP = 'DELETE' THEN delta := -OLD.nbytes;
        ELSE delta := NEW.nbytes - OLD.nbytes;
        END IF;
        IF delta <> 0 THEN
            UPDATE batch_totals SET nbytes = nbytes + delta WHERE slot = mod(pg_backend_pid(), {TOTAL_SLOTS});
        END IF;
        RETURN NULL;
    END $$""",
    "CREATE OR REPLACE TRIGGER batch_totals_track AFTER INSERT OR DELETE OR UPDATE OF nbytes ON batch_job "
    "FOR EACH ROW EXECUTE FUNCTION batch_totals_track()",
    # SQLite's json_valid: whether text parses as JSON (PostgreSQL 15 has no pg_input_is_valid).
    """CREATE OR REPLACE FUNCTION sift_json_valid(value TEXT) RETURNS BOOLEAN LANGUAGE plpgsql IMMUTABLE AS $$
    BEGIN
        PERFORM value::json;
        RETURN TRUE;
    EXCEPTION WHEN invalid_text_representation THEN
        RETURN FALSE;
    END $$""",
    # The text as json, in a VOLATILE function: a plain cast of a parameter is folded when the statement is
    # planned, and would fail on invalid JSON even where sift_json_valid said no.
    """CREATE OR REPLACE FUNCTION sift_json(value TEXT) RETURNS JSON LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        RETURN value::json;
    END $$""",
    "CREATE TABLE IF NOT EXISTS sift_schema ("
    "id SMALLINT PRIMARY KEY CHECK (id = 0), version BIGINT NOT NULL)",
    f"INSERT INTO sift_schema (id, version) VALUES (0, {SCHEMA_VERSION}) ON CONFLICT (id) DO NOTHING",
)
TABLES = ("batch_job", "batch_target", "batch_totals", "sift_schema")

_LOCK_JOB = "SELECT 1 FROM batch_job WHERE id = %s FOR NO KEY UPDATE"
_LOCK_TARGET = (
    "SELECT 1 FROM batch_job j JOIN batch_target t ON t.job_id = j.id WHERE j.id = %s AND t.idx = %s "
    "FOR NO KEY UPDATE OF j FOR UPDATE OF t"
)
# Advisory locks are the database's, not the schema's: each key names its store's schema.
_LOCK_KEY = "SELECT pg_advisory_xact_lock(hashtextextended(%s || chr(31) || %s || chr(31) || %s, 0))"
_LOCK_REMOVALS = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


#: Query parameters of a libpq URL that hold a secret: never shown.
SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


def parse_target(target: str) -> tuple[str, str]:
    """The connection URL (``postgresql://``, without sift's own ``schema`` parameter) and the schema
    named by ``?schema=NAME`` (``public`` when absent) of a ``postgresql://`` or ``postgres://`` target."""
    try:
        parts = urllib.parse.urlsplit(target)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 host; the text may hold a password
        raise StoreUnavailable(f"path: not a valid postgresql:// URL ({exc})") from None
    schemas = [value for key, value in query if key == "schema"]
    schema = schemas[-1] if schemas else "public"
    if not _SCHEMA_NAME.fullmatch(schema):
        raise StoreUnavailable(
            f"schema: {schema!r} is not a schema name sift uses: lower-case letters, digits and _, "
            "starting with a letter or _, at most 63 characters"
        )
    rest = urllib.parse.urlencode([(key, value) for key, value in query if key != "schema"])
    url = urllib.parse.urlunsplit(("postgresql", parts.netloc, parts.path, rest, parts.fragment))
    return url, schema


def shown_url(url: str) -> str:
    """``url`` as shown in messages: without the password of its user part or of its query."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}@{host}"
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)]
    shown = [(k, "***" if k in SECRET_PARAMETERS else v) for k, v in query]
    return urllib.parse.urlunsplit(
        (parts.scheme, netloc, parts.path, urllib.parse.urlencode(shown, safe="*"), "")
    )


def url_secrets(url: str) -> tuple[str, ...]:
    """The passwords ``url`` holds, as written and decoded: a driver's message may quote either."""
    parts = urllib.parse.urlsplit(url)
    found = [parts.netloc.rpartition("@")[0].partition(":")[2]] if "@" in parts.netloc else []
    found += [
        v for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k in SECRET_PARAMETERS
    ]
    decoded = [urllib.parse.unquote(secret) for secret in found]
    return tuple(sorted({secret for secret in found + decoded if secret}, key=len, reverse=True))


def _shown(url: str, schema: str) -> str:
    """The target as shown in messages: without a password."""
    shown = shown_url(url)
    return f"{shown}{'&' if '?' in shown else '?'}schema={schema}"


class _Write:
    """The store's write transaction on this thread's connection (a savepoint inside another one)."""

    __slots__ = ("atomic", "database")

    def __init__(self, database: PostgresStore) -> None:
        self.database = database

    def __enter__(self) -> None:
        database = self.database
        if database.readonly:
            raise StoreReadOnly(
                f"database: {database.path!r} is open read-only; "
                "open_db(target) without readonly=True to write"
            )
        try:
            database.usable_connection()
            self.atomic = peewee.PostgresqlDatabase.atomic(database)
            self.atomic.__enter__()
        except Exception as exc:
            database.raise_store_error(exc)
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            self.atomic.__exit__(exc_type, exc, tb)
        except Exception as end_error:
            self.database.raise_store_error(end_error, constraints=True)
            raise
        if exc is not None:
            self.database.raise_store_error(exc, constraints=True)


class PostgresStore(PooledPostgresqlDatabase):  # type: ignore[misc]
    """A store in a PostgreSQL schema: a pooled connection per thread, statements in autocommit outside
    the store's transactions, every transaction READ COMMITTED with the locks described above."""

    _in_use: dict[int, Any]  # the pool's own state (playhouse.pool)
    _connections: list[Any]

    def __init__(self, target: str, *, timeout: float, readonly: bool, max_connections: int) -> None:
        url, self.schema = parse_target(target)
        self.path: str | None = _shown(url, self.schema)
        self._secrets = url_secrets(url)
        self.readonly = readonly
        self.timeout = timeout
        self._pid = os.getpid()
        self._threads = threading.local()
        # Each thread has its own connection, so nothing needs the SQLite store's lock; code written for
        # both backends (``with db.lock:``) takes this one, which no statement waits on.
        self.lock = threading.RLock()
        # Connections a forked child inherited: never used, never closed (closing one would end the
        # parent's session on the shared socket).
        self._inherited: list[Any] = []
        options = f"-c search_path={self.schema} -c lock_timeout={max(1, int(timeout * 1000))}"
        if readonly:
            options += " -c default_transaction_read_only=on"
        super().__init__(
            url,
            max_connections=max_connections,
            timeout=max(1, math.ceil(timeout)),  # whole seconds: the pool reads 0 as "wait for ever"
            prefer_psycopg3=True,
            autoconnect=True,
            connect_timeout=max(1, math.ceil(timeout)),
            options=options,
        )
        this = weakref.ref(self)

        def after_fork() -> None:
            database = this()
            if database is not None:
                database._after_fork()

        os.register_at_fork(after_in_child=after_fork)

    def __repr__(self) -> str:
        state = "closed" if self.deferred else "open"
        return f"<{type(self).__name__} {self.path!r}: {state}{', read-only' if self.readonly else ''}>"

    # -- Connections ----------------------------------------------------------------------------------

    def _connect(self) -> Any:
        conn = super()._connect()
        conn.adapters.register_loader("json", TextLoader)  # options read back as the text stored
        return conn

    def connect(self, reuse_if_open: bool = False) -> bool:
        """This thread's connection, from the pool; it stays with the thread until the thread ends (then it
        goes back to the pool) or the store closes. While the store is open this returns False when the
        thread already has one (never "Connection already opened")."""
        if self.deferred:
            raise StoreNotOpen("no database is open: call sift.dcache.open_db(target) first")
        if not self._state.closed:
            return False
        try:
            opened = bool(super().connect())
        except MaxConnectionsExceeded as exc:
            raise StoreUnavailable(
                f"database: all {self._max_connections} pooled connections to {self.path!r} stayed in use "
                f"for {self._wait_timeout:g} s; set open_db(max_connections=) to the threads using it"
            ) from exc
        except Exception as exc:
            self.raise_store_error(exc, connecting=True)
            raise
        conn = self._state.conn
        # Give the connection back when the thread ends: its thread-local sentinel is freed then.
        sentinel = _Sentinel()
        self._threads.sentinel = sentinel
        weakref.finalize(sentinel, _give_back, weakref.ref(self), conn, os.getpid())
        return opened

    def close(self) -> bool:
        """Does nothing and returns False: the thread keeps its pooled connection while the store is open
        (a request hook's ``db.close()`` must not cost a reconnect); ``close_db()`` closes them all."""
        return False

    def usable_connection(self) -> Any:
        """This thread's connection, replacing one that a server restart or a network cut broke."""
        conn = self._state.conn
        if conn is not None and (conn.closed or conn.broken) and not self._state.transactions:
            with self._pool_lock:
                self._in_use.pop(self.conn_key(conn), None)
            self._state.reset()
            conn = None
        if conn is None:
            self.connect()
            conn = self._state.conn
        return conn

    # Peewee's atomic(), transaction() and sessions call these three: a lost connection is StoreUnavailable
    # there too, and BEGIN replaces a connection a server restart broke, as every statement does.

    def begin(self, isolation_level: Any = None) -> None:
        try:
            self.usable_connection()
            super().begin(isolation_level)
        except Exception as exc:
            self.raise_store_error(exc)
            raise

    def commit(self) -> None:
        try:
            super().commit()
        except Exception as exc:
            self.raise_store_error(exc)
            raise

    def rollback(self) -> None:
        """ROLLBACK; nothing to send when the connection was lost: the server ended the transaction with the
        session (and the error that lost it is the one the caller sees)."""
        conn = self._state.conn
        if conn is not None and (conn.closed or conn.broken):
            return
        try:
            super().rollback()
        except Exception as exc:
            self.raise_store_error(exc)
            raise

    def _after_fork(self) -> None:
        """In a forked child: keep the parent's connections referenced and unusable, start an empty pool."""
        self._inherited.extend(pc.connection for pc in self._in_use.values())
        self._inherited.extend(conn for _, _, conn in self._connections)
        for conn in self._inherited:
            with contextlib.suppress(Exception):
                # The child's copy of the socket now points at /dev/null, so nothing the child does with
                # it (psycopg's own cleanup at exit included) reaches the parent's session.
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, conn.pgconn.socket)
                os.close(null)
        self._pid = os.getpid()
        self.dispose()

    def close_store(self) -> None:
        """Close every pooled connection of this process."""
        if os.getpid() == self._pid:
            with contextlib.suppress(Exception):
                self.close_all_connections()

    def close_all_connections(self) -> None:
        with self._pool_lock:
            conns = [pc.connection for pc in self._in_use.values()] + [c for _, _, c in self._connections]
            self._in_use = {}
            self._connections = []
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()
        self._state.reset()

    # -- Opening ----------------------------------------------------------------------------------------

    def open_store(self) -> None:
        """Connect, and create what is missing of the schema or migrate it from an earlier version (or
        check it, read-only)."""
        with self.connection_context():
            present = self.fetch_one("SELECT to_regclass('sift_schema') IS NOT NULL", ())[0]
            if not present:
                if self.readonly:
                    raise StoreUnavailable(
                        f"path: {self.path!r} holds no batch store; open it once without readonly=True"
                    )
                self._prepare_schema()
            version = self._version()
            if version in MIGRATIONS and not self.readonly:
                self._migrate()
                version = self._version()
            if version != SCHEMA_VERSION:
                upgrade = (
                    "; open it once without readonly=True to upgrade it" if version in MIGRATIONS else ""
                )
                raise StoreUnavailable(
                    f"path: {self.path!r} has schema version {version}; "
                    f"this sift knows version {SCHEMA_VERSION}{upgrade}"
                )

    def _version(self) -> int | None:
        row = self.fetch_one("SELECT version FROM sift_schema WHERE id = 0", ())
        return None if row is None else int(row[0])

    def _lock_schema(self) -> None:
        """Inside a write: hold the store's schema until the transaction ends."""
        self.run_sql("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"sift schema {self.schema}",))

    def _prepare_schema(self) -> None:
        """Create the schema in one transaction, under an advisory lock: several processes opening a new
        database at once wait for the first, then find everything there."""
        with self.write():
            self._lock_schema()
            self.run_sql(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"', ())
            for statement in SCHEMA:
                self.run_sql(statement, ())

    def _migrate(self) -> None:
        """Bring an earlier version's schema up to this one, in one transaction under the schema's advisory
        lock: several processes opening it at once wait for the first, then find the new version. The new
        indexes are built inside it (not CONCURRENTLY), so writers of the store wait while they build."""
        with self.write():
            self._lock_schema()
            version = self._version()  # read again under the lock: another process may have migrated
            while version in MIGRATIONS:
                for statement in MIGRATIONS[version]:
                    self.run_sql(statement, ())
                version += 1
                self.run_sql("UPDATE sift_schema SET version = %s WHERE id = 0", (version,))

    # -- Statements -------------------------------------------------------------------------------------

    def run_sql(self, sql: str, params: Sequence[Any]) -> Any:
        """Execute on this thread's connection; rows are fetched by the caller. A constraint violation is
        Peewee's IntegrityError; any other driver error is the package's StoreUnavailable (or subclass)."""
        try:
            cursor = self.usable_connection().cursor()
            with vars(peewee)["__exception_wrapper__"]:
                cursor.execute(sql, params or None)
            return cursor
        except Exception as exc:
            self.raise_store_error(exc)
            raise

    def fetch_all(self, sql: str, params: Sequence[Any]) -> list[Any]:
        rows: list[Any] = self.run_sql(sql, params).fetchall()
        return rows

    def fetch_one(self, sql: str, params: Sequence[Any]) -> Any:
        return self.run_sql(sql, params).fetchone()

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        try:
            cursor = self.usable_connection().cursor()
            with vars(peewee)["__exception_wrapper__"]:
                cursor.executemany(sql, rows)
            return int(cursor.rowcount)
        except Exception as exc:
            self.raise_store_error(exc)
            raise

    def execute_sql(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        try:
            self.usable_connection()
            return super().execute_sql(sql, params)
        except Exception as exc:
            self.raise_store_error(exc)
            raise

    def raise_store_error(
        self, exc: BaseException, *, constraints: bool = False, connecting: bool = False
    ) -> None:
        """Raise the package error for the driver exception ``exc`` (see :mod:`.driver_errors`)."""
        error = store_error(
            exc,
            path=self.path or "",
            timeout=self.timeout,
            constraints=constraints,
            connecting=connecting,
            hidden=self._secrets,
        )
        if error is not None:
            raise error

    # -- What the rules ask of the backend --------------------------------------------------------------

    total_nbytes_sql = "SELECT COALESCE(SUM(nbytes), 0) FROM batch_totals"
    insertion_order = peewee.SQL("seq")

    @staticmethod
    def byte_length(expr: peewee.Node) -> peewee.Node:
        return peewee.fn.octet_length(expr)

    @staticmethod
    def json_or_null(expr: peewee.Node) -> peewee.Node:
        return peewee.Case(None, [(peewee.fn.sift_json_valid(expr), peewee.fn.sift_json(expr))], None)

    @staticmethod
    def lock_rows(query: peewee.Node, *, skip_locked: bool = False) -> peewee.Node:
        locked: peewee.Node = query.for_update(skip_locked=skip_locked)  # type: ignore[attr-defined]
        return locked

    @staticmethod
    def require_claims() -> None:
        """Every PostgreSQL that sift supports can claim."""

    def write(self) -> _Write:
        return _Write(self)

    def removals(self) -> _Removals:
        return _Removals(self)

    def bulk_writes(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def checkpoint(self) -> None:
        """Nothing to do: PostgreSQL checkpoints and vacuums on its own."""

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


class _Removals(_Write):
    """A sweep or eviction chunk: the write transaction, holding the store's removal advisory lock."""

    __slots__ = ()

    def __enter__(self) -> None:
        super().__enter__()
        try:
            self.database.run_sql(_LOCK_REMOVALS, (f"sift removals {self.database.schema}",))
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise


class _Sentinel:
    """Lives in a thread's local storage; freed when the thread ends."""


def _give_back(ref: weakref.ref[PostgresStore], conn: Any, pid: int) -> None:
    database = ref()
    if database is None or os.getpid() != pid or database._pid != pid:
        return
    with contextlib.suppress(Exception):
        database._close(conn)
