"""Peewee queries compiled to SQL once, run on the shared connection with only their parameters bound.

Compiling a query costs several times what SQLite needs to run a one-row update, so the manager builds
each query once, with :class:`Slot` placeholders, and binds values by name on every call. Where a value
must be written into the SQL instead (so SQLite can match a partial index, or a constant LIMIT is costed as
itself: see :func:`literal`), the manager wraps it in Peewee's ``ValueLiterals``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import peewee

from .backends import Dialect
from .database import db

__all__ = ["Slot", "Statement", "literal"]


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


def literal(value: int) -> peewee.ValueLiterals:
    """``value`` written into the SQL, not bound. For a LIMIT: with ``LIMIT $1`` PostgreSQL's generic plan
    guesses a tenth of the rows, costs far more than a custom plan, and so is never chosen: the statement is
    planned again on every run (``tests/test_postgres_plans.py``)."""
    return peewee.ValueLiterals(peewee.Value(value))


class _Compiled:
    """One statement's SQL for one backend, and how to bind its parameters from slot values."""

    __slots__ = ("constants", "getter", "ordered", "sql", "template")

    def __init__(self, build: Callable[[], peewee.Node], order: tuple[str, ...] | None) -> None:
        sql: str
        params: list[Any]
        sql, params = build().sql()  # type: ignore[attr-defined]
        keys = [p.name if type(p) is _SlotValue else f" constant {i}" for i, p in enumerate(params)]
        if order is not None and keys != list(order):
            raise AssertionError(f"statement parameters are {keys}, not {list(order)}")
        self.ordered = order is not None
        self.constants = {key: p for key, p in zip(keys, params, strict=True) if type(p) is not _SlotValue}
        # itemgetter of one key returns the bare value, not a 1-tuple, and of no key is an error
        self.getter: Callable[[dict[str, Any]], tuple[Any, ...]]
        if len(keys) > 1:
            self.getter = operator.itemgetter(*keys)
        elif keys:
            key = keys[0]
            self.getter = lambda values: (values[key],)
        else:
            self.getter = lambda values: ()
        self.template = params
        self.sql = sql


class Statement:
    """A Peewee query compiled to SQL on first use on each backend; later runs only bind parameters.

    Compiling a query costs several times what SQLite needs to run a one-row update, so the hot paths
    build each query once. Parameters are :class:`Slot` names, filled from keyword arguments. Each
    backend class gets its own compilation (Peewee writes ``?`` for SQLite, ``%s`` for PostgreSQL, and the
    backend's spellings differ), as does a read-only older store without the claims' columns
    (``backend.statement_key``); every run goes to the backend open now.
    """

    __slots__ = ("_build", "_compiled", "_order")

    def __init__(self, build: Callable[[], peewee.Node], *, order: tuple[str, ...] | None = None) -> None:
        """``order``: the statement's parameters, the slots' names in the order it binds them (checked as it
        compiles): a caller may then send :meth:`sql_by_position` itself, the values in that order."""
        self._build = build
        self._order = order
        self._compiled: dict[str, _Compiled] = {}

    def _for(self, backend: Dialect) -> _Compiled:
        compiled = self._compiled.get(backend.statement_key)
        if compiled is None:  # the models compile for db's backend, which is ``backend``
            compiled = self._compiled[backend.statement_key] = _Compiled(self._build, self._order)
        return compiled

    @property
    def sql(self) -> str:
        """The SQL for the backend open now."""
        return self._for(db.backend).sql

    @property
    def template(self) -> list[Any]:
        """The compiled parameters for the backend open now: slot values stand for the named slots."""
        return self._for(db.backend).template

    def bind(self, values: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """The SQL for the backend open now, and its parameters for these slot values."""
        compiled = self._for(db.backend)
        if compiled.constants:
            values.update(compiled.constants)
        return compiled.sql, compiled.getter(values)

    def run(self, **values: Any) -> int:
        """Execute once; return the number of rows changed."""
        backend = db.backend
        compiled = self._compiled.get(backend.statement_key) or self._for(backend)
        if compiled.constants:
            values.update(compiled.constants)
        return int(backend.run_sql(compiled.sql, compiled.getter(values)).rowcount)

    def rows(self, **values: Any) -> list[Any]:
        """Execute once; return every row."""
        backend = db.backend
        compiled = self._compiled.get(backend.statement_key) or self._for(backend)
        if compiled.constants:
            values.update(compiled.constants)
        return backend.fetch_all(compiled.sql, compiled.getter(values))

    def scalar(self, **values: Any) -> Any:
        """Execute once; return the first column of the first row, or None."""
        backend = db.backend
        compiled = self._compiled.get(backend.statement_key) or self._for(backend)
        if compiled.constants:
            values.update(compiled.constants)
        row = backend.fetch_one(compiled.sql, compiled.getter(values))
        return None if row is None else row[0]

    def rows_in(self, execute: Callable[[str, Sequence[Any]], Any], **values: Any) -> list[Any]:
        """Execute once with ``execute``, a hot path's write transaction's (``direct_write``), which holds
        the lock and turns errors into the package's; return every row."""
        compiled = self._compiled.get(db.backend.statement_key) or self._for(db.backend)
        if compiled.constants:
            values.update(compiled.constants)
        return execute(compiled.sql, compiled.getter(values)).fetchall()  # type: ignore[no-any-return]

    def run_in(self, execute: Callable[[str, Sequence[Any]], Any], **values: Any) -> int:
        """Execute once with ``execute``, as :meth:`rows_in`; return the number of rows changed."""
        compiled = self._compiled.get(db.backend.statement_key) or self._for(db.backend)
        if compiled.constants:
            values.update(compiled.constants)
        return int(execute(compiled.sql, compiled.getter(values)).rowcount)

    def sql_by_position(self) -> str:
        """The SQL for the backend open now, for a caller that sends it itself, its values given in the
        statement's ``order`` (a claim's walk: no call between it and the driver)."""
        compiled = self._for(db.backend)
        if not compiled.ordered:
            raise TypeError(f"a statement without an order takes its values by name: {compiled.sql}")
        return compiled.sql

    def run_many(self, names: tuple[str, ...], rows: Iterable[Sequence[Any]]) -> int:
        """Execute once per row; each row gives the slots ``names`` in order. Returns the rows changed."""
        backend = db.backend
        compiled = self._for(backend)
        if [getattr(p, "name", p) for p in compiled.template] != list(names):
            raise AssertionError(f"statement parameters are {compiled.template}, not {names}")
        return backend.executemany(compiled.sql, rows)
