"""Writes to the store's tables through Peewee run only when the model-write guard cleared them.

The guard (:mod:`sift.dcache.modelwrites`) sees the writes the models build (``BatchJob.update(...)``,
``save()``, ``delete_instance()``, and those of any subclass). Peewee can build a write in other ways: a
query class made directly (``peewee.ModelDelete(BatchTarget)``), a ``peewee.Table``, another model class
on the same table, a write inside a CTE. Each backend's ``execute`` (every Peewee query runs through it)
refuses those when they write ``batch_job`` or ``batch_target``, so nothing reaches the tables around the
rules. Plain SQL (``db.execute_sql``) is the documented way outside them, as a ``sqlite3`` shell is.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import peewee

from ..errors import ModelWriteRefused
from ..tables import JOB_TABLE, TARGET_TABLE

__all__ = ["HELD_TABLES", "HeldWrites", "cleared", "written_table"]

#: The tables whose writes the guard holds (the store's other tables are written by its functions only).
HELD_TABLES = (JOB_TABLE, TARGET_TABLE)
_STORE_NAME = re.compile(r"\bbatch_(?:job|target)\b")

#: The one write query the guard cleared in this thread (or task), while they run it.
_CLEARED: contextvars.ContextVar[object | None] = contextvars.ContextVar("sift_cleared_write", default=None)


def written_table(table: Any) -> str | None:
    """The store table a write's target names (``batch_job``, ``batch_target``), whatever object names it:
    a model class, a subclass, an alias, a ``peewee.Table``; anything else by the SQL it compiles to."""
    if isinstance(table, peewee.ModelAlias):
        table = table.model
    if isinstance(table, type) and issubclass(table, peewee.Model):
        name = table._meta.table_name
    elif isinstance(table, peewee.Table):
        name = table.__name__
    else:
        found = _STORE_NAME.search(peewee.Context().sql(table).query()[0])  # type: ignore[no-untyped-call]
        return found.group(0) if found else None
    return name if name in HELD_TABLES else None


@contextmanager
def cleared(query: Any) -> Iterator[None]:
    """Let ``query`` (this object, nothing else) through :class:`HeldWrites` while the block runs."""
    token = _CLEARED.set(query)
    try:
        yield
    finally:
        _CLEARED.reset(token)


def _store_writes(query: Any) -> Iterator[str]:
    """The store tables ``query`` writes: itself, or a data-modifying CTE of it."""
    if isinstance(query, peewee._WriteQuery):  # Peewee's base of Insert, Update, Delete
        table = written_table(query.table)
        if table is not None:
            yield table
    for cte in getattr(query, "_cte_list", None) or ():
        yield from _store_writes(getattr(cte, "_query", None))


class HeldWrites:
    """Mixed into each backend's Peewee database class: its ``execute`` refuses a write to the store's
    tables that the model-write guard did not clear."""

    def execute(self, query: Any, **context_options: Any) -> Any:
        if _CLEARED.get() is not query:
            for table in _store_writes(query):
                model = "BatchJob" if table == JOB_TABLE else "BatchTarget"
                raise ModelWriteRefused(
                    "query",
                    f"writes {table} around the store's rules; build the write from {model} "
                    f"({model}.update(...), .insert(...), .delete(), save()) or call the store's functions",
                )
        return super().execute(query, **context_options)  # type: ignore[misc]
