"""The store's free space as ``stats`` shows it: SQLite's pages, or PostgreSQL's table sizes."""

from __future__ import annotations

from typing import Any

from sift import dcache
from sift.dcache.space import INCREMENTAL, file_backed

from .report import format_count, format_size

__all__ = ["AUTO_VACUUM", "space_lines", "space_report"]

#: ``PRAGMA auto_vacuum``'s values by name.
AUTO_VACUUM = {0: "none", 1: "full", INCREMENTAL: "incremental"}


def space_report() -> dict[str, Any]:
    """The store's page use, for ``stats --json``; on PostgreSQL its tables' bytes and dead rows."""
    if not file_backed():
        tables = dcache.relation_space()
        return {
            "table_bytes": tables.table_bytes,
            "total_table_bytes": tables.total_bytes,
            "dead_rows": tables.dead_rows,
        }
    space = dcache.store_space()
    return {
        "page_size": space.page_size,
        "pages": space.page_count,
        "free_pages": space.free_pages,
        "reclaimable_bytes": space.reclaimable_bytes,
        "auto_vacuum": AUTO_VACUUM.get(space.auto_vacuum, str(space.auto_vacuum)),
    }


def space_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The free-space lines of ``stats``."""
    if "table_bytes" in report:  # PostgreSQL: the server's space, given back by (auto)vacuum
        total = report["total_table_bytes"]
        dead = sum(report["dead_rows"].values())
        return [
            ("Table sizes", f"{format_size(total)} ({format_count(total)} bytes, with indexes)"),
            ("Dead rows", f"{format_count(dead)} (the server's estimate; autovacuum or `sift vacuum`)"),
        ]
    pages = (
        f"{format_count(report['free_pages'])} of {format_count(report['pages'])} "
        f"{format_size(report['page_size'])} pages (auto_vacuum {report['auto_vacuum']})"
    )
    reclaimable = (
        f"{format_size(report['reclaimable_bytes'])} ({format_count(report['reclaimable_bytes'])} bytes)"
    )
    if report["reclaimable_bytes"] and report["auto_vacuum"] == "incremental":
        reclaimable += ": the next sweep or eviction gives them back, or `sift vacuum`"
    elif report["reclaimable_bytes"]:
        reclaimable += ": `sift vacuum` gives them back (once: it rewrites the file)"
    return [("Free pages", pages), ("Reclaimable", reclaimable)]
