"""The PostgreSQL store's schema: its DDL, created at open in one transaction, upgraded from an earlier
version, and checked read-only."""

from __future__ import annotations

from ...errors import StoreUnavailable
from .base import PostgresBase

__all__ = ["MIGRATIONS", "SCHEMA", "SCHEMA_VERSION", "TOTAL_SLOTS", "PostgresSchema"]

#: The version the ``sift_schema`` row records; a store of an earlier version is migrated at open.
SCHEMA_VERSION = 2

#: The byte-total slot rows: writers add to ``pg_backend_pid() % TOTAL_SLOTS``.
TOTAL_SLOTS = 16

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


class PostgresSchema(PostgresBase):
    """The schema's part of the PostgreSQL store's database."""

    def open_store(self) -> None:
        """Connect, and create what is missing of the schema or migrate it from an earlier version (or
        check it, read-only)."""
        with self.connection_context():
            present = self.fetch_one("SELECT to_regclass('sift_schema') IS NOT NULL", ())[0]
            if not present:
                if self.readonly:
                    raise StoreUnavailable.of_target(
                        f"{self.path!r} holds no batch store; open it once without readonly=True"
                    )
                self.create_schema()
            version = self._version()
            if version in MIGRATIONS and not self.readonly:
                self._migrate()
                version = self._version()
            if version != SCHEMA_VERSION:
                upgrade = (
                    "; open it once without readonly=True to upgrade it" if version in MIGRATIONS else ""
                )
                raise StoreUnavailable.of_target(
                    f"{self.path!r} has schema version {version}; "
                    f"this sift knows version {SCHEMA_VERSION}{upgrade}"
                )

    def _version(self) -> int | None:
        row = self.fetch_one("SELECT version FROM sift_schema WHERE id = 0", ())
        return None if row is None else int(row[0])

    def _lock_schema(self) -> None:
        """Inside a write: hold the store's schema until the transaction ends."""
        self.run_sql("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"sift schema {self.schema}",))

    def create_schema(self) -> None:
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
