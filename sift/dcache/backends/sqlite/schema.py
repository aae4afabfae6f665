"""The SQLite store's schema: its DDL, created and repaired at open time, and checked read-only."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from ...errors import StoreUnavailable
from .base import SqliteBase

__all__ = [
    "BASE_SCHEMA",
    "READ_SCHEMA_NAMES",
    "RECOMPUTE_TOTAL_SQL",
    "SCHEMA_NAMES",
    "SPEED_SCHEMA",
    "TOTAL_NBYTES_SQL",
    "SqliteSchema",
    "missing_in_file",
]

#: The original schema, verbatim. Files written by the Go service have exactly these tables.
BASE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS batch_job (
    id TEXT PRIMARY KEY, caller TEXT NOT NULL, caller_class TEXT NOT NULL, idem_key TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', targets_total INTEGER NOT NULL,
    targets_done INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, lease INTEGER NOT NULL,
    nbytes INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS batch_target (
    job_id TEXT NOT NULL, idx INTEGER NOT NULL, url TEXT NOT NULL, options TEXT NOT NULL,
    status TEXT NOT NULL, result TEXT, error TEXT, hint TEXT, PRIMARY KEY (job_id, idx))""",
    "CREATE INDEX IF NOT EXISTS batch_job_idem  ON batch_job(caller, idem_key)",
    "CREATE INDEX IF NOT EXISTS batch_job_lease ON batch_job(lease)",
)

# What the hot paths need to stay flat in history. The partial indexes hold only live jobs, or only
# jobs that eviction may take; triggers keep the byte total whoever writes the file, and open_db
# recomputes it, so a file written by a program that never knew of this table is still right.
SPEED_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS batch_job_live ON batch_job(caller) WHERE status IN ('queued', 'running')",
    "CREATE INDEX IF NOT EXISTS batch_job_evictable ON batch_job(lease, created_at, id) "
    "WHERE nbytes > 0 AND status IN ('done', 'partial', 'failed', 'cancelled')",
    # claim_batch_targets: live jobs in claim order (created_at, then rowid, which every index entry ends
    # with), and each job's pending targets in idx order, so a claim reads neither history nor done targets.
    "CREATE INDEX IF NOT EXISTS batch_job_claim ON batch_job(created_at) "
    "WHERE status IN ('queued', 'running')",
    "CREATE INDEX IF NOT EXISTS batch_target_pending ON batch_target(job_id, idx) WHERE status = 'pending'",
    # rescue_stale_jobs: live jobs by lease. batch_job_lease holds the history too, which a rescue would
    # read through (every finished job with an older lease) while holding the write lock.
    "CREATE INDEX IF NOT EXISTS batch_job_live_lease ON batch_job(lease) "
    "WHERE status IN ('queued', 'running')",
    "CREATE TABLE IF NOT EXISTS batch_totals ("
    "id INTEGER PRIMARY KEY CHECK (id = 0), nbytes INTEGER NOT NULL)",
    "CREATE TRIGGER IF NOT EXISTS batch_totals_insert AFTER INSERT ON batch_job BEGIN "
    "UPDATE batch_totals SET nbytes = nbytes + NEW.nbytes WHERE id = 0; END",
    "CREATE TRIGGER IF NOT EXISTS batch_totals_delete AFTER DELETE ON batch_job BEGIN "
    "UPDATE batch_totals SET nbytes = nbytes - OLD.nbytes WHERE id = 0; END",
    "CREATE TRIGGER IF NOT EXISTS batch_totals_update AFTER UPDATE OF nbytes ON batch_job "
    "WHEN NEW.nbytes IS NOT OLD.nbytes BEGIN "
    "UPDATE batch_totals SET nbytes = nbytes + NEW.nbytes - OLD.nbytes WHERE id = 0; END",
)
#: The running byte total kept by the triggers above.
TOTAL_NBYTES_SQL = "SELECT nbytes FROM batch_totals WHERE id = 0"
RECOMPUTE_TOTAL_SQL = (
    "INSERT OR REPLACE INTO batch_totals (id, nbytes) SELECT 0, COALESCE(SUM(nbytes), 0) FROM batch_job"
)
SCHEMA_NAMES = frozenset(
    {"batch_job", "batch_target", "batch_job_idem", "batch_job_lease", "batch_job_live"}
    | {"batch_job_evictable", "batch_totals", "batch_totals_insert", "batch_totals_delete"}
    | {"batch_totals_update", "batch_job_claim", "batch_target_pending", "batch_job_live_lease"}
)
#: What a read-only open requires: the indexes only claims and rescues read (writes, which a read-only
#: store refuses anyway) may be missing, so a store an earlier sift made opens read-only as it is.
READ_SCHEMA_NAMES = SCHEMA_NAMES - {"batch_job_claim", "batch_target_pending", "batch_job_live_lease"}


class SqliteSchema(SqliteBase):
    """The schema's part of the SQLite store's database: made whole at open, checked when read-only."""

    def prepare_schema(self) -> None:
        """Create what is missing, and recompute the byte total if anything was missing. Opening reads only
        the schema and the total's row, whatever the size of the store: a complete file is only read (so
        opening does not wait on another process's write), and a total another writer made drift is for
        ``check_store(repair=True)`` (``sift check --repair``) to find and mend."""
        present = {row[0] for row in self.execute_sql("SELECT name FROM sqlite_master")}
        if present >= SCHEMA_NAMES and self.execute_sql(TOTAL_NBYTES_SQL).fetchone() is not None:
            return
        with self.atomic():
            for statement in BASE_SCHEMA + SPEED_SCHEMA:
                self.execute_sql(statement)
            self.execute_sql(RECOMPUTE_TOTAL_SQL)

    def check_schema(self) -> None:
        """A read-only store cannot add what is missing: refuse a file that lacks part of the schema."""
        present = {row[0] for row in self.execute_sql("SELECT name FROM sqlite_master")}
        if {"batch_job", "batch_target"} <= present:
            self.check_columns()  # tables another program made are the first thing to name
        if missing := sorted(READ_SCHEMA_NAMES - present):
            raise StoreUnavailable.of_target(
                f"{self.path!r} lacks {', '.join(missing)}; open it once without readonly=True to add them"
            )

    def check_columns(self) -> None:
        """Refuse a file whose batch tables were made by someone else with other columns."""
        reference = sqlite3.connect(":memory:")
        try:
            for statement in BASE_SCHEMA:
                reference.execute(statement)
            for table in ("batch_job", "batch_target"):
                want = [row[1] for row in reference.execute(f"PRAGMA table_info({table})")]
                have = {row[1] for row in self.execute_sql(f"PRAGMA table_info({table})")}
                if missing := [name for name in want if name not in have]:
                    raise StoreUnavailable(f"table {table} lacks the column(s) {', '.join(missing)}")
        finally:
            reference.close()


def missing_in_file(path: str, *, timeout: float) -> list[str]:
    """The parts of the schema (tables, indexes, triggers) the existing SQLite file at ``path`` lacks, read
    without writing to it; [] when it cannot be read as a database (opening it says why)."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    try:
        with closing(sqlite3.connect(uri, uri=True, timeout=timeout)) as conn:
            present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError:
        return []
    return sorted(SCHEMA_NAMES - present)
