"""Bad input: every case of the issue's list raises the right error naming the field, and writes nothing.

One table drives one test. Each row is a call with one bad value; the store holds a few jobs and targets
before it, and ``snapshot()`` must be equal before and after. The rows of one call and field run in turn
on one store: each leaves every row as it was, so each meets the store as if it ran alone.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from helpers import create_partial, make_job, make_target, make_targets, snapshot

from sift import dcache

BIG = 100_000


@dataclass(frozen=True)
class Case:
    call: Callable[[], object]
    field: str
    exc: type[Exception] = dcache.InvalidBatchInput


def setup_store() -> None:
    """job-1: targets 0 and 1 of 3, target 0 done; job-2: no targets yet; big: room for 100,000 targets."""
    create_partial(make_job("job-1", idem_key="k", status="running"), make_targets(2))
    dcache.update_batch_target("job-1", 0, "done", result="abc", now=1_000)
    dcache.create_batch_job(make_job("job-2", targets_total=3))
    dcache.create_batch_job(make_job("big", targets_total=BIG))


CASES: dict[str, Case] = {}


def bind(value: Any, call: Callable[[Any], object]) -> Callable[[], object]:
    """``call(value)``, later: binds a loop's current value (mypy cannot type a lambda's default argument)."""
    return lambda: call(value)


def case(
    name: str, call: Callable[[], object], field: str, exc: type[Exception] = dcache.InvalidBatchInput
) -> None:
    assert name not in CASES, name
    CASES[name] = Case(call, field, exc)


# Not an int (a bool is not an int here), negative, or too large for SQLite's INTEGER.
BAD_INTS: dict[str, Any] = {
    "str": "1",
    "float": 1.0,
    "true": True,
    "false": False,
    "none": None,
    "negative": -1,
    "very-negative": -(2**63),
    "too-big": 2**63,
}
BAD_NOW = {k: v for k, v in BAD_INTS.items() if k != "none"}  # now=None means "the clock"
SURROGATES = {"lone-high": "\ud800", "lone-low": "x\udfffy", "pair-as-two": "a\ud83d\ude00"}


# -- A status or caller_class that is not one of the values ---------------------------------------------

BAD_JOB_STATUSES: dict[str, Any] = {
    "bogus": "bogus",
    "empty": "",
    "upper": "QUEUED",
    "target-status": "pending",
    "space": " queued",
    "nul": "queued\x00",
    "surrogate": "queued\ud800",
    "none": None,
    "int": 1,
}
for name, value in BAD_JOB_STATUSES.items():
    case(
        f"create-status-{name}",
        bind(value, lambda v: dcache.create_batch_job(make_job("new", status=v))),
        "status",
    )
    case(
        f"set-status-{name}", bind(value, lambda v: dcache.set_batch_job_status("job-1", v, now=5)), "status"
    )

BAD_TARGET_STATUSES: dict[str, Any] = {
    "bogus": "bogus",
    "empty": "",
    "upper": "DONE",
    "job-status": "partial",
    "queued": "queued",
    "surrogate": "done\udc00",
    "none": None,
    "int": 0,
}
for name, value in BAD_TARGET_STATUSES.items():
    case(
        f"update-status-{name}",
        bind(value, lambda v: dcache.update_batch_target("job-1", 1, v, now=5)),
        "status",
    )

BAD_CALLER_CLASSES: dict[str, Any] = {
    "bogus": "admin",
    "empty": "",
    "upper": "Fleet",
    "space": "fleet ",
    "surrogate": "fleet\ud800",
    "none": None,
    "int": 1,
}
for name, value in BAD_CALLER_CLASSES.items():
    case(
        f"create-caller_class-{name}",
        bind(value, lambda v: dcache.create_batch_job(make_job("new", caller_class=v))),
        "caller_class",
    )

# -- now, idx, targets_total, targets_done, created_at, lease, nbytes: int, not bool, not negative ----------

for column in ("targets_total", "targets_done", "created_at", "lease", "nbytes"):
    for name, value in BAD_INTS.items():
        case(
            f"create-{column}-{name}",
            bind({column: value}, lambda kw: dcache.create_batch_job(make_job("new", **kw), make_targets(1))),
            column,
        )

NOW_CALLS: dict[str, Callable[[Any], object]] = {
    "update_batch_target": lambda now: dcache.update_batch_target("job-1", 1, "running", now=now),
    "update_batch_target-done": lambda now: dcache.update_batch_target(
        "job-1", 1, "done", result="r", now=now
    ),
    "set_batch_job_status": lambda now: dcache.set_batch_job_status("job-1", "done", now=now),
    "touch_batch_job": lambda now: dcache.touch_batch_job("job-1", now=now),
    "mark_in_flight_failed": lambda now: dcache.mark_in_flight_failed("restart", now=now),
    "sweep_batch": lambda now: dcache.sweep_batch(0, now=now),
    "batch_job_by_idem": lambda now: dcache.batch_job_by_idem("alice", "k", 10, now=now),
}
for fn_name, fn in NOW_CALLS.items():
    for name, value in BAD_NOW.items():
        case(f"{fn_name}-now-{name}", bind(value, fn), "now")

for name, value in BAD_INTS.items():
    case(
        f"update-idx-{name}",
        bind(value, lambda v: dcache.update_batch_target("job-1", v, "done", now=5)),
        "idx",
    )
    case(
        f"put-idx-{name}",
        bind(value, lambda v: dcache.put_batch_targets("job-2", [make_target(idx=v)])),
        "idx",
    )
    case(
        f"create-target-idx-{name}",
        bind(value, lambda v: dcache.create_batch_job(make_job("new"), [make_target(idx=v)])),
        "idx",
    )

# -- targets_done outside 0..targets_total -----------------------------------------------------------------

case(
    "targets_done-over-total",
    lambda: dcache.create_batch_job(make_job("new", targets_done=4)),
    "targets_done",
)
case(
    "targets_done-over-zero-total",
    lambda: dcache.create_batch_job(make_job("new", targets_total=0, targets_done=1)),
    "targets_done",
)

# -- targets_done or nbytes other than 0: they follow the job's targets, which are stored pending -----------

#: A new job's fields as a user gives them to BatchJob.create and .insert (the model defaults the rest).
NEW_JOB: dict[str, Any] = {
    "id": "new",
    "caller": "bob",
    "caller_class": "fleet",
    "idem_key": "",
    "status": "queued",
    "targets_total": 3,
    "created_at": 1_000,
    "lease": 1_000,
}
COUNTS_GIVEN: dict[str, tuple[str, int]] = {
    "targets_done-1": ("targets_done", 1),
    "targets_done-all": ("targets_done", 3),
    "nbytes-1": ("nbytes", 1),
    "nbytes-huge": ("nbytes", 10**12),
}
COUNT_CALLS: dict[str, Callable[[dict[str, Any]], object]] = {
    "create": lambda kw: dcache.create_batch_job(make_job("new", **kw)),
    "create-with-targets": lambda kw: dcache.create_batch_job(make_job("new", **kw), make_targets(3)),
    "submit": lambda kw: dcache.submit_batch_job(make_job("new", idem_key="n", **kw), None, 3_600, now=1_000),
    "submit-with-targets": lambda kw: dcache.submit_batch_job(
        make_job("new", idem_key="n", **kw), make_targets(3), 3_600, now=1_000
    ),
    "BatchJob.create": lambda kw: dcache.BatchJob.create(**NEW_JOB, **kw),
    "BatchJob.insert": lambda kw: dcache.BatchJob.insert(**NEW_JOB, **kw).execute(),
}
for call_name, call in COUNT_CALLS.items():
    for name, (column, value) in COUNTS_GIVEN.items():
        case(f"{call_name}-{name}", bind({column: value}, call), column)

# -- A negative max_bytes or ttl -------------------------------------------------------------------------

BAD_MAX_BYTES: dict[str, Any] = {**BAD_INTS, "fraction": 0.5}
for name, value in BAD_MAX_BYTES.items():
    case(f"evict-max_bytes-{name}", bind(value, lambda v: dcache.evict_batch_oldest(v)), "max_bytes")

BAD_TTLS: dict[str, Any] = {
    "negative-int": -1,
    "negative-float": -0.5,
    "negative-tiny": -1e-9,
    "negative-timedelta": timedelta(seconds=-1),
    "negative-microsecond": timedelta(microseconds=-1),
    "str": "10",
    "none": None,
    "bool": True,
}
for name, value in BAD_TTLS.items():
    case(f"sweep-ttl-{name}", bind(value, lambda v: dcache.sweep_batch(v, now=5_000)), "ttl")
    case(
        f"idem-ttl-{name}", bind(value, lambda v: dcache.batch_job_by_idem("alice", "k", v, now=1_000)), "ttl"
    )

# -- An empty id, caller or url --------------------------------------------------------------------------

case("create-id-empty", lambda: dcache.create_batch_job(make_job("")), "id")
case("create-id-empty-with-targets", lambda: dcache.create_batch_job(make_job(""), make_targets(2)), "id")
case("create-caller-empty", lambda: dcache.create_batch_job(make_job("new", caller="")), "caller")
case("put-url-empty", lambda: dcache.put_batch_targets("job-2", [make_target(0, url="")]), "url")
case("create-url-empty", lambda: dcache.create_batch_job(make_job("new"), [make_target(0, url="")]), "url")
case("put-job_id-empty", lambda: dcache.put_batch_targets("", make_targets(1)), "job_id")
case("update-job_id-empty", lambda: dcache.update_batch_target("", 0, "done", now=5), "job_id")
case("set-status-job_id-empty", lambda: dcache.set_batch_job_status("", "done", now=5), "job_id")
case("touch-job_id-empty", lambda: dcache.touch_batch_job("", now=5), "job_id")
for name, value in {"none": None, "int": 5, "bytes": b"job"}.items():
    case(f"create-id-{name}", bind(value, lambda v: dcache.create_batch_job(make_job(v))), "id")
    case(
        f"create-caller-{name}",
        bind(value, lambda v: dcache.create_batch_job(make_job("new", caller=v))),
        "caller",
    )
    case(
        f"create-idem_key-{name}",
        bind(value, lambda v: dcache.create_batch_job(make_job("new", idem_key=v))),
        "idem_key",
    )
    case(
        f"create-error-{name}",
        bind(value, lambda v: dcache.create_batch_job(make_job("new", error=v))),
        "error",
    )
    case(
        f"put-url-{name}",
        bind(value, lambda v: dcache.put_batch_targets("job-2", [make_target(0, url=v)])),
        "url",
    )
    case(f"put-job_id-{name}", bind(value, lambda v: dcache.put_batch_targets(v, make_targets(1))), "job_id")
    case(
        f"update-job_id-{name}",
        bind(value, lambda v: dcache.update_batch_target(v, 0, "done", now=5)),
        "job_id",
    )
    case(
        f"set-status-job_id-{name}",
        bind(value, lambda v: dcache.set_batch_job_status(v, "done", now=5)),
        "job_id",
    )
    case(f"touch-job_id-{name}", bind(value, lambda v: dcache.touch_batch_job(v, now=5)), "job_id")
    case(f"idem-caller-{name}", bind(value, lambda v: dcache.batch_job_by_idem(v, "k", 10, now=5)), "caller")
    case(
        f"idem-idem_key-{name}",
        bind(value, lambda v: dcache.batch_job_by_idem("alice", v, 10, now=5)),
        "idem_key",
    )
    case(f"live-caller-{name}", bind(value, lambda v: dcache.live_batch_jobs(v)), "caller")
    case(f"reason-{name}", bind(value, lambda v: dcache.mark_in_flight_failed(v, now=5)), "reason")

# -- A target idx outside 0..targets_total-1, or a duplicate within the call or already stored ---------------

for name, idx in {"equal-total": 3, "over-total": 4, "far": 2**62}.items():
    case(
        f"put-idx-out-of-range-{name}",
        bind(idx, lambda i: dcache.put_batch_targets("job-2", [make_target(i)])),
        "idx",
    )
    case(
        f"put-idx-out-of-range-after-good-{name}",
        bind(
            idx, lambda i: dcache.put_batch_targets("job-2", [make_target(0), make_target(1), make_target(i)])
        ),
        "idx",
    )
    case(
        f"create-idx-out-of-range-{name}",
        bind(idx, lambda i: dcache.create_batch_job(make_job("new"), [make_target(0), make_target(i)])),
        "idx",
    )
case(
    "put-idx-zero-total",
    lambda: dcache.create_batch_job(make_job("new", targets_total=0), make_targets(1)),
    "idx",
)
case(
    "put-duplicate-in-call",
    lambda: dcache.put_batch_targets("job-2", [make_target(0), make_target(0)]),
    "idx",
)
case(
    "put-duplicate-in-call-later",
    lambda: dcache.put_batch_targets(
        "job-2", [make_target(2), make_target(0), make_target(1), make_target(0)]
    ),
    "idx",
)
case("put-duplicate-stored", lambda: dcache.put_batch_targets("job-1", [make_target(1)]), "idx")
case("put-duplicate-stored-finished", lambda: dcache.put_batch_targets("job-1", [make_target(0)]), "idx")
case(
    "put-duplicate-stored-after-new",
    lambda: dcache.put_batch_targets("job-1", [make_target(2), make_target(0)]),
    "idx",
)
case(
    "create-duplicate-in-call",
    lambda: dcache.create_batch_job(make_job("new"), [make_target(1), make_target(2), make_target(1)]),
    "idx",
)

# -- A target put with a status other than pending, or with a result, error or hint ------------------------

for name, status in {
    "running": "running",
    "done": "done",
    "failed": "failed",
    "bogus": "bogus",
    "empty": "",
}.items():
    case(
        f"put-status-{name}",
        bind(status, lambda s: dcache.put_batch_targets("job-2", [make_target(0, status=s)])),
        "status",
    )
    case(
        f"create-target-status-{name}",
        bind(
            status,
            lambda s: dcache.create_batch_job(make_job("new"), [make_target(0), make_target(1, status=s)]),
        ),
        "status",
    )
for column in ("result", "error", "hint"):
    for name, value in {"text": "x", "empty": ""}.items():
        case(
            f"put-{column}-{name}",
            bind({column: value}, lambda kw: dcache.put_batch_targets("job-2", [make_target(0, **kw)])),
            column,
        )
        case(
            f"create-target-{column}-{name}",
            bind(
                {column: value}, lambda kw: dcache.create_batch_job(make_job("new"), [make_target(0, **kw)])
            ),
            column,
        )

# -- options that are not valid JSON text ---------------------------------------------------------------

BAD_JSON: dict[str, Any] = {
    "open-brace": "{",
    "empty": "",
    "blank": "   ",
    "word": "not json",
    "single-quotes": "{'a': 1}",
    "unquoted-key": "{a:1}",
    "trailing-comma": "[1,]",
    "nan": "NaN",
    "infinity": "-Infinity",
    "undefined": "undefined",
    "unterminated": '{"a": 1',
    "two-values": "1 2",
    "comment": "[1] // c",
    "hex": "0x10",
    "none": None,
    "int": 5,
    "bytes": b"{}",
    "dict-not-serialisable": {"a": object()},
    "dict-nan": {"a": float("nan")},
}
for name, value in BAD_JSON.items():
    case(
        f"put-options-{name}",
        bind(value, lambda v: dcache.put_batch_targets("job-2", [make_target(0), make_target(1, options=v)])),
        "options",
    )
    case(
        f"create-options-{name}",
        bind(value, lambda v: dcache.create_batch_job(make_job("new"), [make_target(0, options=v)])),
        "options",
    )

# -- result, error or hint that is not a str ---------------------------------------------------------------

for column in ("result", "error", "hint"):
    for name, value in {"bytes": b"x", "int": 5, "list": ["x"], "dict": {"a": 1}}.items():
        case(
            f"update-{column}-{name}",
            bind({column: value}, lambda kw: dcache.update_batch_target("job-1", 1, "done", now=5, **kw)),
            column,
        )
for name, value in {"none": None, "int": 5, "bytes": b"x"}.items():
    case(
        f"set-status-error-{name}",
        bind(value, lambda v: dcache.set_batch_job_status("job-1", "failed", v, now=5)),
        "error",
    )

# -- A string that cannot be encoded as UTF-8 (a lone surrogate), in every string field -------------------

for sname, bad in SURROGATES.items():
    for column in ("id", "caller", "idem_key", "error"):
        job_fields: dict[str, Any] = {"job_id": bad} if column == "id" else {column: bad}
        case(
            f"create-{column}-{sname}",
            bind(job_fields, lambda f: dcache.create_batch_job(make_job(**f), make_targets(1))),
            column,
        )
    case(
        f"put-url-{sname}",
        bind(bad, lambda b: dcache.put_batch_targets("job-2", [make_target(0, url=b)])),
        "url",
    )
    case(
        f"put-url-later-{sname}",
        bind(bad, lambda b: dcache.put_batch_targets("job-2", [make_target(0), make_target(1, url=b)])),
        "url",
    )
    case(
        f"put-options-{sname}",
        bind(
            json.dumps(bad, ensure_ascii=False),
            lambda b: dcache.put_batch_targets("job-2", [make_target(0, options=b)]),
        ),
        "options",
    )
    case(
        f"put-options-dict-{sname}",
        bind(bad, lambda b: dcache.put_batch_targets("job-2", [make_target(0, options={"k": b})])),
        "options",
    )
    case(
        f"create-url-{sname}",
        bind(bad, lambda b: dcache.create_batch_job(make_job("new"), [make_target(0, url=b)])),
        "url",
    )
    for column in ("result", "error", "hint"):
        case(
            f"update-{column}-{sname}",
            bind({column: bad}, lambda kw: dcache.update_batch_target("job-1", 1, "failed", now=5, **kw)),
            column,
        )
    case(
        f"update-job_id-{sname}",
        bind(bad, lambda b: dcache.update_batch_target(b, 0, "done", now=5)),
        "job_id",
    )
    case(f"put-job_id-{sname}", bind(bad, lambda b: dcache.put_batch_targets(b, make_targets(1))), "job_id")
    case(
        f"set-status-job_id-{sname}",
        bind(bad, lambda b: dcache.set_batch_job_status(b, "done", now=5)),
        "job_id",
    )
    case(
        f"set-status-error-{sname}",
        bind(bad, lambda b: dcache.set_batch_job_status("job-1", "failed", b, now=5)),
        "error",
    )
    case(f"touch-job_id-{sname}", bind(bad, lambda b: dcache.touch_batch_job(b, now=5)), "job_id")
    case(f"reason-{sname}", bind(bad, lambda b: dcache.mark_in_flight_failed(b, now=5)), "reason")
    case(f"idem-caller-{sname}", bind(bad, lambda b: dcache.batch_job_by_idem(b, "k", 10, now=5)), "caller")
    case(
        f"idem-idem_key-{sname}",
        bind(bad, lambda b: dcache.batch_job_by_idem("alice", b, 10, now=5)),
        "idem_key",
    )
    case(f"live-caller-{sname}", bind(bad, lambda b: dcache.live_batch_jobs(b)), "caller")
    case(f"batch_job-job_id-{sname}", bind(bad, lambda b: dcache.batch_job(b)), "job_id")
    case(f"batch_targets-job_id-{sname}", bind(bad, lambda b: dcache.batch_targets(b)), "job_id")

# -- Not a job or a target at all, a key of the wrong type, a float with a fraction, past 64 bits ------------

case("create-not-a-job", lambda: dcache.create_batch_job("job"), "job")  # type: ignore[arg-type]
case("put-not-a-target", lambda: dcache.put_batch_targets("job-2", ["target"]), "targets")  # type: ignore[list-item]
case("batch_job-job_id-int", lambda: dcache.batch_job(5), "job_id")  # type: ignore[arg-type]
case("create-nbytes-fraction", lambda: dcache.create_batch_job(make_job("new", nbytes=1.5)), "nbytes")
case("touch_batch_job-now-past-64-bits", lambda: dcache.touch_batch_job("job-1", now=2**64), "now")
case("evict-max_bytes-past-64-bits", lambda: dcache.evict_batch_oldest(2**64), "max_bytes")

# -- A failure in the middle of a put of 100,000 targets writes nothing -----------------------------------


@functools.cache
def good_targets() -> tuple[dcache.BatchTarget, ...]:
    """100,000 good targets, built once (the store only reads them)."""
    return tuple(make_target(i) for i in range(BIG))


def many(bad_at: int, **bad: Any) -> Iterator[dcache.BatchTarget]:
    """100,000 targets from a generator; the one at ``bad_at`` gets the ``bad`` fields."""
    for i, target in enumerate(good_targets()):
        yield make_target(**{"idx": i, **bad}) if i == bad_at else target


case("big-put-bad-options", lambda: dcache.put_batch_targets("big", many(50_000, options="{")), "options")
case("big-put-bad-status", lambda: dcache.put_batch_targets("big", many(50_000, status="done")), "status")
case("big-put-duplicate-idx", lambda: dcache.put_batch_targets("big", many(99_999, idx=3)), "idx")
case("big-put-url-surrogate", lambda: dcache.put_batch_targets("big", many(99_999, url="\ud800")), "url")
case(
    "big-create-bad-options",
    lambda: dcache.create_batch_job(make_job("new", targets_total=BIG), many(50_000, options="nope")),
    "options",
)
case(
    "big-create-duplicate-idx",
    lambda: dcache.create_batch_job(make_job("new", targets_total=BIG), many(BIG - 1, idx=0)),
    "idx",
)


def groups() -> dict[str, list[str]]:
    """The cases by the call and the field they reach: ``put-options`` holds every bad ``options`` of a put,
    run in turn on one store. Each call with 100,000 targets is a group of its own (seconds each: the full
    lane's, ``pytest -m ""``)."""
    by_group: dict[str, list[str]] = {}
    for name, bad in CASES.items():
        key = name if name.startswith("big-") else f"{name.split('-', 1)[0]}-{bad.field}"
        by_group.setdefault(key, []).append(name)
    return by_group


def refuse(name: str) -> None:
    """Case ``name`` raises exactly its error, naming its field, and leaves every row of the store as it
    was (so the next case of its group meets the store ``setup_store`` made, as if it ran alone)."""
    bad = CASES[name]
    before = snapshot()
    try:
        bad.call()
    except Exception as exc:  # the case says which
        error = exc
    else:
        pytest.fail(f"{name}: raised nothing")
    assert type(error) is bad.exc, f"{name}: {error!r}"
    assert str(error).split(":", 1)[0] == bad.field, f"{name}: {error}"
    if isinstance(error, dcache.InvalidBatchInput):
        assert error.field == bad.field, name
    assert snapshot() == before, name


@pytest.mark.parametrize(
    "group",
    [
        pytest.param(names, id=key, marks=pytest.mark.slow if key.startswith("big-") else ())
        for key, names in groups().items()
    ],
)
def test_bad_input(store: Any, group: list[str]) -> None:
    setup_store()
    for name in group:
        refuse(name)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "idx"),
    [
        ("big-put-bad-options", 50_000),
        ("big-put-bad-status", 50_000),
        ("big-put-duplicate-idx", 3),
        ("big-put-url-surrogate", 99_999),
        ("big-create-bad-options", 50_000),
        ("big-create-duplicate-idx", 0),
    ],
)
def test_the_message_names_the_bad_target_of_a_big_put(store: Any, name: str, idx: int) -> None:
    # On PostgreSQL psycopg pipelines the rows, so the row that failed is not the last one sent.
    setup_store()
    with pytest.raises(dcache.InvalidBatchInput, match=rf"\btarget {idx}\b"):
        CASES[name].call()


# -- Strings full of SQL metacharacters are not bad input ---------------------------------------------------

METACHARS = {
    "drop": "'; DROP TABLE batch_job; --",
    "or-true": '" OR "1"="1" OR \'1\'=\'1',
    "close-paren": "') OR ('x'='x",
    "like": "%_\\%[a-z]*",
    "params": "? ?1 :name @p $1 %s {}",
    "comment": "/* c */ -- c\n;",
    "quotes": "`[]`\"'\"\"''",
    "unicode": "é'€\"😀;--",
}


def write_and_read(field: str, value: str) -> tuple[Any, Any]:
    """Store ``value`` in ``field`` through the functions; return (value read back, expected)."""
    if field == "id":
        create_partial(make_job(value), make_targets(1))
        job = dcache.batch_job(value)
        assert job is not None
        dcache.update_batch_target(value, 0, "done", result="r", now=5)
        dcache.touch_batch_job(value, now=6)
        targets = dcache.batch_targets(value)
        assert targets is not None and [t.job_id for t in targets] == [value]
        return job.id, value
    if field in ("caller", "idem_key"):
        dcache.create_batch_job(
            make_job("new", **{field: value, "idem_key" if field == "caller" else "caller": "k"})
        )
        job = dcache.batch_job("new")
        assert job is not None
        caller, key = (value, "k") if field == "caller" else ("k", value)
        assert dcache.batch_job_by_idem(caller, key, 100, now=1_000) == "new"
        assert dcache.live_batch_jobs(caller) == 1
        return getattr(job, field), value
    if field == "job-error":
        dcache.create_batch_job(make_job("new", error=value))
        job = dcache.batch_job("new")
        assert job is not None
        return job.error, value
    if field in ("url", "options"):
        stored = json.dumps({"v": value}) if field == "options" else value
        dcache.put_batch_targets("job-2", [make_target(2, **{field: stored})])
        targets = dcache.batch_targets("job-2")
        assert targets is not None
        return getattr(targets[0], field), stored
    if field in ("result", "target-error", "hint"):
        column = field.removeprefix("target-")
        dcache.update_batch_target("job-1", 1, "done", now=5, **{column: value})
        targets = dcache.batch_targets("job-1")
        assert targets is not None
        return getattr(targets[1], column), value
    if field == "status-error":
        dcache.set_batch_job_status("job-1", "failed", value, now=5)
        job = dcache.batch_job("job-1")
        assert job is not None
        return job.error, value
    assert field == "reason"
    dcache.mark_in_flight_failed(value, now=5)
    job = dcache.batch_job("job-1")
    assert job is not None
    return job.error, value


@pytest.mark.parametrize("value", list(METACHARS.values()), ids=list(METACHARS))
@pytest.mark.parametrize(
    "field",
    [
        "id",
        "caller",
        "idem_key",
        "job-error",
        "url",
        "options",
        "result",
        "target-error",
        "hint",
        "status-error",
        "reason",
    ],
)
def test_sql_metacharacters_are_stored_verbatim(store: Any, field: str, value: str) -> None:
    setup_store()
    jobs_before = dcache.db.execute_sql("SELECT COUNT(*) FROM batch_job").fetchone()[0]
    got, expected = write_and_read(field, value)
    assert got == expected
    jobs_after = dcache.db.execute_sql("SELECT COUNT(*) FROM batch_job").fetchone()[0]
    assert jobs_after == jobs_before + (field in ("id", "caller", "idem_key", "job-error"))
    if field == "result":
        job = dcache.batch_job("job-1")
        assert job is not None and job.nbytes == 3 + len(value.encode("utf-8"))
