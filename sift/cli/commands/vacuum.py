"""``sift vacuum``: give every free page back to the file system; on PostgreSQL, VACUUM (ANALYZE)."""

from __future__ import annotations

import argparse
import sys

from sift import dcache
from sift.dcache.space import INCREMENTAL, file_backed

from ..report import emit_json, format_count, format_size
from . import Command

__all__ = ["COMMAND"]

CONVERT_WARNING = (
    "sift vacuum: this store was made without incremental auto-vacuum; converting it rewrites the whole "
    "file once (VACUUM). Until that ends, this store's other users wait, and the disk needs room for a "
    "second copy. Later sweeps and evictions give space back by themselves."
)


def _space_json(space: dcache.StoreSpace) -> dict[str, int]:
    return {
        "pages": space.page_count,
        "free_pages": space.free_pages,
        "file_bytes": space.page_count * space.page_size,
        "live_bytes": space.live_bytes,
    }


def run(args: argparse.Namespace) -> int:
    """Give free pages back (converting the file once if it must); on PostgreSQL, VACUUM (ANALYZE)."""
    if not file_backed():
        return _vacuum_relations(args)
    if dcache.store_space().auto_vacuum != INCREMENTAL:
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


COMMAND = Command(
    name="vacuum",
    help="Give every free page back to the file system; a store made before incremental auto-vacuum is "
    "converted once, which rewrites the whole file.",
    run=run,
)
