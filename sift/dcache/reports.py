"""What the store's checks and maintenance report: plain data, with no behaviour beyond showing itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "BackupReport",
    "CallerLoad",
    "HostLoad",
    "LoadReport",
    "RelationSpace",
    "RelationVacuumReport",
    "Repair",
    "RestoreReport",
    "StoreReport",
    "StoreSpace",
    "VacuumReport",
    "Violation",
]


@dataclass(frozen=True)
class _Entry:
    kind: str
    job_id: str | None  # the job it is about; None for the whole store
    detail: str

    def __str__(self) -> str:
        where = "" if self.job_id is None else f" (job {self.job_id!r})"
        return f"{self.kind}{where}: {self.detail}"


@dataclass(frozen=True)
class Violation(_Entry):
    """One broken invariant; ``job_id`` names the job it affects (None for the whole store)."""


@dataclass(frozen=True)
class Repair(_Entry):
    """One change ``check_store(repair=True)`` made: the kind it mended, the job, and what changed."""


@dataclass
class StoreReport:
    """What ``check_store`` found (``violations``, as found before any repair) and changed (``repairs``)."""

    jobs: int = 0
    targets: int = 0
    violations: list[Violation] = field(default_factory=list)
    repairs: list[Repair] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the store was consistent (a repaired store was not: check again to see it is now)."""
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        return {
            "ok": self.ok,
            "jobs": self.jobs,
            "targets": self.targets,
            "violations": [asdict(v) for v in self.violations],
            "repairs": [asdict(r) for r in self.repairs],
        }

    def __str__(self) -> str:
        head = f"{self.jobs} jobs, {self.targets} targets: "
        head += "ok" if self.ok else f"{len(self.violations)} violation(s)"
        lines = [head, *(f"  {v}" for v in self.violations)]
        lines += [f"  repaired {r}" for r in self.repairs]
        return "\n".join(lines)


@dataclass(frozen=True)
class StoreSpace:
    """How the store file's pages are used: read from SQLite's header, without a scan."""

    page_size: int
    page_count: int
    free_pages: int
    auto_vacuum: int  # 0 NONE, 1 FULL, 2 INCREMENTAL

    @property
    def live_bytes(self) -> int:
        """Bytes of the pages in use."""
        return (self.page_count - self.free_pages) * self.page_size

    @property
    def reclaimable_bytes(self) -> int:
        """Bytes of the free pages, which :func:`~sift.dcache.vacuum_store` gives back to the file system."""
        return self.free_pages * self.page_size


@dataclass(frozen=True)
class VacuumReport:
    """What :func:`~sift.dcache.vacuum_store` did."""

    converted: bool  # the file was rewritten to auto_vacuum = INCREMENTAL
    before: StoreSpace
    after: StoreSpace


@dataclass(frozen=True)
class RelationSpace:
    """The store's tables on PostgreSQL: each one's bytes on disk (``pg_total_relation_size``: the table,
    its indexes and TOAST) and its dead rows as the server's statistics count them (an estimate that
    autovacuum and ANALYZE refresh)."""

    table_bytes: dict[str, int]
    dead_rows: dict[str, int]

    @property
    def total_bytes(self) -> int:
        """Bytes of all of the store's tables, with their indexes."""
        return sum(self.table_bytes.values())


@dataclass(frozen=True)
class RelationVacuumReport:
    """What :func:`~sift.dcache.vacuum_relations` did: the tables' space before and after ``VACUUM``."""

    before: RelationSpace
    after: RelationSpace


@dataclass(frozen=True)
class BackupReport:
    """What :func:`~sift.dcache.backup_store` wrote."""

    dest: str
    pages: int
    page_size: int

    @property
    def nbytes(self) -> int:
        return self.pages * self.page_size


@dataclass(frozen=True)
class RestoreReport:
    """What :func:`~sift.dcache.restore_store` copied."""

    source: str
    jobs: int
    targets: int


@dataclass(frozen=True)
class CallerLoad:
    """One caller's outstanding work: its live jobs' pending and running targets."""

    caller: str
    pending: int
    running: int


@dataclass(frozen=True)
class HostLoad:
    """One host's running targets (the host of their URLs, as :func:`~sift.dcache.url_host` counts it)."""

    host: str
    running: int


@dataclass(frozen=True)
class LoadReport:
    """What :func:`~sift.dcache.store_load` read: the busiest callers and hosts, each list capped, and the
    rest summed in ``other_callers`` and ``other_hosts`` (with how many callers and hosts they sum)."""

    callers: list[CallerLoad]
    other_callers: CallerLoad
    more_callers: int
    hosts: list[HostLoad]
    other_hosts: HostLoad
    more_hosts: int

    def as_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        return asdict(self)
