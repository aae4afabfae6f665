"""Peewee queries compiled to SQL once, run on the shared connection with only their parameters bound.

Compiling a query costs several times what SQLite needs to run a one-row update, so the manager builds
each query once, with :class:`Slot` placeholders, and binds values by name on every call.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import peewee

from .database import db

__all__ = ["Inline", "Slot", "Statement"]


class _SlotValue:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Slot(peewee.ColumnBase):
    """A named parameter in a statement compiled once and run many times."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __sql__(self, ctx: peewee.Context) -> peewee.Context:
        ctx.value(_SlotValue(self.name), converter=False)
        return ctx


class Inline(peewee.Node):
    """Renders its expression with values as SQL literals, so SQLite can match a partial index."""

    def __init__(self, node: peewee.Node) -> None:
        super().__init__()
        self.node = node

    def __sql__(self, ctx: peewee.Context) -> peewee.Context:
        with ctx(value_literals=True):
            ctx.sql(self.node)  # type: ignore[no-untyped-call]
        return ctx


class Statement:
    """A Peewee query compiled to SQL on first use; later runs only bind parameters.

    Compiling a query costs several times what SQLite needs to run a one-row update, so the hot paths
    build each query once. Parameters are :class:`Slot` names, filled from keyword arguments.
    """

    def __init__(self, build: Callable[[], peewee.Node]) -> None:
        self._build = build
        self._sql: str | None = None
        self._template: list[Any] = []
        self._constants: dict[str, Any] = {}
        self._getter: Callable[[dict[str, Any]], tuple[Any, ...]] = tuple

    def _compile(self) -> str:
        sql: str
        params: list[Any]
        sql, params = self._build().sql()  # type: ignore[attr-defined]
        keys = [p.name if type(p) is _SlotValue else f" constant {i}" for i, p in enumerate(params)]
        self._constants = {key: p for key, p in zip(keys, params, strict=True) if type(p) is not _SlotValue}
        # itemgetter of one key returns the bare value, not a 1-tuple, and of no key is an error
        if len(keys) > 1:
            self._getter = operator.itemgetter(*keys)
        elif keys:
            key = keys[0]
            self._getter = lambda values: (values[key],)
        else:
            self._getter = lambda values: ()
        self._template = params
        self._sql = sql
        return sql

    @property
    def sql(self) -> str:
        return self._sql if self._sql is not None else self._compile()

    def bind(self, values: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """The SQL and its parameters for these slot values."""
        sql = self._sql or self._compile()
        if self._constants:
            values.update(self._constants)
        return sql, self._getter(values)

    def run(self, **values: Any) -> int:
        """Execute once; return the number of rows changed."""
        return db.run_sql(*self.bind(values)).rowcount

    def rows(self, **values: Any) -> list[Any]:
        """Execute once; return every row."""
        return db.fetch_all(*self.bind(values))

    def scalar(self, **values: Any) -> Any:
        """Execute once; return the first column of the first row, or None."""
        row = db.fetch_one(*self.bind(values))
        return None if row is None else row[0]

    def run_many(self, names: tuple[str, ...], rows: Iterable[Sequence[Any]]) -> int:
        """Execute once per row; each row gives the slots ``names`` in order. Returns the rows changed."""
        sql = self.sql
        if [getattr(p, "name", p) for p in self._template] != list(names):
            raise AssertionError(f"statement parameters are {self._template}, not {names}")
        return db.executemany(sql, rows)
