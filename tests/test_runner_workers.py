"""How many worker threads a Runner runs: they start as its fetches need them, up to ``concurrency``. While
fetches are slow one worker stays free to claim or take the next target, so they run at the full
concurrency at once; quick ones (``GROW_AFTER``) run on the workers already started, as more threads would
only take turns at the interpreter's lock, except that each paced target gets a worker at once; workers
found stuck in their fetches (a look every ``LOOK_EVERY``) are joined by more, and one that an error ended
is replaced, its target retried."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import make_job, make_targets
from test_runner import WAIT, job_final, running, wait_for

from sift import dcache
from sift.dcache import claims as claims_module
from sift.runner import Backoff, Fail, Retry, Runner
from sift.runner import runner as runner_module
from sift.runner.writer import Writer

pytestmark = pytest.mark.slow  # the fast lane holds at most 4,000 cases


def submit_job(job_id: str, targets: int) -> None:
    dcache.create_batch_job(make_job(job_id, targets_total=targets), make_targets(targets))


def meeting(parties: int) -> runner_module.Fetch:
    """A fetch that returns only once ``parties`` fetches are in flight together; else it fails."""
    barrier = threading.Barrier(parties, timeout=WAIT)

    def fetch(target: dcache.BatchTarget) -> str:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            raise Fail(f"fewer than {parties} fetches ran at once") from None
        return "met"

    return fetch


def worker_threads(name: str) -> int:
    return sum(thread.name.startswith(f"sift-worker {name} ") for thread in threading.enumerate())


@pytest.mark.parametrize(
    ("paced_next", "quick", "busy", "alive", "most", "wanted"),
    [
        (False, False, 3, 3, 8, True),  # fetches are slow: one stays free for the next target
        (False, True, 3, 3, 8, False),  # fetches are quick: another thread would only take turns
        (True, True, 3, 3, 8, True),  # a paced target waits: it must leave by its send_by
        (False, False, 2, 3, 8, False),  # a worker is free
        (True, False, 8, 8, 8, False),  # all run
    ],
)
def test_a_worker_about_to_fetch_starts_another_while_fetches_are_slow_or_a_paced_target_waits(
    paced_next: bool, quick: bool, busy: int, alive: int, most: int, wanted: bool
) -> None:
    assert runner_module._worker_wanted(paced_next, quick, busy, alive, most) is wanted


def test_slow_fetches_run_at_the_full_concurrency_at_once(
    shared_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "LOOK_EVERY", 60.0)  # no look could start them: the workers did
    submit_job("slow", 6)
    runner = Runner(meeting(6), name="w", concurrency=6)
    with running(runner):
        wait_for(lambda: job_final("slow"), "the job to finish")
        assert runner.progress().workers == 6 == worker_threads("w")
    targets = dcache.batch_targets("slow") or []
    assert [(t.status, t.result, t.attempts) for t in targets] == [("done", "met", 1)] * 6


def test_workers_stuck_in_slow_fetches_after_quick_ones_are_joined_by_more(
    shared_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "LOOK_EVERY", 0.05)
    submit_job("stuck", 4)
    runner = Runner(meeting(4), name="w", concurrency=4, prefetch=0)
    runner._until_quick = 0  # as after quick fetches: no worker starts for the next fetch
    with running(runner):
        wait_for(lambda: job_final("stuck"), "the job to finish")
        assert runner.progress().workers == 4
    targets = dcache.batch_targets("stuck") or []
    assert [(t.status, t.result, t.attempts) for t in targets] == [("done", "met", 1)] * 4


def test_quick_fetches_run_on_the_workers_started(file_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every fetch quick however busy the machine, and no look that could find the workers stuck
    monkeypatch.setattr(runner_module, "GROW_AFTER", 60.0)
    monkeypatch.setattr(runner_module, "LOOK_EVERY", 60.0)
    submit_job("quick", 300)
    runner = Runner(lambda target: f"page {target.idx}", name="w", concurrency=16)
    runner._until_quick = 0  # as after quick fetches
    with running(runner):
        wait_for(lambda: job_final("quick"), "the job to finish")
        assert runner.progress().workers == 1 == worker_threads("w")
    targets = dcache.batch_targets("quick") or []
    assert [t.result for t in targets] == [f"page {i}" for i in range(300)]


@pytest.mark.parametrize(
    ("taken_since", "busy", "alive", "stuck"),
    [
        (False, 2, 2, True),  # every worker fetching, none took a target since the last look
        (True, 2, 2, False),  # a target was taken since: the workers move
        (False, 1, 2, False),  # a worker is free to claim or take the next
        (False, 8, 8, False),  # all run
    ],
)
def test_the_run_threads_look_starts_a_worker_only_when_the_workers_are_stuck(
    taken_since: bool, busy: int, alive: int, stuck: bool
) -> None:
    """The look's cases, with stand-ins for the workers' threads that wait until the test ends."""
    done = threading.Event()

    def work() -> None:
        done.wait(WAIT)

    runner = Runner(lambda target: "page", name="w", concurrency=8)
    runner._workers = runner_module._Workers("w", 8, work)
    try:
        for _ in range(alive):
            runner._workers.start_one()
        runner._busy, runner._taken, runner._until_quick = busy, 10, 0
        assert runner._unstick(10 - taken_since) == 10
        assert runner._workers.alive == alive + stuck
        assert runner._until_quick == (8 if stuck else 0)  # found stuck: fetches are slow now
    finally:
        done.set()


@pytest.mark.parametrize("quick_before", [False, True])
def test_a_fetch_that_hangs_leaves_a_worker_to_claim_the_next_job(
    shared_store: str, monkeypatch: pytest.MonkeyPatch, quick_before: bool
) -> None:
    """With no fetch ended yet, the worker in the hanging fetch started a free one first; after quick
    fetches, the run thread's look finds it stuck and starts one."""
    monkeypatch.setattr(runner_module, "LOOK_EVERY", 0.05 if quick_before else 60.0)
    release = threading.Event()

    def fetch(target: dcache.BatchTarget) -> str:
        if target.job_id == "hangs" and not release.wait(2 * WAIT):  # past the wait for the next job
            raise Fail("never released")
        return "page"

    submit_job("hangs", 1)
    runner = Runner(fetch, name="w", concurrency=4)
    runner._until_quick = 0 if quick_before else 1
    with running(runner):
        wait_for(lambda: runner.progress().running == 1, "the hanging fetch")
        submit_job("next", 5)
        wait_for(lambda: job_final("next"), "the next job to finish beside the hanging fetch")
        release.set()
        wait_for(lambda: job_final("hangs"), "the hanging job to finish")


def test_each_paced_target_gets_a_worker_at_once_after_quick_fetches(
    shared_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a send_by no busy machine misses, and no look: only the paced targets can start the workers
    monkeypatch.setattr(claims_module, "_SEND_WINDOW_MS", 600_000)
    monkeypatch.setattr(runner_module, "LOOK_EVERY", 60.0)
    dcache.set_host_policy("*", min_interval=60)
    job = make_job("paced", targets_total=6)
    dcache.create_batch_job(
        job, [dcache.BatchTarget(idx=i, url=f"https://h{i}.example/", options="{}") for i in range(6)]
    )
    runner = Runner(meeting(6), name="w", concurrency=8, prefetch=0)
    runner._until_quick = 0  # as after quick fetches
    with running(runner):
        wait_for(lambda: job_final("paced"), "the paced job to finish")
        assert runner.progress().given_back == 0
    targets = dcache.batch_targets("paced") or []
    assert [(t.status, t.result, t.attempts) for t in targets] == [("done", "met", 1)] * 6


class Escaped(BaseException):
    """What a fetch may let escape that is no Exception (as asyncio.CancelledError is)."""


class Unsayable(BaseException):
    """An escaping error whose text cannot be made: its ``__str__`` raises one that is no Exception either."""

    def __str__(self) -> str:
        raise Escaped("from __str__")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_ended_by_an_escaping_error_is_replaced(
    shared_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "LOOK_EVERY", 0.05)
    submit_job("escapes", 1)
    fetches = meeting(4)

    def fetch(target: dcache.BatchTarget) -> str:
        if target.job_id == "escapes":
            raise Escaped
        return fetches(target)

    runner = Runner(fetch, name="w", concurrency=4)
    with running(runner):
        wait_for(lambda: runner.progress().running == 0 and runner.progress().claimed == 1, "the escape")
        submit_job("meets", 4)
        wait_for(lambda: job_final("meets"), "four fetches at once after a worker ended")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize(
    ("escaping", "error"),
    [(Escaped("a worker's end"), "Escaped: a worker's end"), (Unsayable(), "Unsayable")],
)
def test_the_target_of_a_fetch_an_escaping_error_ended_is_retried_while_the_runner_runs(
    shared_store: str, escaping: BaseException, error: str
) -> None:
    """Its attempt counts, as any error's: a target that ends every worker fetching it fails at
    ``max_attempts`` with that error (its name, when its text cannot be made), and its job finishes, rather
    than stay claimed until the stop."""
    submit_job("escapes", 2)
    fetched: list[int] = []

    def fetch(target: dcache.BatchTarget) -> str:
        fetched.append(int(target.idx))
        if target.idx == 1 or fetched.count(0) == 1:
            raise escaping
        return "page"

    runner = Runner(fetch, name="w", concurrency=2, max_attempts=2, backoff=Backoff(first=0.01, jitter=0))
    with running(runner):
        wait_for(lambda: job_final("escapes"), "the job to finish while the runner runs")
        assert runner.progress().retried == 2
    targets = dcache.batch_targets("escapes") or []
    assert [(t.status, t.result, t.error, t.attempts) for t in targets] == [
        ("done", "page", None, 2),
        ("failed", None, error, 2),
    ]
    assert sorted(fetched) == [0, 0, 1, 1]


class Sly(str):
    """Text whose own methods raise: what a user's ``__str__`` or class name may be."""

    def __bool__(self) -> bool:
        raise RuntimeError("no truth value")

    def __format__(self, spec: str) -> str:
        raise RuntimeError("no format")


class SlyText(Exception):
    def __str__(self) -> str:
        return Sly("boom")


class SlyName(Exception):
    pass


SlyName.__name__ = Sly("SlyName")


class SlyEscape(BaseException):
    def __str__(self) -> str:
        return Sly("halt")


class Nameless(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise RuntimeError("no name")


class NamelessEscape(BaseException, metaclass=Nameless):
    pass


class BareRetry(Retry):
    """A Retry made without ``Retry.__init__``: none of its attributes."""

    def __init__(self) -> None:
        Exception.__init__(self)


class Liar:
    """Not text, though ``isinstance(Liar(), str)`` says it is."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return str


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_answer_whose_reading_raises_is_retried_and_leaves_no_target_held(shared_store: str) -> None:
    """What fetch raised or returned that the runner's own reading of it makes raise (a ``str`` subclass's
    method, a Retry without its attributes, a result that passes for text) is retried as any error, to its
    last attempt, and its job finishes while the runner runs, rather than leave its target held."""
    answers: list[Any] = [SlyText(), SlyName("gone"), BareRetry(), Liar(), SlyEscape(), NamelessEscape("x")]
    submit_job("odd", len(answers) + 1)

    def fetch(target: dcache.BatchTarget) -> Any:
        if target.idx == len(answers):
            return "page"
        answer = answers[int(target.idx)]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    runner = Runner(fetch, name="w", concurrency=3, max_attempts=2, backoff=Backoff(first=0.01, jitter=0))
    with running(runner):
        wait_for(lambda: job_final("odd"), "the job to finish while the runner runs")
    targets = dcache.batch_targets("odd") or []
    try:  # what reading a Liar as text raises, in this Python's words
        str.__str__(Liar())
    except TypeError as exc:
        liar = f"TypeError: {exc}"
    assert [(t.status, t.error, t.attempts) for t in targets] == [
        ("failed", "SlyText: boom", 2),
        ("failed", "SlyName: gone", 2),
        ("failed", "AttributeError: 'BareRetry' object has no attribute 'host_wide'", 2),
        ("failed", liar, 2),
        ("failed", "SlyEscape: halt", 2),
        ("failed", "Exception: x", 2),  # its class's name cannot be read
        ("done", None, 1),
    ]
    job = dcache.batch_job("odd")
    assert job is not None and (job.status, job.targets_done) == ("partial", len(answers) + 1)
    assert dcache.check_store().ok


def test_claims_ahead_count_only_the_fetches_made_not_the_targets_given_back_untried() -> None:
    """A target given back without a fetch (a host asked to wait, a paced target past its ``send_by``)
    takes no time, and says nothing of how long fetches take: the next claim's mean leaves it out."""
    runner = Runner(lambda target: "page", name="w", concurrency=4)
    runner._writer = Writer("w", lambda name, n: None)
    runner._busy = 4
    runner._flush_if_idle(fetched_in=1.0)
    for _ in range(8):
        runner._busy = 3  # other fetches in flight: nothing to flush
        runner._flush_if_idle(fetched_in=0.0, tried=False)
    assert (runner._fetched, runner._fetch_time) == (1, 1.0)
    # a second a fetch: four workers start one in PREFETCH_WINDOW (counted with the 8, nine)
    assert runner_module._claim_size(1, 256, 4, runner._fetched, runner._fetch_time) == 1 + 1


def test_fetches_count_as_quick_once_concurrency_fetches_in_a_row_were() -> None:
    """One quick fetch at the start; after a slow one, ``concurrency`` quick ones in a row: a load of mostly
    quick fetches with a slow one now and then keeps a worker free for the next target."""
    runner = Runner(lambda target: "page", name="w", concurrency=3)
    runner._writer = Writer("w", lambda name, n: None)
    quick, slow = runner_module.GROW_AFTER / 2, runner_module.GROW_AFTER
    seen = []
    for fetched_in in (quick, quick, slow, quick, quick, slow, quick, quick, quick, quick):
        runner._busy = 2  # another fetch in flight: nothing to flush
        runner._flush_if_idle(fetched_in=fetched_in)
        seen.append(runner._until_quick)
    assert seen == [0, 0, 3, 2, 1, 3, 2, 1, 0, 0]


def test_a_worker_that_cannot_start_is_done_without_unless_it_is_the_first(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    done = threading.Event()

    def work() -> None:
        done.wait(WAIT)

    def refused(thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    try:
        workers = runner_module._Workers("w", 4, work)
        workers.start_one()
        with monkeypatch.context() as patch:
            patch.setattr(threading.Thread, "start", refused)
            workers.start_one()
            workers.start_one()
            with pytest.raises(RuntimeError):  # no worker at all: run() fails as it would have
                runner_module._Workers("first", 4, work).start_one()
        assert (workers.alive, workers.started) == (1, 1)
        warnings = [r for r in caplog.records if "could not start" in r.getMessage()]
        assert len(warnings) == 1  # the first time only
        workers.start_one()  # threads again: it starts
        assert (workers.alive, workers.started) == (2, 2)
    finally:
        done.set()


def test_workers_that_ended_are_not_kept() -> None:
    workers = runner_module._Workers("w", 4, lambda: None)
    for _ in range(5):
        workers.start_one()
        wait_for(lambda: workers.alive == 0, "the worker to end")
    assert workers.started == 5
    assert len(workers.close()) == 1  # the last; those before ended by the next start
