"""Operating the store: ``backup`` and ``vacuum``, and the free-space lines of ``stats``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sift import dcache
from sift.dcache.space import file_backed

from .progress import make_bar
from .report import emit_json, format_count, format_size

__all__ = ["cmd_backup", "cmd_restore", "cmd_vacuum", "space_lines", "space_report"]

AUTO_VACUUM = {0: "none", 1: "full", 2: "incremental"}

CONVERT_WARNING = (
    "sift vacuum: this store was made without incremental auto-vacuum; converting it rewrites the whole "
    "file once (VACUUM). Until that ends, this store's other users wait, and the disk needs room for a "
    "second copy. Later sweeps and evictions give space back by themselves."
)


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


def _space_json(space: dcache.StoreSpace) -> dict[str, int]:
    return {
        "pages": space.page_count,
        "free_pages": space.free_pages,
        "file_bytes": space.page_count * space.page_size,
        "live_bytes": space.live_bytes,
    }


def cmd_vacuum(args: argparse.Namespace) -> int:
    if not file_backed():
        return _vacuum_relations(args)
    if dcache.store_space().auto_vacuum != 2:
        print(CONVERT_WARNING, file=sys.stderr, flush=True)
    done = dcache.vacuum_store()
    if args.json:
        emit_json(
            {
                "converted": done.converted,
                "before": _space_json(done.before),
                "after": _space_json(done.after),
            }
        )
        return 0
    before, after = done.before, done.after
    freed = (before.page_count - after.page_count) * before.page_size
    what = "converted to incremental auto-vacuum and rewrote" if done.converted else "vacuumed"
    print(
        f"{what} {args.db}: {format_size(before.page_count * before.page_size)} -> "
        f"{format_size(after.page_count * after.page_size)} (freed {format_size(max(freed, 0))}); "
        f"{format_size(after.live_bytes)} in use"
    )
    return 0


def _vacuum_relations(args: argparse.Namespace) -> int:
    """PostgreSQL: VACUUM (ANALYZE) of the store's tables."""
    done = dcache.vacuum_relations()
    if args.json:
        emit_json(
            {
                "before": {"table_bytes": done.before.table_bytes, "dead_rows": done.before.dead_rows},
                "after": {"table_bytes": done.after.table_bytes, "dead_rows": done.after.dead_rows},
            }
        )
        return 0
    dead = sum(done.before.dead_rows.values())
    print(
        f"vacuumed and analyzed the tables of {args.db}: {format_size(done.before.total_bytes)} -> "
        f"{format_size(done.after.total_bytes)} with indexes; {format_count(dead)} dead rows before "
        "(the server's estimate) are reusable space now"
    )
    return 0


def _backup_postgres(args: argparse.Namespace) -> int:
    """PostgreSQL: a SQLite store file from one snapshot; the bar counts rows."""
    with make_bar(None, "backup", unit="row") as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        done = dcache.backup_store(args.dest, progress=progress)
        bar.refresh()
    report = {"db": args.db, "dest": done.dest, "pages": done.pages, "bytes": done.nbytes}
    if args.json:
        emit_json(report)
        return 0
    print(
        f"backed up {args.db} to {done.dest}: a SQLite store of {format_size(done.nbytes)} "
        f"({format_count(done.pages)} pages), the store as it was when the copy started"
    )
    return 0


def cmd_backup(args: argparse.Namespace) -> int:
    if not file_backed():
        return _backup_postgres(args)
    space = dcache.store_space()
    size = space.page_size
    with make_bar(space.page_count * size, "backup", unit="B", unit_scale=True, unit_divisor=1024) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total * size  # the snapshot's size: writes since the line above may have changed it
            bar.update(done * size - bar.n)

        done = dcache.backup_store(args.dest, progress=progress)
        bar.refresh()  # draw the finished bar once, even inside tqdm's minimum interval
    report = {"db": args.db, "dest": done.dest, "pages": done.pages, "bytes": done.nbytes}
    if args.json:
        emit_json(report)
        return 0
    print(
        f"backed up {args.db} to {done.dest}: {format_size(done.nbytes)} ({format_count(done.pages)} pages), "
        "the store as it was when the copy started"
    )
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    with make_bar(None, "restore", unit="row") as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        done = dcache.restore_store(args.source, progress=progress)
        bar.refresh()
    if args.json:
        emit_json({"db": args.db, "source": done.source, "jobs": done.jobs, "targets": done.targets})
        return 0
    print(
        f"restored {format_count(done.jobs)} jobs and {format_count(done.targets)} targets "
        f"from {done.source} into {args.db}"
    )
    return 0
