"""The batch job store: Peewee models, the store's database (a SQLite file, or PostgreSQL), and the functions
that hold its rules.

Open it once at start-up with :func:`open_db` (a path, or a ``postgresql://`` URL), then call the functions
from any thread.
"""

import warnings
from typing import TYPE_CHECKING, Any

from . import modelwrites  # importing it holds the models' writes to its guard
from .backends.sqlite import SerializedSqliteDatabase
from .backup import backup_store
from .claims import (
    claim_batch_targets,
    finish_batch_job,
    finish_complete_jobs,
    release_claims,
    renew_claims,
    requeue_in_flight,
    requeue_stale_claims,
    runner_name,
    stale_claims,
)
from .client import Submitted, cancel_batch_job, submit
from .clock import unix_now, unix_now_ms
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
from .politeness import (
    HostPolicy,
    back_off_host,
    backed_off_hosts,
    host_policies,
    pause_batch_job,
    pause_caller,
    paused_callers,
    paused_jobs,
    release_host,
    resume_batch_job,
    resume_caller,
    set_host_policy,
)
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
from .retries import retry_batch_target, retry_batch_targets, retry_failed_targets
from .space import (
    relation_space,
    store_space,
    vacuum_relations,
    vacuum_store,
)
from .validation import (
    MAX_ATTEMPTS,
    MAX_KEY_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_OPTIONS_BYTES,
    MAX_RESULT_BYTES,
    MAX_URL_BYTES,
)
from .waiting import MAX_WAIT_SECONDS, wait_for_batch_job

__all__ = [
    "finish_complete_jobs",
    "MAX_ATTEMPTS",
    "MAX_KEY_BYTES",
    "MAX_MESSAGE_BYTES",
    "MAX_OPTIONS_BYTES",
    "MAX_RESULT_BYTES",
    "MAX_URL_BYTES",
    "MAX_WAIT_SECONDS",
    "BackupReport",
    "BatchError",
    "BatchJob",
    "BatchTarget",
    "CallerClass",
    "CallerLoad",
    "ClaimLost",
    "DuplicateJob",
    "HostLoad",
    "HostPolicy",
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
    "back_off_host",
    "backed_off_hosts",
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
    "host_policies",
    "evict_candidates",
    "live_batch_jobs",
    "live_batch_jobs_total",
    "mark_in_flight_failed",
    "open_db",
    "pause_batch_job",
    "pause_caller",
    "paused_callers",
    "paused_jobs",
    "put_batch_targets",
    "relation_space",
    "release_claims",
    "retry_batch_target",
    "retry_batch_targets",
    "retry_failed_targets",
    "renew_claims",
    "requeue_in_flight",
    "requeue_stale_claims",
    "rescue_stale_jobs",
    "restore_store",
    "release_host",
    "resume_batch_job",
    "resume_caller",
    "runner_name",
    "set_batch_job_status",
    "set_host_policy",
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
    "unix_now_ms",
    "update_batch_target",
    "update_batch_targets",
    "url_host",
    "vacuum_relations",
    "vacuum_store",
    "wait_for_batch_job",
]


if not TYPE_CHECKING:  # unseen by mypy, which would otherwise take any name the package lacks

    def __getattr__(name: str) -> Any:
        """The names kept for code that imports them, each with a DeprecationWarning naming its successor."""
        if name == "ModelRules":
            warnings.warn(
                "sift.dcache.ModelRules is deprecated: it is sift.dcache.modelwrites.ModelWriteGuard",
                DeprecationWarning,
                stacklevel=2,
            )
            return modelwrites.ModelWriteGuard
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
