"""The batch job store: Peewee models, the store's database (a SQLite file, or PostgreSQL), and the functions
that hold its rules.

Open it once at start-up with :func:`open_db` (a path, or a ``postgresql://`` URL), then call the functions
from any thread.
"""

from .backends.sqlite import SerializedSqliteDatabase
from .backup import backup_store
from .claims import (
    claim_batch_targets,
    finish_batch_job,
    release_claims,
    renew_claims,
    requeue_in_flight,
    requeue_stale_claims,
    runner_name,
    stale_claims,
)
from .client import Submitted, cancel_batch_job, submit
from .clock import unix_now
from .counters import stats
from .database import StoreDatabase, close_db, db, open_db
from .errors import (
    BatchError,
    ClaimLost,
    DuplicateJob,
    IdempotencyConflict,
    InvalidBatchInput,
    JobNotFound,
    ModelWriteRefused,
    StoreConflict,
    StoreCorrupt,
    StoreFull,
    StoreMissing,
    StoreNotOpen,
    StoreReadOnly,
    StoreUnavailable,
    TargetNotFound,
)
from .hosts import url_host
from .integrity import check_store
from .load import store_load
from .manager import (
    batch_job,
    batch_job_by_idem,
    batch_nbytes,
    batch_targets,
    create_batch_job,
    evict_batch_oldest,
    evict_candidates,
    live_batch_jobs,
    live_batch_jobs_total,
    mark_in_flight_failed,
    put_batch_targets,
    rescue_stale_jobs,
    set_batch_job_status,
    submit_batch_job,
    sweep_batch,
    sweep_candidates,
    touch_batch_job,
    update_batch_target,
    update_batch_targets,
)
from .models import BatchJob, BatchTarget, CallerClass, JobStatus, TargetStatus
from .modelwrites import ModelRules  # noqa: F401  (importing it holds the models' writes to the rules)
from .reports import (
    BackupReport,
    CallerLoad,
    HostLoad,
    LoadReport,
    RelationSpace,
    RelationVacuumReport,
    RestoreReport,
    StoreReport,
    StoreSpace,
    VacuumReport,
)
from .restore import restore_store
from .space import (
    relation_space,
    store_space,
    vacuum_relations,
    vacuum_store,
)
from .validation import MAX_KEY_BYTES

__all__ = [
    "MAX_KEY_BYTES",
    "BackupReport",
    "BatchError",
    "BatchJob",
    "BatchTarget",
    "CallerClass",
    "CallerLoad",
    "ClaimLost",
    "DuplicateJob",
    "HostLoad",
    "IdempotencyConflict",
    "InvalidBatchInput",
    "JobNotFound",
    "ModelWriteRefused",
    "JobStatus",
    "LoadReport",
    "RelationSpace",
    "RelationVacuumReport",
    "RestoreReport",
    "SerializedSqliteDatabase",
    "StoreConflict",
    "StoreCorrupt",
    "StoreDatabase",
    "StoreFull",
    "StoreMissing",
    "StoreNotOpen",
    "StoreReadOnly",
    "StoreReport",
    "StoreSpace",
    "StoreUnavailable",
    "Submitted",
    "TargetNotFound",
    "TargetStatus",
    "VacuumReport",
    "backup_store",
    "batch_job",
    "batch_job_by_idem",
    "batch_nbytes",
    "batch_targets",
    "cancel_batch_job",
    "check_store",
    "claim_batch_targets",
    "close_db",
    "create_batch_job",
    "db",
    "evict_batch_oldest",
    "finish_batch_job",
    "evict_candidates",
    "live_batch_jobs",
    "live_batch_jobs_total",
    "mark_in_flight_failed",
    "open_db",
    "put_batch_targets",
    "relation_space",
    "release_claims",
    "renew_claims",
    "requeue_in_flight",
    "requeue_stale_claims",
    "rescue_stale_jobs",
    "restore_store",
    "runner_name",
    "set_batch_job_status",
    "stats",
    "store_load",
    "store_space",
    "submit",
    "submit_batch_job",
    "sweep_batch",
    "stale_claims",
    "sweep_candidates",
    "touch_batch_job",
    "unix_now",
    "update_batch_target",
    "update_batch_targets",
    "url_host",
    "vacuum_relations",
    "vacuum_store",
]
