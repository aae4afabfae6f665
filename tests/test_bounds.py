"""Every text the store keeps is bounded on every path that writes it, with the same limits on both
backends: past its bound it is ``InvalidBatchInput`` naming the field, and nothing is written; at its
bound it is stored whole. The bounds are the table in docs/reference/api.md ("Bounds")."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import pytest
from helpers import make_job, make_target, make_targets, snapshot

from sift import dcache
from sift.dcache import BatchJob, BatchTarget

KEY = "k" * (dcache.MAX_KEY_BYTES + 1)
MESSAGE = "é" * (dcache.MAX_MESSAGE_BYTES // 2) + "e"  # one byte past, in two-byte characters
URL = "https://a.example/" + "a" * (dcache.MAX_URL_BYTES - len("https://a.example/") + 1)
OPTIONS = '{"a":"' + "b" * dcache.MAX_OPTIONS_BYTES + '"}'


@pytest.fixture
def held(store: dcache.StoreDatabase) -> Iterator[dcache.StoreDatabase]:
    """Job ``j``: target 0 claimed by runner ``R``, target 1 pending; job ``p`` awaits its one target."""
    dcache.create_batch_job(make_job("j", targets_total=2), make_targets(2))
    dcache.claim_batch_targets(1, runner="R", now=100)
    dcache.create_batch_job(make_job("p", targets_total=1))
    yield store


PAST: dict[str, tuple[Callable[[], object], str]] = {
    "create_batch_job(url)": (
        lambda: dcache.create_batch_job(make_job("n"), [make_target(0, url=URL)]),
        "url",
    ),
    "create_batch_job(options)": (
        lambda: dcache.create_batch_job(make_job("n"), [make_target(0, options=OPTIONS)]),
        "options",
    ),
    "create_batch_job(error)": (lambda: dcache.create_batch_job(make_job("n", error=MESSAGE)), "error"),
    "put_batch_targets(url)": (lambda: dcache.put_batch_targets("p", [make_target(0, url=URL)]), "url"),
    "put_batch_targets(options)": (
        lambda: dcache.put_batch_targets("p", [make_target(0, options=OPTIONS)]),
        "options",
    ),
    "update_batch_target(error)": (
        lambda: dcache.update_batch_target("j", 1, "failed", error=MESSAGE),
        "error",
    ),
    "update_batch_target(hint)": (lambda: dcache.update_batch_target("j", 1, "done", hint=MESSAGE), "hint"),
    "update_batch_target(result)": (
        lambda: dcache.update_batch_target("j", 1, "done", result="r" * (dcache.MAX_RESULT_BYTES + 1)),
        "result",
    ),
    "update_batch_target(runner)": (lambda: dcache.update_batch_target("j", 0, "done", runner=KEY), "runner"),
    "update_batch_targets(error)": (
        lambda: dcache.update_batch_targets("j", [{"idx": 1, "status": "failed", "error": MESSAGE}]),
        "results[0].error",
    ),
    "update_batch_targets(runner)": (
        lambda: dcache.update_batch_targets("j", [{"idx": 0, "status": "done"}], runner=KEY),
        "runner",
    ),
    "set_batch_job_status(error)": (lambda: dcache.set_batch_job_status("j", "failed", MESSAGE), "error"),
    "mark_in_flight_failed(reason)": (lambda: dcache.mark_in_flight_failed(MESSAGE), "reason"),
    "rescue_stale_jobs(reason)": (lambda: dcache.rescue_stale_jobs(0, MESSAGE), "reason"),
    "requeue_stale_claims(reason)": (lambda: dcache.requeue_stale_claims(0, reason=MESSAGE), "reason"),
    "requeue_in_flight(reason)": (lambda: dcache.requeue_in_flight(reason=MESSAGE), "reason"),
    "claim_batch_targets(runner)": (lambda: dcache.claim_batch_targets(1, runner=KEY), "runner"),
    "renew_claims(runner)": (lambda: dcache.renew_claims(KEY), "runner"),
    "release_claims(runner)": (lambda: dcache.release_claims(KEY), "runner"),
    "BatchTarget.create(url)": (
        lambda: BatchTarget.create(job="p", idx=0, url=URL, options="{}"),
        "url",
    ),
    "BatchTarget.create(options)": (
        lambda: BatchTarget.create(job="p", idx=0, url="https://a.example/", options=OPTIONS),
        "options",
    ),
    "BatchTarget.update(options)": (lambda: BatchTarget.update(options=OPTIONS).execute(), "options"),
    "BatchJob.update(error)": (lambda: BatchJob.update(error=MESSAGE).execute(), "error"),
    "BatchJob.update(caller)": (lambda: BatchJob.update(caller=KEY).execute(), "caller"),
}


def by_entry_point() -> dict[str, list[str]]:
    """The rows of PAST by the function or model write they call: each one's rows run in turn on one store,
    each leaving it as it was."""
    grouped: dict[str, list[str]] = {}
    for name in sorted(PAST):
        grouped.setdefault(name.split("(", 1)[0], []).append(name)
    return grouped


@pytest.mark.parametrize("names", list(by_entry_point().values()), ids=list(by_entry_point()))
def test_a_text_past_its_bound_is_refused_and_writes_nothing(
    held: dcache.StoreDatabase, names: list[str]
) -> None:
    for name in names:
        write, field = PAST[name]
        before = snapshot()
        with pytest.raises(dcache.InvalidBatchInput) as info:
            write()
        assert info.value.field == field, (name, info.value)
        assert snapshot() == before, name


def test_texts_at_their_bounds_are_stored_whole(store: dcache.StoreDatabase) -> None:
    url = URL[:-1]
    options = '{"a":"' + "b" * (dcache.MAX_OPTIONS_BYTES - len('{"a":""}')) + '"}'
    message = MESSAGE[:-1]
    runner = KEY[:-1]
    dcache.create_batch_job(
        make_job("j", targets_total=2), [make_target(0, url=url, options=options), make_target(1)]
    )
    dcache.claim_batch_targets(2, runner=runner, now=100)
    dcache.update_batch_target("j", 0, "failed", error=message, hint=message, runner=runner)
    dcache.set_batch_job_status("j", "failed", message)
    target = (dcache.batch_targets("j") or [])[0]
    assert (target.url, target.options, target.error, target.hint) == (url, options, message, message)
    assert dcache.batch_job("j").error == message  # type: ignore[union-attr]
    assert dcache.check_store().ok


class LyingLength(Mapping[str, int]):
    """A mapping of 1,001 caller classes whose ``__len__`` says one."""

    def __init__(self) -> None:
        self.data = {f"class-{i}": 1 for i in range(1001)}

    def __len__(self) -> int:
        return 1

    def __getitem__(self, key: str) -> int:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)


def test_weights_are_counted_as_read_not_as_their_mapping_says(held: dcache.StoreDatabase) -> None:
    before = snapshot()
    with pytest.raises(dcache.InvalidBatchInput) as info:
        dcache.claim_batch_targets(1, runner="S", weights=LyingLength())
    assert info.value.field == "weights"
    assert snapshot() == before
