"""The store's table and column names, written once: every module and both backends read them here."""

from __future__ import annotations

__all__ = [
    "JOB_COLUMNS",
    "JOB_COLUMN_LIST",
    "CLAIM_COLUMNS",
    "JOB_TABLE",
    "STORE_TABLES",
    "TARGET_COLUMNS",
    "TARGET_COLUMN_LIST",
    "TARGET_TABLE",
    "TOTALS_TABLE",
    "HOST_COLUMN",
    "NOT_BEFORE_COLUMN",
    "NOT_BEFORE_VERSION",
    "HOSTS_VERSION",
    "HOST_POLICY_TABLE",
    "POLITENESS_VERSION",
    "PAUSED_CALLER_TABLE",
    "PAUSED_JOB_TABLE",
    "RING_TABLE",
    "SCHEMA_VERSION",
    "VERSION_TABLE",
]

JOB_TABLE = "batch_job"
TARGET_TABLE = "batch_target"
#: The running byte total (one row on SQLite, slot rows on PostgreSQL).
TOTALS_TABLE = "batch_totals"
#: PostgreSQL's record of the schema's version.
VERSION_TABLE = "sift_schema"
#: The claims' ring cursor: one row, the caller served last and the turns it has used (schema version 4).
RING_TABLE = "batch_claim_ring"
#: Politeness (schema version 8): each host's policy and pacing state, ``*`` the default's.
HOST_POLICY_TABLE = "batch_host_policy"
#: The paused jobs and the paused callers (schema version 8): claims take none of their targets.
PAUSED_JOB_TABLE = "batch_paused_job"
PAUSED_CALLER_TABLE = "batch_paused_caller"

#: The store's tables on PostgreSQL, in the order space reports list them; a SQLite store has all but
#: the version table.
STORE_TABLES = (
    JOB_TABLE,
    TARGET_TABLE,
    TOTALS_TABLE,
    VERSION_TABLE,
    RING_TABLE,
    HOST_POLICY_TABLE,
    PAUSED_JOB_TABLE,
    PAUSED_CALLER_TABLE,
)

#: A job's columns, in the order the tables (and the models' fields) take them.
JOB_COLUMNS = (
    "id",
    "caller",
    "caller_class",
    "idem_key",
    "status",
    "error",
    "targets_total",
    "targets_done",
    "created_at",
    "lease",
    "nbytes",
)
#: A target's columns, in the order the tables (and the models' fields) take them.
TARGET_COLUMNS = ("job_id", "idx", "url", "options", "status", "result", "error", "hint")

#: A target's claim: the runner holding it, the claim's heartbeat (unix seconds), how many times it was
#: claimed. Added by schema version 3, after the original columns, each with a SQL-side default (NULL, 0).
CLAIM_COLUMNS = ("runner", "heartbeat", "attempts")

#: The schema's version: PostgreSQL's ``sift_schema`` row, SQLite's ``PRAGMA user_version``. An older store
#: is upgraded by its first writable open, in one transaction.
SCHEMA_VERSION = 11

#: A target's host (``url_host(url)``), which per-host claim limits count. Added by schema version 4 as
#: ``TEXT NOT NULL DEFAULT ''``: a target another program inserts counts as host "".
HOST_COLUMN = "host"
#: The schema version whose ``url_host`` the stored hosts follow: the upgrade from an earlier version
#: computes every stored target's host again (version 4 added them; version 6 gave a site one name).
HOSTS_VERSION = 6
#: The schema version that made the politeness tables (host policies, paused jobs and callers).
POLITENESS_VERSION = 8

#: When a pending target may be claimed again (unix seconds; NULL: now), set by a retry. Added by schema
#: version 9 as a nullable column: a target another program inserts is claimable at once. Not a model field
#: (like the host): claims read it, the models never carry it.
NOT_BEFORE_COLUMN = "not_before"
#: The schema version that added it.
NOT_BEFORE_VERSION = 9

#: The columns as a SELECT or INSERT lists them.
JOB_COLUMN_LIST = ", ".join(JOB_COLUMNS)
TARGET_COLUMN_LIST = ", ".join(TARGET_COLUMNS)
