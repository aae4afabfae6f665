"""The SQLite store's schema: its DDL, created and repaired at open time, and checked read-only."""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from pathlib import Path

from ...errors import StoreUnavailable
from ...hosts import backfill_hosts
from ...sqlfiles import load_sql
from ...tables import CLAIM_COLUMNS, HOST_COLUMN, HOSTS_VERSION, NOT_BEFORE_COLUMN, SCHEMA_VERSION
from .base import SqliteBase

__all__ = [
    "BASE_SCHEMA",
    "NEW_FILE_SCHEMA",
    "READ_SCHEMA_NAMES",
    "RETIRED_NAMES",
    "RETIRED_SCHEMA",
    "RECOMPUTE_TOTAL_SQL",
    "SCHEMA_NAMES",
    "SPEED_SCHEMA",
    "OWN_INDEXES",
    "OWN_TRIGGERS",
    "TOTAL_NBYTES_SQL",
    "SqliteSchema",
    "missing_in_file",
]

_DDL = load_sql(__package__, "schema.sql")

#: The original schema, verbatim. Files written by the Go service have exactly these tables.
BASE_SCHEMA = _DDL["base"]
#: What the hot paths need to stay flat in history, version 8's politeness tables, and the byte total's
#: table and triggers.
SPEED_SCHEMA = _DDL["speed"] + _DDL["claims"] + _DDL["pacing"] + _DDL["totals"]

#: Version 3's columns of batch_target, each added when missing (see :meth:`SqliteSchema.prepare_schema`).
CLAIM_COLUMN_DDL = dict(zip(CLAIM_COLUMNS, _DDL["claim_columns"], strict=True))
#: Version 4's column of batch_target, added when missing and then filled in for the stored targets.
(HOST_COLUMN_DDL,) = _DDL["host_column"]
#: Version 9's column of batch_target, added when missing (every stored target claimable at once).
(NOT_BEFORE_COLUMN_DDL,) = _DDL["not_before_column"]
#: A new file's whole schema, each column before the indexes on it, and its version: what a copy written
#: from scratch runs (without the version, its first open would upgrade it, reading every target).
NEW_FILE_SCHEMA = (
    *BASE_SCHEMA,
    *CLAIM_COLUMN_DDL.values(),
    HOST_COLUMN_DDL,
    NOT_BEFORE_COLUMN_DDL,
    *SPEED_SCHEMA,
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)
#: Dropped at open where an earlier version made them (see schema.sql).
RETIRED_SCHEMA = _DDL["retired"]

#: The running byte total kept by the triggers above.
TOTAL_NBYTES_SQL = "SELECT nbytes FROM batch_totals WHERE id = 0"
RECOMPUTE_TOTAL_SQL = (
    "INSERT OR REPLACE INTO batch_totals (id, nbytes) SELECT 0, COALESCE(SUM(nbytes), 0) FROM batch_job"
)


def _names(statements: tuple[str, ...]) -> frozenset[str]:
    """The tables, indexes and triggers ``statements`` create."""
    return frozenset(match.group(1) for statement in statements if (match := _CREATED.match(statement)))


_CREATED = re.compile(r"CREATE (?:TABLE|INDEX|TRIGGER) IF NOT EXISTS (\w+)")
#: The retired parts, by name.
RETIRED_NAMES = frozenset(re.findall(r"DROP INDEX IF EXISTS (\w+)", " ".join(RETIRED_SCHEMA)))
#: Every part of the schema, by name, as the DDL creates them.
SCHEMA_NAMES = _names(BASE_SCHEMA + SPEED_SCHEMA)
#: The triggers the DDL creates, by name, as ``sqlite_master`` keeps their text: a file may hold no other.
OWN_TRIGGERS = {
    name: statement.replace(" IF NOT EXISTS", "", 1)
    for statement in SPEED_SCHEMA
    if statement.startswith("CREATE TRIGGER") and (name := statement.split()[5])
}
#: The indexes sift adds, by name, as ``sqlite_master`` keeps their text: open_db makes again one whose
#: stored text differs (an earlier version's definition).
OWN_INDEXES = {
    name: statement.replace(" IF NOT EXISTS", "", 1)
    for statement in SPEED_SCHEMA
    if statement.startswith("CREATE INDEX") and (name := statement.split()[5])
}
#: What a read-only open requires: the indexes only claims and rescues read (writes, which a read-only
#: store refuses anyway) and the politeness tables may be missing, so a store an earlier sift made opens
#: read-only as it is.
#: Version 8's politeness tables: a read-only open of an older file reads no policy, back-off or pause.
POLITENESS_NAMES = _names(_DDL["pacing"])
READ_SCHEMA_NAMES = SCHEMA_NAMES - _names(_DDL["claims"]) - POLITENESS_NAMES


class SqliteSchema(SqliteBase):
    """The schema's part of the SQLite store's database: made whole at open, checked when read-only."""

    def prepare_schema(self) -> None:
        """Create what is missing (and drop what is retired), and recompute the byte total if anything was
        missing. Opening reads only
        the schema and the total's row, whatever the size of the store: a complete file is only read (so
        opening does not wait on another process's write), and a total another writer made drift is for
        ``check_store(repair=True)`` (``sift check --repair``) to find and mend.

        The upgrade of an older file (the original service's, or an earlier sift's: the claims' columns, the
        host column, every stored target's host computed again from its URL where the file is older than
        :data:`HOSTS_VERSION`, the new indexes, and ``user_version``) is the
        same one transaction; an index of sift's whose stored
        definition is an earlier version's is dropped and made again in it."""
        present = dict(self.execute_sql("SELECT name, sql FROM sqlite_master").fetchall())
        redefined = [name for name, text in OWN_INDEXES.items() if present.get(name, text) != text]
        self.use_claim_columns(True)
        self.hosts_stored = True
        self.politeness_stored = True
        if (
            present.keys() >= SCHEMA_NAMES
            and not redefined
            and not present.keys() & RETIRED_NAMES
            and self.execute_sql("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION
            and self.execute_sql(TOTAL_NBYTES_SQL).fetchone() is not None
        ):
            return
        with self.atomic():
            for statement in BASE_SCHEMA:
                self.execute_sql(statement)
            for name in self.missing_claim_columns():
                self.execute_sql(CLAIM_COLUMN_DDL[name])
            if not self.has_host_column():
                self.execute_sql(HOST_COLUMN_DDL)
            if not self.has_column(NOT_BEFORE_COLUMN):
                self.execute_sql(NOT_BEFORE_COLUMN_DDL)
            if self.execute_sql("PRAGMA user_version").fetchone()[0] < HOSTS_VERSION:
                backfill_hosts(self.fetch_all, self.executemany, "?")
            for name in redefined:
                self.execute_sql(f"DROP INDEX {name}")
            for statement in SPEED_SCHEMA + RETIRED_SCHEMA:
                self.execute_sql(statement)
            self.execute_sql(RECOMPUTE_TOTAL_SQL)
            if self.execute_sql("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                self.execute_sql(f"PRAGMA user_version = {SCHEMA_VERSION}")
        # The upgrade may have rewritten every target (its host): copy its pages back and empty the -wal
        # file now, in the open that wrote them. Left to the first writes after it, the copy and the cut of
        # a -wal file of hundreds of MB fell inside their lock holds (hundreds of ms).
        self.checkpoint(truncate=True)

    def missing_claim_columns(self) -> list[str]:
        """The claims' columns batch_target lacks (all of them in a file an earlier program wrote)."""
        have = {row[1] for row in self.execute_sql("PRAGMA table_info(batch_target)")}
        return [name for name in CLAIM_COLUMNS if name not in have]

    def has_host_column(self) -> bool:
        """Whether batch_target has version 4's host column."""
        return self.has_column(HOST_COLUMN)

    def has_column(self, name: str) -> bool:
        """Whether batch_target has the column ``name``."""
        return any(row[1] == name for row in self.execute_sql("PRAGMA table_info(batch_target)"))

    def use_claim_columns(self, stored: bool) -> None:
        """Whether the store's statements read the claims' columns: a read-only open of an older file has
        none, and reads it as if every target were unclaimed, with no attempts."""
        self.claims_stored = stored
        self.statement_key = "sqlite" if stored else "sqlite without claims"

    def check_schema(self) -> None:
        """A read-only store cannot add what is missing: refuse a file that lacks part of the schema."""
        present = {row[0] for row in self.execute_sql("SELECT name FROM sqlite_master")}
        if {"batch_job", "batch_target"} <= present:
            self.check_columns()  # tables another program made are the first thing to name
        if missing := sorted(READ_SCHEMA_NAMES - present):
            raise StoreUnavailable.of_target(
                f"{self.path!r} lacks {', '.join(missing)}; open it once without readonly=True to add them"
            )
        self.use_claim_columns(not self.missing_claim_columns())
        current = self.execute_sql("PRAGMA user_version").fetchone()[0] >= HOSTS_VERSION
        self.hosts_stored = current and self.has_host_column()
        self.politeness_stored = present >= POLITENESS_NAMES

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
