"""What the layers of :class:`~.connection.PostgresStore` share: where the store is, and (for the type
checker) the methods one layer calls on another."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from playhouse.pool import PooledPostgresqlDatabase

from ...driver_errors import Translation
from ..heldwrites import HeldWrites

__all__ = ["PostgresBase"]


class PostgresBase(HeldWrites, PooledPostgresqlDatabase):  # type: ignore[misc]
    """The base every layer of the PostgreSQL store's database extends (each layer is a mixin of one
    concern)."""

    #: The target as shown in messages (without a password).
    path: str | None
    #: The PostgreSQL schema the store's tables are in.
    schema: str
    readonly: bool
    #: Whether the store has the claims' columns (a read-only open of an older version may not), and the key
    #: under which statements are compiled for it (see :class:`sift.dcache.statements.Statement`).
    claims_stored: bool = True
    hosts_stored: bool = True
    politeness_stored: bool = True
    #: Whether batch_target has version 9's not_before (a read-only open of an older version has not).
    delays_stored: bool = True
    statement_key: str = "postgres"
    #: Whether opening a schema without the store's tables creates them (else StoreMissing).
    create: bool
    timeout: float
    #: Around Peewee's own execution, BEGIN, COMMIT and ROLLBACK: driver errors as the package's.
    read_errors: Translation

    if TYPE_CHECKING:

        def run_sql(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> Any: ...

        def fetch_all(self, sql: str, params: Sequence[Any]) -> list[Any]: ...

        def fetch_one(self, sql: str, params: Sequence[Any]) -> Any: ...

        def executemany(self, sql: str, rows: Any) -> int: ...

        def usable_connection(self) -> Any: ...

        def write(self) -> Any: ...

        def create_schema(self) -> None: ...

        def in_caller_transaction(self) -> bool: ...

        def raise_store_error(
            self, exc: BaseException, *, constraints: bool = False, connecting: bool = False
        ) -> None: ...
