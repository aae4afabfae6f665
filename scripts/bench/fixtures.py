"""Fixture stores, built with plain SQL in bulk (untimed): a SQLite file the store then opens, or a
PostgreSQL schema the store created. Each ``jobs`` call adds numbered jobs with their targets."""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from sift import dcache

# The raw baseline runs on the store's own connection settings, and a bulk-built file starts from the
# store's base tables: neither is in sift.dcache's public API.
from sift.dcache.backends.sqlite.schema import BASE_SCHEMA
from sift.dcache.backends.sqlite.settings import PRAGMAS
from sift.dcache.tables import JOB_COLUMN_LIST

from .harness import checkpoints_settled
from .sizes import FINISHED, OPTIONS
from .stores import PgServer


def raw_connect(path: Path, *, bulk: bool = False) -> sqlite3.Connection:
    """A plain sqlite3 connection in autocommit mode. ``bulk``: no journal, for building fixtures fast
    (the file is switched to WAL when the builder closes); otherwise the package's pragmas."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
    pragmas: dict[str, object] = {"journal_mode": "off", "synchronous": "off"} if bulk else PRAGMAS
    for name, value in pragmas.items():
        conn.execute(f"PRAGMA {name} = {value}")
    return conn


class Builder:
    """Bulk-inserts fixture rows with plain SQL (recursive CTEs) into a file the package will open.

    The package is closed while it runs. On a new file, ``open_db`` then adds the speed schema and
    computes the byte total, as for a file written by another program; on a store file, the store's
    triggers keep the total while the rows go in.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = raw_connect(path, bulk=True)
        for statement in BASE_SCHEMA:
            self.conn.execute(statement)
        self.conn.execute("BEGIN")

    def jobs(
        self,
        prefix: str,
        count: int,
        *,
        targets: int,
        result_bytes: int | None,
        lease0: int,
        statuses: tuple[str, ...] = FINISHED,
        callers: int = 100,
    ) -> None:
        """``count`` jobs ``{prefix}{i:07d}`` with ``targets`` targets each; result_bytes None: pending
        targets without results, else finished targets holding that many bytes each."""
        done = 0 if result_bytes is None else targets
        nbytes = 0 if result_bytes is None else targets * result_bytes
        status_sql = "CASE i % {} {} END".format(
            len(statuses), " ".join(f"WHEN {k} THEN '{s}'" for k, s in enumerate(statuses))
        )
        self.conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
            f"INSERT INTO batch_job ({JOB_COLUMN_LIST}) "
            f"SELECT ? || printf('%07d', i), 'caller-' || (i % ?), 'fleet', ? || 'idem-' || i, {status_sql}, "
            "'', ?, ?, ? + i, ? + i, ? FROM n",
            (count, prefix, callers, prefix, targets, done, lease0, lease0, nbytes),
        )
        if targets:
            self.targets_of("b.id LIKE ?", prefix + "%", targets, result_bytes)

    def one_job(
        self, job_id: str, *, caller: str, status: str, targets: int, result_bytes: int | None, lease: int
    ) -> None:
        """One job, created at ``lease``, with its targets as in :meth:`jobs`."""
        done, nbytes = (0, 0) if result_bytes is None else (targets, targets * result_bytes)
        self.conn.execute(
            f"INSERT INTO batch_job ({JOB_COLUMN_LIST}) VALUES (?, ?, 'fleet', '', ?, '', ?, ?, ?, ?, ?)",
            (job_id, caller, status, targets, done, lease, lease, nbytes),
        )
        if targets:
            self.targets_of("b.id = ?", job_id, targets, result_bytes)

    def targets_of(self, where: str, param: str, targets: int, result_bytes: int | None) -> None:
        """``targets`` targets for each job matching ``where``: pending, or done with a result."""
        params: tuple[object, ...]
        if result_bytes is None:
            status, result, params = "'pending'", "NULL", (targets, param)
        else:
            status, result, params = "'done'", "printf('%.*c', ?, 'r')", (targets, result_bytes, param)
        self.conn.execute(
            "WITH RECURSIVE n(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM n WHERE j + 1 < ?) "
            "INSERT INTO batch_target (job_id, idx, url, options, status, result, error, hint) "
            f"SELECT b.id, n.j, 'https://example.com/' || b.id || '/' || n.j, '{OPTIONS}', {status}, "
            f"{result}, NULL, NULL FROM batch_job AS b, n WHERE {where} ORDER BY b.id, n.j",
            params,
        )

    def close(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.execute("PRAGMA journal_mode = wal")
        self.conn.close()
        # The bulk insert ran with synchronous=off: flush its pages to disk now, or the store's first
        # checkpoint fsync would pay for the whole fixture inside a timed lock hold.
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def wal_frames(path: Path, step: Callable[[int], object], start: int, count: int) -> dict[str, float] | None:
    """The -wal frames that ``step(start) .. step(start + count - 1)`` append to the file at ``path``, per
    call: in all, and by the table or index each frame's page belongs to (SQLite's dbstat). The -wal file
    is emptied first (a TRUNCATE checkpoint), and ``count`` must keep it under the next checkpoint: a
    restart of the -wal file in between stops the run. None if this SQLite has no dbstat table."""
    checkpoints_settled()  # a checkpoint of the store's running aside would make the TRUNCATE busy
    probe = sqlite3.connect(path, isolation_level=None)
    try:
        ((busy, _, _),) = probe.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        if busy:
            raise SystemExit(f"bench: could not empty {path}-wal before counting its frames")
        step(start)
        wal = Path(f"{path}-wal")
        restarts = wal.read_bytes()[12:16]  # the header's checkpoint sequence number
        for i in range(start + 1, start + count):
            step(i)
        data = wal.read_bytes()
        if data[12:16] != restarts:
            raise SystemExit(
                f"bench: {path}-wal was checkpointed and restarted while its frames were counted"
            )
        try:
            names = dict(probe.execute("SELECT pageno, name FROM dbstat").fetchall())
        except sqlite3.OperationalError:  # a SQLite built without the dbstat table
            return None
        ((page_size,),) = probe.execute("PRAGMA page_size").fetchall()
    finally:
        probe.close()
    frames = (len(data) - 32) // (24 + page_size)
    pages = (
        int.from_bytes(data[at : at + 4], "big")
        for at in range(32, 32 + frames * (24 + page_size), 24 + page_size)
    )
    by_tree = Counter(names.get(page, "(free)") for page in pages)
    return {"all": frames / count} | {tree: n / count for tree, n in by_tree.most_common()}


def wal_bytes(path: Path) -> int:
    """The size of the store's -wal file, 0 when there is none."""
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


class PgBuilder:
    """Bulk-inserts fixture rows with plain SQL (generate_series) into a store's schema, as
    :class:`Builder` does on SQLite. The byte-total trigger is off while the rows go in (one slot row
    updated 100,000 times in one transaction took 80 s), and the total is recomputed at the end; then
    VACUUM ANALYZE, the state autovacuum brings a loaded table to."""

    def __init__(self, server: PgServer, schema: str, *, create: bool = True) -> None:
        """``create``: the store's schema is made here first; otherwise it exists already."""
        if create:
            dcache.open_db(server.target(schema))
            dcache.close_db()
        self.conn = server.connect(schema)
        self.conn.execute("ALTER TABLE batch_job DISABLE TRIGGER batch_totals_track")

    def jobs(
        self,
        prefix: str,
        count: int,
        *,
        targets: int,
        result_bytes: int | None,
        lease0: int,
        statuses: tuple[str, ...] = FINISHED,
        callers: int = 100,
    ) -> None:
        """The same jobs as :meth:`Builder.jobs`."""
        done = 0 if result_bytes is None else targets
        nbytes = 0 if result_bytes is None else targets * result_bytes
        self.conn.execute(
            f"INSERT INTO batch_job ({JOB_COLUMN_LIST}) "
            "SELECT %s || lpad(i::text, 7, '0'), 'caller-' || (i %% %s), 'fleet', %s || 'idem-' || i, "
            "(%s::text[])[i %% %s + 1], '', %s, %s, %s + i, %s + i, %s "
            "FROM generate_series(0, %s - 1) AS i",
            (
                prefix,
                callers,
                prefix,
                list(statuses),
                len(statuses),
                targets,
                done,
                lease0,
                lease0,
                nbytes,
                count,
            ),
        )
        if targets:
            self.targets_of("b.id LIKE %s", prefix + "%", targets, result_bytes)

    def one_job(
        self, job_id: str, *, caller: str, status: str, targets: int, result_bytes: int | None, lease: int
    ) -> None:
        """One job, created at ``lease``, with its targets as in :meth:`jobs`."""
        done, nbytes = (0, 0) if result_bytes is None else (targets, targets * result_bytes)
        self.conn.execute(
            f"INSERT INTO batch_job ({JOB_COLUMN_LIST}) "
            "VALUES (%s, %s, 'fleet', '', %s, '', %s, %s, %s, %s, %s)",
            (job_id, caller, status, targets, done, lease, lease, nbytes),
        )
        if targets:
            self.targets_of("b.id = %s", job_id, targets, result_bytes)

    def targets_of(self, where: str, param: str, targets: int, result_bytes: int | None) -> None:
        status, result = ("'pending'", "NULL") if result_bytes is None else ("'done'", "repeat('r', %s)")
        params = ([] if result_bytes is None else [result_bytes]) + [targets, param]
        self.conn.execute(  # host: url_host of the URL, as every insert of the package writes it
            "INSERT INTO batch_target (job_id, idx, url, options, status, result, host) "
            f"SELECT b.id, n.j, 'https://example.com/' || b.id || '/' || n.j, '{OPTIONS}', {status}, "
            f"{result}, 'example.com' FROM batch_job AS b, generate_series(0, %s - 1) AS n(j) "
            f"WHERE {where} ORDER BY b.id, n.j",
            params,
        )

    def close(self) -> None:
        self.conn.execute("ALTER TABLE batch_job ENABLE TRIGGER batch_totals_track")
        self.conn.execute(
            "UPDATE batch_totals SET nbytes = CASE WHEN slot = 0 "
            "THEN (SELECT COALESCE(SUM(nbytes), 0) FROM batch_job) ELSE 0 END"
        )
        self.conn.execute("VACUUM ANALYZE batch_job, batch_target, batch_totals")
        self.conn.close()
