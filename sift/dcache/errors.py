"""Every exception the batch store raises on purpose. Messages start with the field at fault."""


class BatchError(Exception):
    """Base class of every error raised by :mod:`sift.dcache`."""


class InvalidBatchInput(BatchError, ValueError):
    """An argument or model field is malformed; nothing was written."""


class JobNotFound(BatchError, LookupError):
    """A write named a job id that is not in the store."""


class TargetNotFound(BatchError, LookupError):
    """A write named a (job id, idx) that is not in the store."""


class DuplicateJob(BatchError):
    """A job with this id already exists."""


class StoreNotOpen(BatchError, RuntimeError):
    """No database is open: call ``open_db(path)`` first."""


class StoreUnavailable(BatchError):
    """The file cannot be used: not a SQLite database, unreadable, or locked past the busy timeout."""


class StoreReadOnly(StoreUnavailable):
    """A write was asked of a store opened with ``readonly=True``, or of a file SQLite may not write."""
