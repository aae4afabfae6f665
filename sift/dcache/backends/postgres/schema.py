"""The PostgreSQL store's schema: its DDL, created at open in one transaction, upgraded from an earlier
version, and checked read-only."""

from __future__ import annotations

import re

from ...errors import StoreMissing, StoreUnavailable
from ...hosts import backfill_hosts
from ...sqlfiles import load_sql
from ...tables import CLAIM_COLUMNS, HOSTS_VERSION, NOT_BEFORE_VERSION, POLITENESS_VERSION, SCHEMA_VERSION
from .base import PostgresBase

__all__ = ["MIGRATIONS", "SCHEMA", "SCHEMA_OBJECTS", "SCHEMA_VERSION", "TOTAL_SLOTS", "PostgresSchema"]

#: The byte-total slot rows: writers add to ``pg_backend_pid() % TOTAL_SLOTS``.
TOTAL_SLOTS = 16

_DDL = {
    name: tuple(
        statement.format(total_slots=TOTAL_SLOTS, last_slot=TOTAL_SLOTS - 1, schema_version=SCHEMA_VERSION)
        for statement in statements
    )
    for name, statements in load_sql(__package__, "schema.sql").items()
}

#: Version 2: what claim_batch_targets and rescue_stale_jobs read.
VERSION_2_INDEXES = _DDL["version_2"]

#: Version 3: the claims' columns and index.
VERSION_3_CLAIMS = _DDL["version_3"]

#: Version 4: the targets' host column, the ring's indexes and its cursor row.
VERSION_4_RING = _DDL["version_4"]

#: Version 5: the index of pending targets by idx dropped (claims read batch_target_host alone).
VERSION_5_ONE_PENDING_INDEX = _DDL["version_5"]

#: Version 6: no DDL; every stored target's host is computed again (see :data:`HOSTS_VERSION`).
VERSION_6_SITE_HOSTS: tuple[str, ...] = ()

#: Version 7: a job's change of status or targets_done announced to wait_for_batch_job (NOTIFY).
VERSION_7_ANNOUNCE = _DDL["version_7"]

#: Version 8: politeness, the host policies and the paused jobs and callers.
VERSION_8_PACING = _DDL["version_8"]

#: Version 9: a retried target's not_before, and the index of pending targets without the waiting ones.
VERSION_9_DELAYED = _DDL["version_9"]

#: Version 10: the pending targets by host, which a host's back-off moves out of the claims' index and back.
VERSION_10_HELD_HOSTS = _DDL["version_10"]

#: Version 11: the claim as a server function (claim.sql, made as written: its body is no format string).
VERSION_11_CLAIM = load_sql(__package__, "claim.sql")["version_11"]

#: What takes a store from the version given to the next one, in the transaction that records the next.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: VERSION_2_INDEXES,
    2: VERSION_3_CLAIMS,
    3: VERSION_4_RING,
    4: VERSION_5_ONE_PENDING_INDEX,
    5: VERSION_6_SITE_HOSTS,
    6: VERSION_7_ANNOUNCE,
    7: VERSION_8_PACING,
    8: VERSION_9_DELAYED,
    9: VERSION_10_HELD_HOSTS,
    10: VERSION_11_CLAIM,
}

#: The schema, created in one transaction under an advisory lock (see :meth:`PostgresSchema.create_schema`).
#: Version 3's and 4's columns add nothing to tables made here; they upgrade tables an earlier program made.
#: Version 9's column is added to a new table too, and its index of pending targets replaces version 4's.
SCHEMA = (
    _DDL["tables"]
    + VERSION_2_INDEXES
    + VERSION_3_CLAIMS
    + VERSION_4_RING
    + VERSION_7_ANNOUNCE
    + VERSION_8_PACING
    + VERSION_9_DELAYED
    + VERSION_10_HELD_HOSTS
    + VERSION_11_CLAIM
    + _DDL["totals"]
)

_CREATED = re.compile(r"CREATE (?:OR REPLACE )?(TABLE|INDEX|TRIGGER|FUNCTION) (?:IF NOT EXISTS )?(\w+)")
#: The schema's objects as (kind, name), as the DDL creates them (the tables' primary keys come with them).
SCHEMA_OBJECTS = frozenset(
    (match.group(1).lower(), match.group(2))
    for statement in SCHEMA
    if (match := _CREATED.match(statement)) is not None
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
                    raise StoreMissing.of_target(
                        f"{self.path!r} holds no batch store; open it once without readonly=True"
                    )
                if not self.create:
                    raise StoreMissing.of_target(f"no store at {self.path!r}")
                self.create_schema()
            version = self._version()
            if version in MIGRATIONS and not self.readonly:
                self._migrate()
                version = self._version()
            self.claims_stored = version == SCHEMA_VERSION or self._has_claim_columns()
            self.statement_key = "postgres" if self.claims_stored else "postgres without claims"
            self.hosts_stored = version is not None and version >= HOSTS_VERSION
            self.politeness_stored = version is not None and version >= POLITENESS_VERSION
            self.delays_stored = version is not None and version >= NOT_BEFORE_VERSION
            if version != SCHEMA_VERSION and not (self.readonly and version in MIGRATIONS):
                upgrade = (
                    "; open it once without readonly=True to upgrade it" if version in MIGRATIONS else ""
                )
                raise StoreUnavailable.of_target(
                    f"{self.path!r} has schema version {version}; "
                    f"this sift knows version {SCHEMA_VERSION}{upgrade}"
                )

    def _has_claim_columns(self) -> bool:
        """Whether batch_target has the claims' columns (a read-only open of an older version may lack them:
        its reads then show every target unclaimed, with no attempts)."""
        row = self.fetch_one(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass('batch_target') "
            "AND attname = ANY(%s) AND NOT attisdropped",
            (list(CLAIM_COLUMNS),),
        )
        return int(row[0]) == len(CLAIM_COLUMNS)

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
            version = start = self._version()  # read again under the lock: another process may have migrated
            while version in MIGRATIONS:
                for statement in MIGRATIONS[version]:
                    self.run_sql(statement, ())
                version += 1
                self.run_sql("UPDATE sift_schema SET version = %s WHERE id = 0", (version,))
            if start is not None and start < HOSTS_VERSION:  # once, as every insert now writes them
                backfill_hosts(self.fetch_all, self.executemany, "%s")
