"""SQLite's backend: the store in one file (or in memory), one connection shared by the process's threads.

:class:`.database.SerializedSqliteDatabase` is put together from this package's layers.
"""

from .database import SerializedSqliteDatabase

__all__ = ["SerializedSqliteDatabase"]
