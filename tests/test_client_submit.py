"""``submit``: a job from plain URLs, stored as a hand-built job through ``submit_batch_job`` would be, and
an idempotency key that never answers a job made from another request (``IdempotencyConflict``)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from helpers import make_job, snapshot

from sift import dcache
from sift.dcache import BatchTarget, db

URLS = ["https://example.com/a", "https://example.com/b", "https://other.example/c"]


def job_rows(job_id: str) -> dict[str, list[dict[str, Any]]]:
    """The job's row and its targets' rows (every column, the host too), without the job's id and
    PostgreSQL's insertion counter (``seq``), which differ between two jobs by design."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for table, key in (("batch_job", "id"), ("batch_target", "job_id")):
        cursor = db.execute_sql(f"SELECT * FROM {table}")
        names = [column[0] for column in cursor.description]
        found = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        rows[table] = sorted(
            ({k: v for k, v in r.items() if k not in (key, "seq")} for r in found if r[key] == job_id),
            key=repr,
        )
    return rows


def test_submit_stores_what_a_hand_built_job_stores(store: Any) -> None:
    options = '{"render":true}'
    job = make_job("hand", caller="alice", idem_key="k", targets_total=3, created_at=1_000, lease=1_000)
    targets = [BatchTarget(idx=i, url=url, options=options) for i, url in enumerate(URLS)]
    assert dcache.submit_batch_job(job, targets, 3600, now=1_000) == ("hand", True)
    hand = job_rows("hand")
    assert dcache.sweep_batch(0, now=10**6) == 1
    job_id, created = dcache.submit("alice", URLS, idem_key="k", options={"render": True}, now=1_000)
    assert created and len(job_id) == 32 and int(job_id, 16) >= 0  # a uuid4's hex
    assert job_rows(job_id) == hand
    assert dcache.check_store().ok


def test_the_entries_may_be_urls_pairs_or_targets(store: Any) -> None:
    urls = [URLS[0], (URLS[1], {"wait": 2}), BatchTarget(url=URLS[2], options="[1]"), (URLS[0], None)]
    job_id, _ = dcache.submit("alice", urls, options='{"x":1}', now=1_000)
    stored = dcache.batch_targets(job_id)
    assert stored is not None
    assert [(t.idx, t.url, t.options, t.status) for t in stored] == [
        (0, URLS[0], '{"x":1}', "pending"),
        (1, URLS[1], '{"wait":2}', "pending"),
        (2, URLS[2], "[1]", "pending"),
        (3, URLS[0], '{"x":1}', "pending"),
    ]
    job = dcache.batch_job(job_id)
    assert job is not None
    assert (job.status, job.targets_total, job.targets_done, job.created_at, job.lease, job.nbytes) == (
        "queued",
        4,
        0,
        1_000,
        1_000,
        0,
    )


@pytest.mark.parametrize("idem_key", ["", "k"])
def test_the_same_request_again(store: Any, idem_key: str) -> None:
    first = dcache.submit("alice", URLS, idem_key=idem_key, options={"a": 1}, now=1_000)
    before = snapshot()
    again = dcache.submit("alice", list(URLS), idem_key=idem_key, options={"a": 1}, now=1_010)
    if idem_key:  # the same job, nothing written
        assert again == (first.job_id, False)
        assert snapshot() == before
    else:  # an empty key always creates
        assert again.created and again.job_id != first.job_id


def test_the_same_request_in_another_form_is_the_same_request(store: Any) -> None:
    first = dcache.submit("alice", URLS, idem_key="k", options={"a": 1}, now=1_000)
    pairs = [(url, '{"a":1}') for url in URLS]
    assert dcache.submit("alice", pairs, idem_key="k", now=1_001) == (first.job_id, False)
    targets = [BatchTarget(url=url, options={"a": 1}) for url in URLS]
    assert dcache.submit("alice", targets, idem_key="k", now=1_002) == (first.job_id, False)


CONFLICTS: dict[str, dict[str, Any]] = {
    "other-urls": {"urls": [*URLS[:2], "https://example.com/z"]},
    "fewer-urls": {"urls": URLS[:2]},
    "more-urls": {"urls": [*URLS, URLS[0]]},
    "other-order": {"urls": list(reversed(URLS))},
    "other-options": {"options": {"a": 2}},
    "options-spelled-otherwise": {"options": '{"a": 1}'},  # compared as the text stored
    "one-target's-options": {"urls": [URLS[0], (URLS[1], {"a": 2}), URLS[2]]},
    "other-caller-class": {"caller_class": dcache.CallerClass.RESTRICTED},
}


@pytest.mark.parametrize("change", list(CONFLICTS))
def test_another_request_with_the_key_is_refused(store: Any, change: str) -> None:
    first = dcache.submit("alice", URLS, idem_key="k", options={"a": 1}, now=1_000)
    before = snapshot()
    request: dict[str, Any] = {"urls": URLS, "options": {"a": 1}, **CONFLICTS[change]}
    with pytest.raises(dcache.IdempotencyConflict) as raised:
        dcache.submit("alice", request.pop("urls"), idem_key="k", now=1_010, **request)
    assert raised.value.field == "idem_key" and str(raised.value).startswith("idem_key: ")
    assert raised.value.job_id == first.job_id
    assert isinstance(raised.value, dcache.BatchError)
    assert snapshot() == before


def test_another_caller_or_key_is_another_job(store: Any) -> None:
    first = dcache.submit("alice", URLS, idem_key="k", now=1_000)
    assert dcache.submit("bob", URLS[:1], idem_key="k", now=1_000).created
    assert dcache.submit("alice", URLS[:1], idem_key="k2", now=1_000).created
    assert dcache.submit("alice", URLS, idem_key="k", now=1_000) == (first.job_id, False)


@pytest.mark.parametrize("ending", ["failed", "cancelled"])
def test_after_a_failed_or_cancelled_job_the_key_starts_a_new_one(store: Any, ending: str) -> None:
    first = dcache.submit("alice", URLS, idem_key="k", now=1_000)
    dcache.set_batch_job_status(first.job_id, ending, "stopped", now=1_001)
    again = dcache.submit("alice", URLS[:1], idem_key="k", now=1_002)  # another request too: a new job
    assert again.created and again.job_id != first.job_id


def test_past_the_ttl_the_key_starts_a_new_job(store: Any) -> None:
    first = dcache.submit("alice", URLS, idem_key="k", ttl=100, now=1_000)
    assert dcache.submit("alice", URLS, idem_key="k", ttl=100, now=1_099) == (first.job_id, False)
    with pytest.raises(dcache.IdempotencyConflict):
        dcache.submit("alice", URLS[:1], idem_key="k", ttl=100, now=1_099)
    assert dcache.submit("alice", URLS[:1], idem_key="k", ttl=100, now=1_100).created


def test_a_job_submit_batch_job_stored_is_compared_by_its_targets(store: Any) -> None:
    job = make_job("hand", caller="alice", idem_key="k", targets_total=2, created_at=1_000, lease=1_000)
    targets = [BatchTarget(idx=i, url=url, options="{}") for i, url in enumerate(URLS[:2])]
    dcache.submit_batch_job(job, targets, 3600, now=1_000)
    assert dcache.submit("alice", URLS[:2], idem_key="k", now=1_001) == ("hand", False)
    with pytest.raises(dcache.IdempotencyConflict):
        dcache.submit("alice", URLS, idem_key="k", now=1_001)


def test_a_job_whose_targets_are_not_all_stored_is_another_request(store: Any) -> None:
    dcache.submit_batch_job(make_job("later", idem_key="k", targets_total=3), None, 3600, now=1_000)
    with pytest.raises(dcache.IdempotencyConflict) as raised:
        dcache.submit("alice", URLS, idem_key="k", now=1_001)
    assert raised.value.job_id == "later"


BAD: dict[str, tuple[dict[str, Any], str]] = {
    "empty": ({"urls": []}, "urls"),
    "empty-generator": ({"urls": iter(())}, "urls"),
    "a-str": ({"urls": "https://example.com/"}, "urls"),
    "not-iterable": ({"urls": 3}, "urls"),
    "a-number": ({"urls": [URLS[0], 7]}, "urls"),
    "a-triple": ({"urls": [(URLS[0], "{}", 1)]}, "urls"),
    "empty-url": ({"urls": [""]}, "url"),
    "nul-in-url": ({"urls": [URLS[0], "https://e/\x00"]}, "url"),
    "lone-surrogate": ({"urls": ["https://e/\ud800"]}, "url"),
    "bad-default-options": ({"options": "{not json"}, "options"),
    "options-a-number": ({"options": 3}, "options"),
    "bad-pair-options": ({"urls": [(URLS[0], "[")]}, "options"),
    "target-elsewhere": ({"urls": [BatchTarget(idx=5, url=URLS[0])]}, "idx"),
    "caller-class": ({"caller_class": "vip"}, "caller_class"),
    "caller": ({"caller": ""}, "caller"),
    "idem-key": ({"idem_key": 5}, "idem_key"),
    "ttl": ({"ttl": -1}, "ttl"),
    "now": ({"now": -1}, "now"),
}


def test_bad_input_names_its_field_and_writes_nothing(store: Any) -> None:
    dcache.submit("alice", URLS, idem_key="k", now=1_000)
    before = snapshot()
    for case, (change, field) in BAD.items():
        arguments: dict[str, Any] = {
            "caller": "alice",
            "urls": URLS,
            "idem_key": "k2",
            "now": 1_000,
            **change,
        }
        with pytest.raises(dcache.InvalidBatchInput) as raised:
            dcache.submit(arguments.pop("caller"), arguments.pop("urls"), **arguments)
        assert raised.value.field == field, case
        if field in ("url", "idx") or case == "bad-pair-options":  # the target is named, as the store's are
            assert str(raised.value).endswith(f"(target {1 if case == 'nul-in-url' else 0})"), case
        assert snapshot() == before, case


def test_the_conflict_pickles() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(dcache.IdempotencyConflict("job-1", "k")))
    assert (type(error), error.job_id, error.idem_key, error.field) == (
        dcache.IdempotencyConflict,
        "job-1",
        "k",
        "idem_key",
    )


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(5))
def test_a_burst_of_threads_with_one_key_makes_one_job(shared_store: str, round_: int) -> None:
    threads, answers, errors = 16, [], []
    barrier = threading.Barrier(threads)
    lock = threading.Lock()

    def submit() -> None:
        try:
            barrier.wait()
            answer = dcache.submit("alice", URLS, idem_key=f"burst-{round_}", options={"n": round_})
            with lock:
                answers.append(answer)
        except Exception as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=submit) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert len({job_id for job_id, _ in answers}) == 1
    assert sorted(created for _, created in answers) == [False] * (threads - 1) + [True]
    assert len(db.execute_sql("SELECT id FROM batch_job").fetchall()) == 1
    assert dcache.check_store().ok
