"""Restore: copy a SQLite store file (a backup, or a store that outgrew its machine) into the open store
(either backend), which must hold no job, in one transaction.

Every row is held to every rule the store keeps: each column as the store's functions write it (checked
here, row by row), then every rule between rows (counts, sizes, statuses, idx ranges, orphans, results on
pending targets) by the integrity check's own code, run on the copied rows inside the same transaction
before it commits. A source file is only read: its schema is checked first, so a table with generated or
hidden columns, a view or a trigger that is not the store's own is refused before a row is read, and rows
are read in steps bounded in rows and in bytes.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import peewee

from . import files, integrity, validation
from .backends import SQLITE_TRIGGERS
from .database import db
from .errors import (
    BatchError,
    InvalidBatchInput,
    StoreConflict,
    StoreNotOpen,
    StoreReadOnly,
    StoreUnavailable,
)
from .hosts import url_host
from .reports import RestoreReport
from .tables import CLAIM_COLUMNS, HOST_COLUMN, JOB_COLUMNS, NOT_BEFORE_COLUMN, TARGET_COLUMNS

__all__ = ["BYTES_PER_STEP", "ROWS_PER_STEP", "restore_store"]

#: Rows read and written per step of a restore; progress is reported after each.
ROWS_PER_STEP = 2000
#: Bytes of text read per step at most (a step ends at the row that passes it), whatever the rows hold.
BYTES_PER_STEP = 8 * 2**20
#: Violations named in the message that refuses a source.
SHOWN_VIOLATIONS = 5

_TABLES = ("batch_job", "batch_target")


def restore_store(
    source: str | os.PathLike[str], *, progress: Callable[[int, int], None] | None = None
) -> RestoreReport:
    """Copy every job and target of the SQLite store file at ``source`` into the open store (either
    backend), which must hold no job and no target: jobs in their insertion order (newest-wins ties keep
    their winner), ``options`` as stored, each target's claim (``runner``, ``heartbeat``, ``attempts``) and
    ``not_before`` as stored, or unclaimed (no runner, no heartbeat, no attempt) from a file an older sift
    or the original service wrote, all in one transaction. ``progress(done, total)`` counts rows.

    Raises ``InvalidBatchInput`` (field ``source``) for a file that is not a readable store, or the open
    store itself, or a schema that could run code or make data on read (generated or hidden columns, a
    view, a trigger that is not the store's own), or a row the store's functions would not write (a NUL in
    any text, an unknown status or caller_class, options not JSON, a key or text past the store's bounds, a
    value of the wrong type, a count or time that is not a non-negative int, attempts past
    ``MAX_ATTEMPTS``), or rows that break a rule
    ``check_store`` holds the store to (counts, byte sizes, idx ranges, orphan targets, a result on a
    pending target, a runner's running target with no attempt), or one the open store cannot hold: the
    open store is then left as it was. ``StoreUnavailable`` when the open store already holds jobs.
    """
    if db.deferred:
        raise StoreNotOpen("no database is open: call sift.dcache.open_db(target) first")
    path = _source_file(source)
    try:
        src = sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise InvalidBatchInput("source", f"cannot open {path!r}: {exc}") from exc
    try:
        try:
            src.execute("BEGIN")  # one snapshot of the source, whoever writes it meanwhile
            _check_source_schema(src, path)
            jobs, targets = src.execute(
                "SELECT (SELECT COUNT(*) FROM batch_job), (SELECT COUNT(*) FROM batch_target)"
            ).fetchone()
        except sqlite3.Error as exc:
            raise InvalidBatchInput("source", f"cannot read {path!r} as a batch store: {exc}") from exc
        with db.write():
            _refuse_held_rows()
            _copy(src, path, jobs + targets, progress)
            _refuse_violations(path)  # raising here rolls every copied row back
    finally:
        src.close()
    return RestoreReport(source=path, jobs=jobs, targets=targets)


def _source_file(source: str | os.PathLike[str]) -> str:
    shown, path = files.path_argument("source", source)
    if not os.path.isfile(path):
        raise InvalidBatchInput("source", f"no store file at {shown!r}")
    store_file = db.backend.store_file()
    if store_file is not None and os.path.samefile(path, store_file):
        raise InvalidBatchInput("source", f"{shown!r} is the open store itself")
    return path


def _check_source_schema(src: sqlite3.Connection, path: str) -> None:
    """Refuse a source whose reading could do more than read stored rows: the store's tables must be
    plain tables of stored columns, and the file may hold no view and no trigger but the store's own."""
    objects = src.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    tables = {name: sql for kind, name, _, sql in objects if kind == "table"}
    if not set(_TABLES) <= set(tables):
        raise InvalidBatchInput("source", f"{path!r} is not a batch store (no batch_job, batch_target)")
    for table in _TABLES:
        if (tables[table] or "").upper().startswith("CREATE VIRTUAL"):
            _refuse(path, f"{table} is a virtual table")
        # hidden: 1 a virtual table's hidden column, 2 and 3 generated columns (made on read, or stored)
        for _, column, *_, hidden in src.execute(f"PRAGMA table_xinfo({table})"):
            if hidden:
                _refuse(path, f"{table}.{column} is a generated or hidden column")
    for kind, name, _, sql in objects:
        if kind == "view":
            _refuse(path, f"it holds a view ({name!r})")
        if kind == "trigger" and SQLITE_TRIGGERS.get(name) != sql:
            _refuse(path, f"it holds a trigger that is not the store's own ({name!r})")


def _refuse(path: str, why: str) -> None:
    raise InvalidBatchInput("source", f"{path!r} cannot be restored: {why}; only a plain store file can")


def _refuse_held_rows() -> None:
    held = db.fetch_one("SELECT (SELECT COUNT(*) FROM batch_job) + (SELECT COUNT(*) FROM batch_target)", ())
    if held[0]:
        raise StoreUnavailable(
            f"database: {db.path!r} already holds {held[0]} rows; restore_store copies into an empty "
            "store only"
        )


def _copy(
    src: sqlite3.Connection, path: str, total: int, progress: Callable[[int, int], None] | None
) -> None:
    """Copy both tables, each row checked column by column, inside the caller's transaction."""
    mark = db.backend.param
    done = 0
    claims = _claim_columns(src)
    target_rules = _TARGET_RULES + tuple(_CLAIM_RULES[name] for name in claims)
    for table, names, order, rules in (
        ("batch_job", JOB_COLUMNS, "_rowid_", _JOB_RULES),
        ("batch_target", TARGET_COLUMNS + claims, "job_id, idx", target_rules),
    ):
        columns = ", ".join(names)
        targets = table == "batch_target"
        # A target's host is computed here, as every insert of a target writes it: never read from the source.
        written = (*names, HOST_COLUMN) if targets else names
        marks = ", ".join([mark] * len(written))
        insert = f"INSERT INTO {table} ({', '.join(written)}) VALUES ({marks})"
        # json_valid, last, is SQLite's verdict on options: the rule that lets a row move back.
        extra = ", json_valid(options)" if targets else ""
        url = names.index("url") if targets else 0
        for rows in _batches(src, f"SELECT {columns}{extra} FROM {table} ORDER BY {order}", path):
            _check_rows(table, names, rules, rows, path)
            try:
                db.executemany(insert, [(*row[:-1], url_host(row[url])) for row in rows] if targets else rows)
            except (BatchError, peewee.DatabaseError) as exc:
                if isinstance(exc, StoreNotOpen | StoreReadOnly | StoreConflict):
                    raise
                raise InvalidBatchInput(
                    "source", f"a row of {table} in {path!r} cannot be stored here: {exc}"
                ) from exc
            done += len(rows)
            if progress is not None:
                progress(done, total)


def _claim_columns(src: sqlite3.Connection) -> tuple[str, ...]:
    """The claim columns (and a retried target's ``not_before``) the source's targets have, in the store's
    order: none in a file that an older sift or the original service wrote (its targets then take the
    defaults: unclaimed, claimable at once)."""
    present = {row[1] for row in src.execute("PRAGMA table_info(batch_target)")}
    return tuple(name for name in (*CLAIM_COLUMNS, NOT_BEFORE_COLUMN) if name in present)


def _refuse_violations(path: str) -> None:
    """Refuse the copied rows if the integrity check finds any of them breaking a rule."""
    found = integrity.data_violations(SHOWN_VIOLATIONS + 1)
    if found:
        shown = "; ".join(str(violation) for violation in found[:SHOWN_VIOLATIONS])
        more = ", and more" if len(found) > SHOWN_VIOLATIONS else ""
        raise InvalidBatchInput("source", f"{path!r} holds rows that break the store's rules: {shown}{more}")


def _batches(src: sqlite3.Connection, sql: str, path: str) -> Iterator[list[Any]]:
    """The rows of ``sql`` on the source, at most :data:`ROWS_PER_STEP` and about :data:`BYTES_PER_STEP`
    of text at a time."""
    try:
        cursor = src.execute(sql)
        rows: list[Any] = []
        size = 0
        for row in cursor:
            rows.append(row)
            size += sum(len(value) for value in row if isinstance(value, str | bytes))
            if len(rows) >= ROWS_PER_STEP or size >= BYTES_PER_STEP:
                yield rows
                rows, size = [], 0
        if rows:
            yield rows
    except sqlite3.Error as exc:
        raise InvalidBatchInput("source", f"cannot read {path!r}: {exc}") from exc


def _optional_count(field: str, value: Any) -> None:
    if value is not None:
        validation.count(field, value)


def _attempts(field: str, value: Any) -> None:
    if validation.count(field, value) > validation.MAX_ATTEMPTS:
        validation.invalid(field, f"must be at most {validation.MAX_ATTEMPTS}, got {value}")


def _url(field: str, value: Any) -> None:
    validation.at_most(field, validation.text(field, value, allow_empty=False), validation.MAX_URL_BYTES)


def _options(field: str, value: Any) -> None:
    validation.at_most(field, validation.text(field, value), validation.MAX_OPTIONS_BYTES)


def _message(field: str, value: Any) -> None:
    validation.optional_message(field, value)


def _optional_key(field: str, value: Any) -> None:
    validation.optional_key(field, value)


def _result(field: str, value: Any) -> None:
    if value is not None and validation.utf8_size(field, value) > validation.MAX_RESULT_BYTES:
        validation.invalid(field, f"must be at most {validation.MAX_RESULT_BYTES} bytes of UTF-8")


def _json(field: str, value: str, valid: Any) -> None:
    """``value``, text already checked, is JSON SQLite's json_valid takes (``valid``), not nested too deep."""
    if valid != 1:
        validation.invalid(field, "is not valid JSON text")
    if validation.json_too_deep(value):
        validation.invalid(field, f"is nested deeper than {validation.MAX_JSON_DEPTH} levels")


def _key(field: str, value: Any) -> None:
    validation.key(field, value)


def _idem_key(field: str, value: Any) -> None:
    validation.key(field, value, allow_empty=True)


def _nonempty(field: str, value: Any) -> None:
    validation.text(field, value, allow_empty=False)


def _job_status(field: str, value: Any) -> None:
    validation.choice(field, value, validation.JOB_STATUS_VALUES)


def _target_status(field: str, value: Any) -> None:
    validation.choice(field, value, validation.TARGET_STATUS_VALUES)


def _caller_class(field: str, value: Any) -> None:
    validation.choice(field, value, validation.CALLER_CLASS_VALUES)


#: What each column of a restored row must hold, by the rules the store's functions write by (so the row
#: is the same on either backend and can move back): text without a NUL, keys no longer than the store
#: takes, NULL only where the column allows it, known status and caller_class values, integers, and
#: options JSON SQLite's json_valid takes. The rules between rows are the integrity check's.
_JOB_RULES: tuple[Callable[[str, Any], object], ...] = (
    _key,  # id
    _key,  # caller
    _caller_class,
    _idem_key,
    _job_status,
    _message,  # error
    *(validation.count,) * 5,  # targets_total, targets_done, created_at, lease, nbytes
)
_TARGET_RULES: tuple[Callable[[str, Any], object], ...] = (
    _nonempty,  # job_id: a target's job is a job, whose id the job rules hold to the key limit
    validation.count,  # idx
    _url,
    _options,  # then _json
    _target_status,
    _result,
    _message,  # error
    _message,  # hint
)
#: A claim column's rule, for a source that has it; the rule between a claim's columns (a runner's running
#: target has an attempt) is the integrity check's ``target_attempts``.
_CLAIM_RULES: dict[str, Callable[[str, Any], object]] = {
    "runner": _optional_key,
    "heartbeat": _optional_count,
    "attempts": _attempts,
    NOT_BEFORE_COLUMN: _optional_count,
}


def _check_rows(
    table: str,
    names: tuple[str, ...],
    rules: tuple[Callable[[str, Any], object], ...],
    rows: list[Any],
    path: str,
) -> None:
    """Refuse the first row a rule refuses: ``InvalidBatchInput`` (field ``source``) naming the table, the
    row and the column."""
    for row in rows:
        try:
            for name, rule, value in zip(names, rules, row, strict=False):  # targets: json_valid last
                rule(name, value)
            if table == "batch_target":
                _json("options", row[3], row[-1])
        except InvalidBatchInput as exc:
            where = f"job {row[0]!r}" + (f" idx {row[1]!r}" if table == "batch_target" else "")
            raise InvalidBatchInput(
                "source", f"a row of {table} in {path!r} cannot be stored here: {where}: {exc}"
            ) from None
