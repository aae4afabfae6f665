"""Disk space that follows the data: free pages go back to the file system a few at a time.

A new store is created with ``auto_vacuum = INCREMENTAL`` (see the SQLite backend's ``files`` module): SQLite
then keeps a map of every page's parent, so ``PRAGMA incremental_vacuum`` can move the last pages of the
file into free ones and cut the file short. Sweep and eviction call :func:`reclaim_free_pages` inside
each chunk's transaction, a bounded number of pages at a time, then :func:`reclaim_all` for whatever the
chunk freed beyond that, in short transactions of their own: the free list stays short, which is what
keeps each step cheap (moving a page searches the free list for a slot before it: evicting 90% of 1 GB,
a list left to grow to 300,000 pages made steps of 64 pages take up to 80 ms; kept short, steps of up to
256 pages took under 5 ms). The file itself shrinks when the -wal file is checkpointed.

A file created before this (or by another program) has ``auto_vacuum = NONE``, and SQLite can only
change that by rewriting the whole file: :func:`vacuum_store` does so once (``sift vacuum``).

On PostgreSQL the space is the server's: a delete leaves dead rows that (auto)vacuum makes reusable, and
only the empty pages at a table's end go back to the file system. :func:`relation_space` reads the size
of each of the store's tables (with its indexes and TOAST) and the server's count of its dead rows, and
:func:`vacuum_relations` runs ``VACUUM (ANALYZE)`` on them now rather than when autovacuum gets to it.
"""

from __future__ import annotations

from .backends import INCREMENTAL
from .database import db
from .errors import StoreReadOnly, StoreUnavailable
from .reports import RelationSpace, RelationVacuumReport, StoreSpace, VacuumReport
from .tables import STORE_TABLES

__all__ = [
    "FREED_PAGES_PER_STEP",
    "TRANSACTIONS_PER_CHECKPOINT",
    "INCREMENTAL",
    "file_backed",
    "reclaim_all",
    "reclaim_free_pages",
    "relation_space",
    "store_space",
    "vacuum_relations",
    "vacuum_store",
]


#: Write transactions in a row between two checkpoints inside ``bulk_writes()`` (sweep and eviction chunks,
#: and :func:`reclaim_all`'s steps); the checkpoints run with the lock free.
TRANSACTIONS_PER_CHECKPOINT = 4

#: Most free pages one step gives back, with the lock held (steps of up to 256 took under 5 ms: see above).
FREED_PAGES_PER_STEP = 256


def _pragma(name: str) -> int:
    return db.backend.pragma_value(name)


def file_backed(call: str | None = None) -> bool:
    """Whether the open store is a SQLite file (or memory): pages and their free list are SQLite's, and
    PostgreSQL's autovacuum gives space back by itself. With ``call``, a PostgreSQL store is refused."""
    if db.backend.has_pages:
        return True
    if call is not None:
        raise StoreUnavailable(
            f"{call}: a SQLite file's pages; a PostgreSQL store's space is the server's (see "
            "relation_space() and vacuum_relations())"
        )
    return False


def relation_space() -> RelationSpace:
    """PostgreSQL: the bytes of each of the store's tables (with its indexes and TOAST) and its dead rows
    (the server's statistics). Raises ``StoreUnavailable`` on SQLite (see :func:`store_space`)."""
    if file_backed():
        raise StoreUnavailable("relation_space: a PostgreSQL store's tables; a SQLite file has store_space()")
    found = db.backend.relation_sizes()
    return RelationSpace(
        table_bytes={name: found[name][0] for name in STORE_TABLES if name in found},
        dead_rows={name: found[name][1] for name in STORE_TABLES if name in found},
    )


def vacuum_relations() -> RelationVacuumReport:
    """PostgreSQL: ``VACUUM (ANALYZE)`` the store's tables now (outside any transaction: VACUUM cannot
    run inside one). Dead rows become reusable and empty pages at a table's end go back to the file
    system; other sessions go on reading and writing meanwhile. Raises ``StoreReadOnly`` on a read-only
    store, ``StoreUnavailable`` inside a transaction or on SQLite (see :func:`vacuum_store`)."""
    if file_backed():
        raise StoreUnavailable(
            "vacuum_relations: a PostgreSQL store's tables; a SQLite file has vacuum_store()"
        )
    if db.readonly:
        raise StoreReadOnly(f"database: {db.path!r} is open read-only; vacuum needs to write it")
    if db.in_transaction():
        raise StoreUnavailable("vacuum_relations: VACUUM cannot run inside a transaction; call it after")
    before = relation_space()
    db.run_sql(f"VACUUM (ANALYZE) {', '.join(STORE_TABLES)}", ())
    return RelationVacuumReport(before=before, after=relation_space())


def store_space() -> StoreSpace:
    """The open store's page size, pages, free pages and auto_vacuum mode (of the main file as of its
    last commit: pages still only in the -wal file included)."""
    file_backed("store_space")
    page_size, page_count, free_pages, auto_vacuum = db.backend.page_stats()
    return StoreSpace(
        page_size=page_size, page_count=page_count, free_pages=free_pages, auto_vacuum=auto_vacuum
    )


def reclaim_free_pages(limit: int | None = None) -> int:
    """Give back up to ``limit`` free pages, in the caller's write transaction; return how many. Does
    nothing on a file without incremental auto_vacuum."""
    return db.backend.reclaim_free_pages(FREED_PAGES_PER_STEP if limit is None else limit)


def reclaim_all(limit: int | None = None) -> int:
    """Give back every free page, ``limit`` at a time, one short write transaction each; return how many
    pages went (0 at once on a file without incremental auto_vacuum)."""
    if not file_backed() or _pragma("auto_vacuum") != INCREMENTAL:
        return 0  # a file that cannot give pages back
    freed = steps = 0
    while _pragma("freelist_count") > 0:  # the usual case after a chunk: 0 already, no transaction
        steps += 1
        # Inside bulk_writes() no COMMIT checkpoints: keep the -wal file short.
        if steps % TRANSACTIONS_PER_CHECKPOINT == 0:
            db.checkpoint()
        with db.write():
            step = reclaim_free_pages(limit)
        if step == 0:
            break
        freed += step
    return freed


def vacuum_store() -> VacuumReport:
    """Give back every free page. A file without incremental auto_vacuum is converted first: SQLite
    rewrites the whole file (``VACUUM``), with the store's lock held throughout, other processes'
    writes waiting, and free disk needed for a second copy. Raises ``StoreReadOnly`` on a read-only store."""
    file_backed("vacuum_store")
    if db.readonly:
        raise StoreReadOnly(f"database: {db.path!r} is open read-only; vacuum needs to write it")
    before = store_space()
    converted = before.auto_vacuum != INCREMENTAL
    if converted:
        db.backend.convert_to_incremental()
    else:
        with db.bulk_writes():
            reclaim_all()
    db.checkpoint()
    return VacuumReport(converted=converted, before=before, after=store_space())
