"""Hostile input beyond the store issue's table (that table is tests/test_bad_input.py): NUL characters
(refused on both backends),
a 10 MB result, 100,000 targets under a lowered variable limit, NaN and non-JSON options, an SQL
injection string in every id-like field, and an id of 10,000 characters.

Each case is stored verbatim where it is legal, or ends with InvalidBatchInput naming the field and the
store exactly as it was (snapshot(), row counts and batch_nbytes() compared before and after).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import create_partial, make_job, make_target, make_targets, snapshot

from sift import dcache
from sift.dcache import MAX_KEY_BYTES, BatchJob, BatchTarget, db
from sift.dcache.jsontext import checked_options, is_json, json_too_deep, options_text


def counts() -> tuple[int, int, int]:
    jobs = db.execute_sql("SELECT COUNT(*) FROM batch_job").fetchone()[0]
    targets = db.execute_sql("SELECT COUNT(*) FROM batch_target").fetchone()[0]
    return jobs, targets, dcache.batch_nbytes()


def assert_refused(call: Callable[[], Any], field: str) -> None:
    """``call`` raises InvalidBatchInput naming ``field`` and changes nothing."""
    before, before_counts = snapshot(), counts()
    with pytest.raises(dcache.InvalidBatchInput) as info:
        call()
    assert str(info.value).startswith(f"{field}:"), str(info.value)
    assert info.value.field == field
    assert counts() == before_counts
    assert snapshot() == before


def utf8(text: str) -> int:
    return len(text.encode("utf-8"))


# -- NUL characters ------------------------------------------------------------------------------------------


# One rule on both backends, so a store's data can move between them: PostgreSQL's text cannot hold a NUL,
# so a NUL in any text argument is InvalidBatchInput naming the field, and nothing is written.

NUL_WRITES: dict[str, tuple[str, Callable[[], Any]]] = {
    "id": ("id", lambda: dcache.create_batch_job(make_job("job\x00two"))),
    "caller": ("caller", lambda: dcache.create_batch_job(make_job("job-2", caller="alice\x00evil"))),
    "idem_key": ("idem_key", lambda: dcache.create_batch_job(make_job("job-2", idem_key="key\x00"))),
    "error": ("error", lambda: dcache.create_batch_job(make_job("job-2", error="err\x00"))),
    "submit": ("idem_key", lambda: dcache.submit_batch_job(make_job("job-2", idem_key="k\x00"), None, 10)),
    "url": ("url", lambda: dcache.put_batch_targets("job-1", [make_target(2, url="https://x/\x00/p")])),
    "create-url": (
        "url",
        lambda: dcache.create_batch_job(make_job("job-2"), [make_target(0, url="https://x/\x00")]),
    ),
    "result": ("result", lambda: dcache.update_batch_target("job-1", 0, "done", result="\x00" * 5 + "é")),
    "target-error": ("error", lambda: dcache.update_batch_target("job-1", 0, "failed", error="bad\x00")),
    "hint": ("hint", lambda: dcache.update_batch_target("job-1", 0, "done", hint="\x00hint")),
    "status-error": ("error", lambda: dcache.set_batch_job_status("job-1", "failed", "status\x00error")),
    "reason": ("reason", lambda: dcache.mark_in_flight_failed("reason\x00")),
    "put-job-id": ("job_id", lambda: dcache.put_batch_targets("job-1\x00", [make_target(2)])),
    "touch-job-id": ("job_id", lambda: dcache.touch_batch_job("job\x00")),
}

NUL_READS: dict[str, tuple[str, Callable[[], Any]]] = {
    "batch_job": ("job_id", lambda: dcache.batch_job("job-1\x00")),
    "batch_targets": ("job_id", lambda: dcache.batch_targets("job\x00")),
    "by-idem-caller": ("caller", lambda: dcache.batch_job_by_idem("alice\x00", "k", 10)),
    "by-idem-key": ("idem_key", lambda: dcache.batch_job_by_idem("alice", "k\x00", 10)),
    "live": ("caller", lambda: dcache.live_batch_jobs("\x00")),
}


#: The rows of NUL_WRITES and NUL_READS by the function they call.
NUL_BY_FUNCTION = {
    "create_batch_job": ["id", "caller", "idem_key", "error", "create-url"],
    "submit_batch_job": ["submit"],
    "put_batch_targets": ["url", "put-job-id"],
    "update_batch_target": ["result", "target-error", "hint"],
    "set_batch_job_status": ["status-error"],
    "mark_in_flight_failed": ["reason"],
    "touch_batch_job": ["touch-job-id"],
    "batch_job": ["batch_job"],
    "batch_targets": ["batch_targets"],
    "batch_job_by_idem": ["by-idem-caller", "by-idem-key"],
    "live_batch_jobs": ["live"],
}


def test_every_nul_row_is_run() -> None:
    assert sorted(n for names in NUL_BY_FUNCTION.values() for n in names) == sorted([*NUL_WRITES, *NUL_READS])


@pytest.mark.parametrize("function", list(NUL_BY_FUNCTION))
def test_nul_in_any_text_is_refused_naming_the_field(store: dcache.StoreDatabase, function: str) -> None:
    create_partial(make_job("job-1", targets_total=3, idem_key="k"), make_targets(2))
    for name in NUL_BY_FUNCTION[function]:
        field, call = {**NUL_WRITES, **NUL_READS}[name]
        assert_refused(call, field)


def test_nul_escaped_in_json_options_is_stored(store: dcache.StoreDatabase) -> None:
    """A NUL inside a JSON string is the escape \\u0000, six plain characters: stored on both backends."""
    options = {"a": "x\x00y"}  # a dict: stored as compact JSON, the NUL escaped as \u0000
    dcache.create_batch_job(
        make_job("job-1", targets_total=2),
        [make_target(0, options=options), make_target(1, options='{"b":"\\u0000"}')],
    )
    targets = dcache.batch_targets("job-1")
    assert targets is not None
    assert json.loads(targets[0].options) == options and targets[1].options == '{"b":"\\u0000"}'


RAW_NUL_OPTIONS = {
    "inside-a-string": '{"a":"x\x00y"}',  # a raw control character: not JSON
    "after-the-value": '{"a":1}\x00garbage',  # C code that stops at the NUL would see valid JSON
    "trailing": "{}\x00",
}


@pytest.mark.parametrize("options", list(RAW_NUL_OPTIONS.values()), ids=list(RAW_NUL_OPTIONS))
@pytest.mark.parametrize("how", ["put", "create"])
def test_raw_nul_in_options_text_is_not_json(
    store: dcache.SerializedSqliteDatabase, how: str, options: str
) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(options)
    create_partial(make_job("job-1", targets_total=3), make_targets(1))
    bad = [make_target(1), make_target(2, options=options)]  # the bad one last: nothing may be half-written
    if how == "put":
        assert_refused(lambda: dcache.put_batch_targets("job-1", bad), "options")
    else:
        assert_refused(lambda: dcache.create_batch_job(make_job("job-2"), [make_target(0), *bad]), "options")


# -- A 10 MB result ------------------------------------------------------------------------------------------

TEN_MB = "aé☃🎉" * (1 << 20)  # 4 Mi characters, 10 MiB of UTF-8


def test_ten_megabyte_result(store: dcache.SerializedSqliteDatabase) -> None:
    assert utf8(TEN_MB) == 10 * (1 << 20) != len(TEN_MB)
    dcache.create_batch_job(make_job(targets_total=2), make_targets(2))
    dcache.update_batch_target("job-1", 0, "done", result=TEN_MB, now=2_000)
    job = dcache.batch_job("job-1")
    assert job is not None and job.nbytes == utf8(TEN_MB) and job.targets_done == 1
    targets = dcache.batch_targets("job-1")
    assert targets is not None and targets[0].result == TEN_MB
    assert dcache.batch_nbytes() == utf8(TEN_MB)

    other = (
        "\x01" + TEN_MB[:-1]
    )  # replaced by another of nearly the same size: nbytes moves by the difference
    dcache.update_batch_target("job-1", 0, "done", result=other, now=2_001)
    dcache.update_batch_target("job-1", 1, "failed", result=TEN_MB, now=2_002)
    job = dcache.batch_job("job-1")
    assert job is not None and job.nbytes == utf8(other) + utf8(TEN_MB) and job.targets_done == 2
    assert dcache.batch_nbytes() == job.nbytes

    dcache.set_batch_job_status("job-1", "done", now=2_003)
    assert dcache.evict_batch_oldest(utf8(TEN_MB)) == 1
    assert counts() == (0, 0, 0)


# -- 100,000 targets with the variable limit lowered to 999 --------------------------------------------------


def generated(count: int) -> Iterator[BatchTarget]:
    for i in range(count):
        yield BatchTarget(idx=i, url=f"https://example.com/{i}", options="{}")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["put", "create"])
def test_hundred_thousand_targets_under_variable_limit_999(file_store: Path, how: str) -> None:
    db.connection().setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    with pytest.raises(Exception, match="too many SQL variables"):  # the limit is in force
        db.execute_sql("SELECT " + ", ".join(["?"] * 1_000), [0] * 1_000)
    job = make_job(targets_total=100_000)
    if how == "put":
        dcache.create_batch_job(job)
        dcache.put_batch_targets("job-1", generated(100_000))
    else:
        dcache.create_batch_job(job, generated(100_000))
    assert counts() == (1, 100_000, 0)
    summary = "SELECT COUNT(DISTINCT idx), MIN(idx), MAX(idx), SUM(status = 'pending') FROM batch_target"
    assert db.execute_sql(summary).fetchone() == (100_000, 0, 99_999, 100_000)
    last = BatchTarget.select().where(BatchTarget.idx >= 99_998).order_by(BatchTarget.idx)
    assert [(t.job_id, t.idx, t.url) for t in last] == [
        ("job-1", i, f"https://example.com/{i}") for i in (99_998, 99_999)
    ]
    assert dcache.evict_batch_oldest(0) == 0 and dcache.sweep_batch(0, now=1_000) == 1
    assert counts() == (0, 0, 0)


# -- NaN and options that JSON cannot hold -------------------------------------------------------------------


class Opaque:
    pass


BAD_OPTIONS: dict[str, Any] = {
    "dict-nan": {"x": float("nan")},
    "dict-inf": {"x": float("inf")},
    "nested-nan": {"a": [1, {"b": float("-inf")}]},
    "list-nan": [float("nan")],
    "dict-set": {"s": {1, 2}},
    "dict-object": {"o": Opaque()},
    "dict-bytes": {"b": b"x"},
    "tuple-key": {("t",): 1},
    "text-NaN": "NaN",
    "text-nan-value": '{"a": NaN}',
    "text-Infinity": "[Infinity]",
}


def nested_list(depth: int) -> list[Any]:
    outer: list[Any] = []
    inner = outer
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


TOO_DEEP_OPTIONS: dict[str, Any] = {
    "text-2001": "[" * 2001 + "]" * 2001,
    "text-objects-2001": '{"a":' * 2001 + "1" + "}" * 2001,
    "text-100000": "[" * 100_000 + "]" * 100_000,  # PostgreSQL's json fails with "stack depth" here
    "list-3000": nested_list(3000),  # deeper than Python's recursion limit when dumped
}


#: NaN and non-JSON options, and options nested deeper than 2000 (refused on every backend).
REFUSED_OPTIONS: dict[str, Any] = {**BAD_OPTIONS, **TOO_DEEP_OPTIONS}


def test_the_options_check_refuses_nan_non_json_and_too_deep_options() -> None:
    """The check every entry point makes in Python: a dict or list JSON cannot hold, or text nested too deep
    (a model write also checks the text is JSON here; the store's functions leave that to the backend)."""
    for name, options in REFUSED_OPTIONS.items():
        with pytest.raises(dcache.InvalidBatchInput) as info:
            checked_options(options)
        assert info.value.field == "options", name
        assert str(info.value).startswith("options:"), name
        if not isinstance(options, str):
            with pytest.raises(dcache.InvalidBatchInput):
                options_text(options)
        elif name in TOO_DEEP_OPTIONS:
            assert json_too_deep(options), name
        else:
            assert not is_json(options), name


#: Through each of put and create on each backend: text that only the backend's own JSON check refuses, and
#: one refusal of each of the checks made in Python.
REFUSED_BY_EVERY_BACKEND = [*(n for n in BAD_OPTIONS if n.startswith("text-")), "dict-nan", "text-2001"]


@pytest.mark.parametrize(
    "options", [REFUSED_OPTIONS[n] for n in REFUSED_BY_EVERY_BACKEND], ids=REFUSED_BY_EVERY_BACKEND
)
@pytest.mark.parametrize("how", ["put", "create"])
def test_nan_non_json_and_too_deep_options_are_refused(
    store: dcache.StoreDatabase, how: str, options: Any
) -> None:
    create_partial(make_job("job-1", targets_total=3), make_targets(1))
    dcache.update_batch_target("job-1", 0, "done", result="é", now=2_000)  # bytes that must not move
    bad = [make_target(1), make_target(2, options=options)]
    if how == "put":
        assert_refused(lambda: dcache.put_batch_targets("job-1", bad), "options")
    else:
        assert_refused(lambda: dcache.create_batch_job(make_job("job-2"), [make_target(0), *bad]), "options")
    assert counts() == (1, 1, 2)


DEEP_BUT_LEGAL_OPTIONS = {
    "text-2000": "[" * 2000 + "]" * 2000,
    "brackets-in-a-string": json.dumps({"s": "[" * 5000 + "{" * 5000}),
    "escaped-quote-then-brackets": '["\\"' + "[" * 3000 + '"]',
}


@pytest.mark.parametrize("options", list(DEEP_BUT_LEGAL_OPTIONS.values()), ids=list(DEEP_BUT_LEGAL_OPTIONS))
def test_options_up_to_2000_deep_are_stored_verbatim(store: dcache.StoreDatabase, options: str) -> None:
    dcache.create_batch_job(make_job("job-1", targets_total=1), [make_target(0, options=options)])
    targets = dcache.batch_targets("job-1")
    assert targets is not None and targets[0].options == options


# -- An SQL injection string in every id-like field ----------------------------------------------------------

DROP = "'; DROP TABLE batch_job; --"


def test_drop_table_string_is_stored_verbatim(store: dcache.SerializedSqliteDatabase) -> None:
    dcache.create_batch_job(
        make_job(DROP, caller=DROP, idem_key=DROP, error=DROP, targets_total=1), [make_target(0, url=DROP)]
    )
    dcache.update_batch_target(DROP, 0, "done", result=DROP, error=DROP, hint=DROP, now=2_000)
    dcache.touch_batch_job(DROP, now=2_001)

    job = dcache.batch_job(DROP)
    assert job is not None
    assert (job.id, job.caller, job.idem_key, job.error, job.nbytes) == (DROP, DROP, DROP, DROP, utf8(DROP))
    targets = dcache.batch_targets(DROP)
    assert targets is not None
    assert [(t.job_id, t.url, t.result, t.error, t.hint) for t in targets] == [(DROP, DROP, DROP, DROP, DROP)]
    assert BatchJob.get(BatchJob.caller == DROP).id == DROP
    assert BatchTarget.select().where(BatchTarget.url == DROP).count() == 1
    assert dcache.batch_job_by_idem(DROP, DROP, 10, now=2_005) == DROP
    assert dcache.live_batch_jobs(DROP) == 1
    assert dcache.batch_nbytes() == utf8(DROP)
    tables = set(db.get_tables())
    assert {"batch_job", "batch_target"} <= tables
    dcache.set_batch_job_status(DROP, "done", DROP, now=2_006)
    assert dcache.evict_batch_oldest(0) == 1
    assert counts() == (0, 0, 0)


# -- The longest id -------------------------------------------------------------------------------------


@pytest.mark.parametrize("job_id", ["i" * MAX_KEY_BYTES, "é☃" * 204 + "éé"], ids=["ascii", "non-ascii"])
def test_longest_id(store: dcache.SerializedSqliteDatabase, job_id: str) -> None:
    assert len(job_id.encode()) == MAX_KEY_BYTES
    create_partial(make_job(job_id, idem_key="k", targets_total=3), make_targets(2))
    dcache.put_batch_targets(job_id, [make_target(2)])
    dcache.update_batch_target(job_id, 1, "done", result="r", now=2_000)
    dcache.touch_batch_job(job_id, now=2_001)
    job = dcache.batch_job(job_id)
    assert job is not None and job.id == job_id and (job.targets_done, job.nbytes, job.lease) == (1, 1, 2_001)
    targets = dcache.batch_targets(job_id)
    assert targets is not None and [t.job_id for t in targets] == [job_id] * 3
    assert dcache.batch_job_by_idem("alice", "k", 10, now=2_005) == job_id
    assert dcache.batch_job(job_id[:-1]) is None and dcache.batch_job(job_id + "x") is None
    assert_refused(lambda: dcache.update_batch_target(job_id, 1, "running"), "status")
    with pytest.raises(dcache.DuplicateJob):
        dcache.create_batch_job(make_job(job_id))
    assert dcache.sweep_batch(0, now=2_001) == 1
    assert counts() == (0, 0, 0)
