"""``options`` is JSON, one rule at every entry point: the store's functions, the models' writes and the
pytest plugin's factories, on every backend.

A dict or list is stored as compact JSON (``separators=(",", ":")``, non-ASCII as UTF-8, keys in the
dict's order); a str that is JSON is stored verbatim; anything else is ``InvalidBatchInput`` naming
``options``, with every table as it was. Reading gives the stored text; ``parsed_options()`` parses it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from helpers import make_job, make_target, snapshot

from sift import dcache, testing
from sift.dcache import BatchTarget, db
from sift.dcache.jsontext import checked_options, options_text

JOB, IDX = "job-1", 1  # every write below stores (or changes) this target
URL = "https://example.com/1"


def _model_save_new(options: Any) -> None:
    BatchTarget(job=JOB, idx=IDX, url=URL, options=options, status="pending").save(force_insert=True)


def _model_save_changed(options: Any) -> None:
    target = BatchTarget.get((BatchTarget.job_id == JOB) & (BatchTarget.idx == IDX))
    target.options = options
    target.save()


#: Each entry point, writing ``options`` for target (JOB, IDX) or, for a new job, its target 0.
WRITES: dict[str, Callable[[Any], Any]] = {
    "put_batch_targets": lambda v: dcache.put_batch_targets(JOB, [make_target(IDX, options=v)]),
    "create_batch_job": lambda v: dcache.create_batch_job(
        make_job("new", targets_total=1), [make_target(0, options=v)]
    ),
    "submit_batch_job": lambda v: dcache.submit_batch_job(
        make_job("new", targets_total=1, idem_key="k"), [make_target(0, options=v)], 60
    ),
    "testing.make_targets": lambda v: dcache.create_batch_job(
        make_job("new", targets_total=1), testing.make_targets(1, options=v)
    ),
    "BatchTarget.create": lambda v: BatchTarget.create(job=JOB, idx=IDX, url=URL, options=v),
    "BatchTarget.save": _model_save_new,
    "BatchTarget.save-changed": _model_save_changed,
    "BatchTarget.insert": lambda v: BatchTarget.insert(job=JOB, idx=IDX, url=URL, options=v).execute(),
    "BatchTarget.insert_many": lambda v: BatchTarget.insert_many(
        [{"job": JOB, "idx": IDX, "url": URL, "options": v, "status": "pending"}]
    ).execute(),
    "BatchTarget.update": lambda v: (
        BatchTarget.update(options=v).where((BatchTarget.job_id == JOB) & (BatchTarget.idx == IDX)).execute()
    ),
}
#: The writes that change the stored target (JOB, IDX) rather than add one.
CHANGES = {"BatchTarget.save-changed", "BatchTarget.update"}

DEEP_JSON = "[" * 1500 + "]" * 1500  # deeper than Python's own parser recurses, within the stores' 2000

#: options given -> the text stored
STORED: dict[str, tuple[Any, str]] = {
    "dict": ({"render": False, "é": [1, 2.5], "b": None}, '{"render":false,"é":[1,2.5],"b":null}'),
    "list": ([1, "a", {"z": 1, "a": 2}], '[1,"a",{"z":1,"a":2}]'),
    "text": ('{"b": 1,  "a": [1, 2]}', '{"b": 1,  "a": [1, 2]}'),
    "text-scalar": ('"just a string"', '"just a string"'),
    "text-deep": (DEEP_JSON, DEEP_JSON),
}

#: options given -> refused (InvalidBatchInput, field options)
REFUSED: dict[str, Any] = {
    "invalid-text": '{"render": ',
    "python-repr": "{'render': False}",
    "bytes": b'{"render":false}',
    "int": 3,
    "none": None,
    "text-NaN": '{"a": NaN}',
    "text-deep-unclosed": "[" * 1500 + "]" * 1499,
    "tuple": (1, 2),
}


@pytest.fixture
def job_store(store: dcache.StoreDatabase) -> dcache.StoreDatabase:
    """The store with JOB (2 targets, created now) holding target 0, done with a result, and, for the
    writes that change a target, target IDX too."""
    now = dcache.unix_now()
    dcache.create_batch_job(make_job(JOB, targets_total=2, created_at=now, lease=now))
    dcache.put_batch_targets(JOB, [make_target(0)])
    dcache.update_batch_target(JOB, 0, "done", result="é", now=now)
    return store


def stored_options(job_id: str, idx: int) -> str:
    sql = f"SELECT options FROM batch_target WHERE job_id = {db.param} AND idx = {db.param}"
    rows = db.execute_sql(sql, (job_id, idx)).fetchall()
    assert len(rows) == 1
    return str(rows[0][0])


#: What every entry point stores on every backend: a dict dumped here, and text the backend's JSON check
#: must take at its depth (the rest of STORED is the validator's, below).
STORED_EVERYWHERE = ("dict", "text-deep")


def test_the_options_rule_gives_the_text_stored() -> None:
    for name, (given, expected) in STORED.items():
        assert options_text(given) == expected, name
        assert checked_options(given) == expected, name


def test_the_options_rule_refuses_what_is_not_json() -> None:
    for name, given in REFUSED.items():
        with pytest.raises(dcache.InvalidBatchInput) as info:
            checked_options(given)
        assert info.value.field == "options", name
        assert str(info.value).startswith("options: "), name


#: JSON text the store's functions check in SQL, each backend its own way: refused by each backend.
REFUSED_TEXT = {name: given for name, given in REFUSED.items() if isinstance(given, str)}


@pytest.mark.parametrize("given", list(REFUSED_TEXT.values()), ids=list(REFUSED_TEXT))
def test_each_backend_refuses_options_text_that_is_not_json(
    job_store: dcache.StoreDatabase, given: str
) -> None:
    before, nbytes = snapshot(), dcache.batch_nbytes()
    with pytest.raises(dcache.InvalidBatchInput) as info:
        WRITES["put_batch_targets"](given)
    assert info.value.field == "options"
    assert snapshot() == before
    assert dcache.batch_nbytes() == nbytes


@pytest.mark.parametrize(
    "given,expected", [STORED[name] for name in STORED_EVERYWHERE], ids=STORED_EVERYWHERE
)
@pytest.mark.parametrize("write", list(WRITES), ids=list(WRITES))
def test_json_options_are_stored_as_json_text(
    job_store: dcache.StoreDatabase, write: str, given: Any, expected: str
) -> None:
    if write in CHANGES:
        dcache.put_batch_targets(JOB, [make_target(IDX, options="{}")])
    WRITES[write](given)
    where = (
        ("new", 0)
        if write in ("create_batch_job", "submit_batch_job", "testing.make_targets")
        else (JOB, IDX)
    )
    assert stored_options(*where) == expected
    target = BatchTarget.get((BatchTarget.job_id == where[0]) & (BatchTarget.idx == where[1]))
    assert target.options == expected  # reading gives the stored text
    if expected is not DEEP_JSON:  # Python's json parser recurses, and stops at about 1,000 levels
        assert target.parsed_options() == json.loads(expected)
    assert dcache.check_store().ok


@pytest.mark.parametrize("write", list(WRITES), ids=list(WRITES))
def test_options_that_are_not_json_are_refused_and_nothing_is_written(
    job_store: dcache.StoreDatabase, write: str
) -> None:
    given = REFUSED["python-repr"]
    if write in CHANGES:
        dcache.put_batch_targets(JOB, [make_target(IDX, options="{}")])
    before, nbytes = snapshot(), dcache.batch_nbytes()
    with pytest.raises(dcache.InvalidBatchInput) as info:
        WRITES[write](given)
    assert info.value.field == "options"
    assert str(info.value).startswith("options: ")
    assert snapshot() == before
    assert dcache.batch_nbytes() == nbytes


def test_a_model_write_in_a_transaction_is_refused_before_anything_is_sent(job_store: Any) -> None:
    """The field refuses while Peewee builds the statement: the transaction around it rolls back whole."""
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput), db.atomic():
        BatchTarget.create(job=JOB, idx=IDX, url=URL, options={"ok": True})
        BatchTarget.update(options="{'bad': 1}").where(BatchTarget.job_id == JOB).execute()
    assert snapshot() == before


@pytest.mark.parametrize(
    "options",
    [{"render": False}, [1, 2], '{"b": 1,  "a": 2}'],
    ids=["dict", "list", "text"],
)
def test_parsed_options_of_an_unsaved_target(options: Any) -> None:
    parsed = BatchTarget(idx=0, url=URL, options=options).parsed_options()
    assert parsed == (json.loads(options) if isinstance(options, str) else options)


def test_parsed_options_refuses_what_the_store_would(store: Any) -> None:
    with pytest.raises(dcache.InvalidBatchInput) as info:
        BatchTarget(idx=0, url=URL, options="{'render': False}").parsed_options()
    assert info.value.field == "options"


def test_make_targets_gives_the_text_the_store_keeps() -> None:
    targets = testing.make_targets(2, options={"render": False, "wait": [1]})
    assert [t.options for t in targets] == ['{"render":false,"wait":[1]}'] * 2
