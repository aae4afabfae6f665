"""``Runner``: claims targets from the store this process opened, calls ``fetch`` for each, and writes what it
says, with retries, a keeper of its claims and a graceful stop (see docs/how-to/runners.md)."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..dcache import (
    BatchError,
    BatchTarget,
    ClaimLost,
    InvalidBatchInput,
    JobNotFound,
    TargetNotFound,
    back_off_host,
    claim_batch_targets,
    evict_batch_oldest,
    finish_complete_jobs,
    release_claims,
    renew_claims,
    requeue_stale_claims,
    retry_batch_target,
    runner_name,
    stale_claims,
    sweep_batch,
    url_host,
    validation,
)
from ..dcache.claims import _weights
from ..dcache.clock import unix_time
from .outcomes import MAX_SECONDS, Backoff, Fail, GiveBack, Retry, storable_message
from .writer import RETRY_WAIT, Outcome, Writer

__all__ = ["GROW_AFTER", "IDLE_WAIT", "LOOK_EVERY", "PREFETCH", "PREFETCH_WINDOW", "Progress", "Runner"]

log = logging.getLogger("sift.runner")

#: How long workers wait after a claim found nothing before the next claim (seconds).
IDLE_WAIT = 0.2
#: The most targets a claim takes beyond the free workers' count, by default (``Runner(prefetch=...)``).
PREFETCH = 256
#: A claim takes ahead what the workers start in about this long (seconds), at the mean time of the fetches
#: ended since the last claim: slow fetches claim little beyond the free workers, so the targets left pending
#: stay for other runners.
PREFETCH_WINDOW = 0.25
#: A fetch that returns within this long is quick (seconds): it holds the interpreter's lock for most of its
#: time, so another worker would not fetch more. Until ``concurrency`` fetches in a row were quick (one, at
#: the start), a worker stays free.
GROW_AFTER = 0.001
#: How often the run thread looks for workers stuck in their fetches, none taking a target (seconds).
LOOK_EVERY = 0.1
#: The grace a SIGTERM gives in-flight fetches unless ``run(grace=...)`` says otherwise (seconds).
DEFAULT_GRACE = 30.0


@dataclass(frozen=True)
class Progress:
    """What a runner has done since it started: targets claimed, written done, written failed, put back to be
    retried, lost (another runner held them, or another outcome of theirs was written); ``running``: fetches
    in flight now; ``given_back``: put back untried (a paced target past its ``send_by``, a ``GiveBack``);
    ``workers``: worker threads running (started as fetches need them, at most ``concurrency``)."""

    claimed: int
    done: int
    failed: int
    retried: int
    lost: int
    running: int
    given_back: int = 0
    workers: int = 0


Fetch = Callable[..., str]


class Runner:
    """Claims targets under ``name`` (default ``runner_name()``), up to ``concurrency`` fetches at once, and
    writes what ``fetch(target)`` says: its text is the result; ``Fail`` fails the target now; ``Retry`` (or
    any other exception, with its text as the error) puts it back to pending until ``after`` seconds have
    passed (None: ``backoff.delay(attempts)``), and at ``max_attempts`` fails it with that error.

    Worker threads start as fetches need them (see ``GROW_AFTER``): slow fetches run ``concurrency`` at once,
    quick ones on a few threads. A claim takes the free workers' count (``concurrency`` less the fetches in
    flight) plus what ``concurrency`` workers start in ``PREFETCH_WINDOW`` seconds at the mean time of the
    fetches ended since the last claim, at most ``prefetch`` more (0: none), and is made only when no claimed
    target waits: at most ``concurrency + prefetch`` wait at once.
    ``per_job``, ``per_host``, ``weights`` and ``fair`` are ``claim_batch_targets``'s. A keeper renews the
    claims every ``renew_every`` seconds, requeues other runners' claims stale for ``stale_after`` seconds,
    finishes the jobs whose targets are all final, and evicts down to ``budget`` bytes and sweeps jobs
    ``sweep_ttl`` old when given; claims under ``name`` at the start, a dead earlier run's, are requeued
    first. ``allow_private=True`` calls ``fetch(target, allow_private=True)``."""

    def __init__(
        self,
        fetch: Fetch,
        *,
        name: str | None = None,
        concurrency: int = 8,
        prefetch: int = PREFETCH,
        per_job: int | None = None,
        per_host: int | None = None,
        weights: Mapping[str, int] | None = None,
        fair: bool = True,
        stale_after: float = 60,
        renew_every: float = 10,
        max_attempts: int = 3,
        backoff: Backoff = Backoff(),  # noqa: B008 (frozen: one shared default is safe)
        budget: int | None = None,
        sweep_ttl: float | None = None,
        allow_private: bool = False,
    ) -> None:
        if not callable(fetch):
            raise InvalidBatchInput("fetch", f"must be callable, got {type(fetch).__name__}")
        self.fetch = fetch
        self.name = runner_name() if name is None else validation.key("name", name)
        self.concurrency = validation.positive("concurrency", concurrency)
        self.prefetch = validation.count("prefetch", prefetch)
        self.per_job = None if per_job is None else validation.positive("per_job", per_job)
        self.per_host = None if per_host is None else validation.positive("per_host", per_host)
        self.fair = validation.flag("fair", fair)
        self.weights = _weights(weights, fair)
        self.stale_after = _seconds("stale_after", stale_after)
        self.renew_every = _seconds("renew_every", renew_every)
        if not self.renew_every < self.stale_after:
            raise InvalidBatchInput(
                "renew_every", f"must be shorter than stale_after ({stale_after}), got {renew_every}"
            )
        self.max_attempts = validation.positive("max_attempts", max_attempts)
        if not isinstance(backoff, Backoff):
            raise InvalidBatchInput("backoff", f"must be a Backoff, got {type(backoff).__name__}")
        self.backoff = backoff
        self.budget = None if budget is None else validation.count("budget", budget)
        self.sweep_ttl = None if sweep_ttl is None else _seconds("sweep_ttl", sweep_ttl)
        self.allow_private = validation.flag("allow_private", allow_private)
        if self.allow_private and not _takes_allow_private(fetch):
            raise InvalidBatchInput(
                "allow_private", "fetch must take allow_private=True (as sift.runner.http.fetch does)"
            )
        self._lock = threading.Lock()
        self._held = _HeldClaims(self.name)  # what this runner claimed and its writer has not settled
        self._ready: deque[BatchTarget] = deque()
        self._wake = threading.Condition(self._lock)  # idle workers, woken when a claim left them targets
        self._counts = dict.fromkeys(("claimed", "done", "failed", "retried", "lost", "given_back"), 0)
        self._busy = 0
        self._taken = 0  # targets taken by workers so far
        self._until_quick = 1  # fetches still to end quick, in a row, before fetches count as quick
        self._paced_next = False  # whether the first target waiting is paced
        self._workers = _Workers(self.name, self.concurrency, self._work)
        self._quiet_until = 0.0
        self._fetched = 0  # fetches ended since the last claim began, and their time in all (seconds)
        self._fetch_time = 0.0
        self._ahead = False  # whether a claim may take ahead: not after one that found nothing
        self._claiming = False
        self._waiting_hosts: dict[str, tuple[float, str]] = {}  # host: until, error (a host-wide Retry)
        self._stop = threading.Event()  # stop claiming
        self._finished = threading.Event()  # the keeper's end: it renews the claims through the grace
        self._grace = DEFAULT_GRACE
        self._started = False

    # -- the public calls -----------------------------------------------------------------------------------

    def run(self, *, grace: float = DEFAULT_GRACE) -> None:
        """Run until stopped (``stop``, or SIGTERM when called on the main thread, which then gives in-flight
        fetches ``grace`` seconds); then write what they said, release the claims not done, and return."""
        self._grace = _seconds("grace", grace, allow_zero=True)
        with self._lock:
            if self._started:
                raise RuntimeError("a Runner runs once")
            self._started = True
        restore = _stop_on_sigterm(self.stop)
        held = self._held
        writer = self._writer = Writer(self.name, self._tally, held.settled, held.sending)
        keeper = threading.Thread(target=self._keep, name=f"sift-keeper {self.name}", daemon=True)
        log.info("sift runner %s: started, up to %d workers", self.name, self.concurrency)
        try:
            writer.start()
            _take_back_earlier_claims(self)
            self._workers.start_one()  # and each other as fetches need them (see _work)
            keeper.start()  # after the first worker: its first claim need not wait for its first round
            taken = 0
            while not self._stop.wait(LOOK_EVERY):  # a SIGTERM's handler runs between waits
                taken = self._unstick(taken)
            workers = self._workers.close()
            with self._wake:  # idle workers see the stop now, not at their next look
                self._wake.notify_all()
            deadline = time.monotonic() + self._grace
            for worker in workers:
                worker.join(max(0.0, deadline - time.monotonic()))
            if any(worker.is_alive() for worker in workers):
                log.warning("sift runner %s: fetches still running after the grace; released", self.name)
            writer.close(max(5.0, deadline - time.monotonic()))
        finally:
            self._stop.set()
            self._finished.set()
            if keeper.ident is not None:
                keeper.join(min(self.renew_every + 5, MAX_SECONDS))
            try:  # the store away: its error is raised, the claims left to go stale
                released = release_claims(self.name)
            finally:
                if restore is not None:
                    signal.signal(signal.SIGTERM, restore)
            log.info("sift runner %s: stopped, %d claims released; %s", self.name, released, self.progress())

    def stop(self, grace: float | None = None) -> None:
        """Stop claiming; in-flight fetches get ``grace`` seconds (default: ``run``'s) to finish and be
        written, then ``run`` releases the rest and returns. Returns at once; safe from any thread or a
        signal handler."""
        if grace is not None:
            self._grace = _seconds("grace", grace, allow_zero=True)
        self._stop.set()

    def progress(self) -> Progress:
        """The counts so far (see :class:`Progress`)."""
        with self._lock:
            return Progress(running=self._busy, workers=self._workers.alive, **self._counts)

    # -- the threads ----------------------------------------------------------------------------------------

    def _tally(self, name: str, n: int) -> None:
        with self._lock:
            self._counts[name] += n

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                target = self._take()
            except Exception:
                log.exception("sift runner %s: claiming failed", self.name)
                self._stop.wait(IDLE_WAIT)
                continue
            if target is None:
                with self._wake:
                    if not self._ready and not self._stop.is_set():
                        self._wake.wait(IDLE_WAIT / 4)
                continue
            workers = self._workers  # read without the lock: a look a moment old starts one a moment later
            quick = not self._until_quick
            if _worker_wanted(self._paced_next, quick, self._busy, workers.alive, self.concurrency):
                workers.start_one()
            started = time.monotonic()
            tried = True  # an error escaping the answer escaped a fetch
            try:
                outcome = _answer(self, target)
                tried = outcome.attempted
                self._writer.put(outcome)
                del outcome  # handed over, with its target
            finally:
                self._flush_if_idle(fetched_in=time.monotonic() - started, tried=tried)
            del target  # handed over: not kept through the next claim, which may fail and be tried for long

    def _flush_if_idle(self, *, fetched_in: float | None = None, tried: bool = True) -> None:
        """Count a worker's answer done (in ``fetched_in`` seconds; ``tried``: a fetch, not a target given
        back untried, whose time says nothing of the fetches'). With none in flight and no claim under way,
        the writer waits for no more when that answer took its wait or longer (the next would too), or when
        none waits and no claim is to come (stopping, or the last found nothing a moment ago)."""
        with self._lock:
            if fetched_in is not None:
                self._busy -= 1
                if tried:
                    self._fetched += 1
                    self._fetch_time += fetched_in
                self._until_quick = (
                    max(0, self._until_quick - 1) if fetched_in < GROW_AFTER else self.concurrency
                )
            if self._busy or self._claiming:
                return
            slow = fetched_in is not None and not self._writer.would_wait(fetched_in)
            idle = slow or (not self._ready and (self._stop.is_set() or time.monotonic() < self._quiet_until))
        if idle:
            self._writer.flush()

    def _take(self) -> BatchTarget | None:
        """The next claimed target, counted busy: from what the last claim took, or a new claim (one
        claimer at a time, see ``_claim_size``); None when nothing was claimable a moment ago."""
        with self._lock:
            if self._ready:
                return self._next_ready()
        with self._held.claim_lock:
            with self._lock:
                if self._ready:
                    return self._next_ready()
                if time.monotonic() < self._quiet_until or self._stop.is_set():
                    return None
                free = max(1, self.concurrency - self._busy)
                fetched = self._fetched if self._ahead else 0
                want = _claim_size(free, self.prefetch, self.concurrency, fetched, self._fetch_time)
                self._fetched, self._fetch_time = 0, 0.0
                self._claiming = True
            try:
                claimed = self._held.claim(
                    want,
                    per_job=self.per_job,
                    per_host=self.per_host,
                    weights=self.weights,
                    fair=self.fair,
                    runner=self.name,
                )
            finally:
                with self._lock:
                    self._claiming = False
            with self._lock:
                self._counts["claimed"] += len(claimed)
                self._ahead = bool(claimed)
                if claimed:
                    # a paced target first, to the claimer and then the first free workers: it must leave
                    # by its send_by, while the others may wait their turn
                    self._ready.extend(sorted(claimed, key=lambda target: target.send_by is None))
                    self._wake.notify(len(claimed) - 1)
                    return self._next_ready()
                self._quiet_until = time.monotonic() + IDLE_WAIT
            self._flush_if_idle()  # nothing to claim: what the workers finished need not wait for more
            return None

    def _next_ready(self) -> BatchTarget:
        """The first claimed target waiting, counted busy and taken; the lock held."""
        self._busy += 1
        self._taken += 1
        target = self._ready.popleft()
        self._paced_next = bool(self._ready) and self._ready[0].send_by is not None
        return target

    def _unstick(self, taken: int) -> int:
        """A look of the run thread, ``taken`` at the last: every worker fetching, none took a target since,
        fewer than ``concurrency`` run. Fetches are slow now, whatever the last said: a worker starts, to
        claim or take the next target, and others as in ``_work``. Returns the count taken now."""
        with self._lock:
            workers = self._workers
            stuck = self._taken == taken and self._busy >= workers.alive and workers.alive < self.concurrency
            if stuck:
                self._until_quick = self.concurrency
            taken = self._taken
        if stuck:
            workers.start_one()
        return taken

    def _retry(self, target: BatchTarget, error: str, after: float | None) -> Outcome:
        """Back to pending until ``after`` seconds from now (None: the backoff for its attempts), or failed
        with ``error`` at its last attempt."""
        job_id, idx, attempts = str(target.job_id), int(target.idx), int(target.attempts)
        error = storable_message(error)
        if attempts >= self.max_attempts:
            return Outcome(job_id, idx, "failed", error=error, claim=target)
        wait = self.backoff.delay(attempts) if after is None else after
        # rounded up: the target is claimed no earlier than ``wait`` seconds from now
        not_before = math.ceil(unix_time() + wait) if wait > 0 else None
        return Outcome(job_id, idx, "pending", error=error, not_before=not_before, claim=target)

    def _keep(self) -> None:
        """The keeper: at once, then every ``renew_every`` seconds until the runner has stopped."""
        while True:
            try:
                _keeper_round(self)
            except Exception:
                log.exception("sift runner %s: the keeper's round failed", self.name)
            if self._finished.wait(self.renew_every):
                return


def _answer(runner: Runner, target: BatchTarget) -> Outcome:
    """``_outcome(runner, target)``, or a retry with the error when reading what ``fetch`` gave raised (a
    method of a ``str`` subclass it returned or raised, a ``Retry`` made without ``Retry.__init__``): no
    answer leaves its target held. An error that is no ``Exception`` is raised again, its target's retry
    handed to the writer."""
    try:
        return _outcome(runner, target)
    except Exception as exc:
        log.exception(
            "sift runner %s: handling what fetch gave for target %d of job %s failed; retried",
            runner.name,
            int(target.idx),
            str(target.job_id),
        )
        return runner._retry(target, _text(exc), None)
    except BaseException as exc:  # not the runner's to stop: its worker ends, replaced, not its target
        runner._writer.put(runner._retry(target, _text(exc), None))
        raise


def _outcome(runner: Runner, target: BatchTarget) -> Outcome:
    """What ``runner``'s ``fetch`` says of ``target``, as the writer writes it; a target of a host that
    asked the runner to wait is not fetched, but given back untried to wait as that answer asked (see
    ``_host_asked_to_wait``); so is a paced target reached after its ``send_by``."""
    job_id, idx = str(target.job_id), int(target.idx)
    if target.send_by is not None and unix_time() > target.send_by:
        return _untried(target)  # a paced host's next request may already be on its way
    if runner._waiting_hosts:
        asked = _host_waiting(runner, target)
        if asked is not None:  # not tried: back untried, to wait as that answer asked
            return _untried(target, not_before=math.ceil(asked[0]), error=storable_message(asked[1]))
    try:
        # a fetch given allow_private must accept it; others are called as users write them
        result = runner.fetch(target, allow_private=True) if runner.allow_private else runner.fetch(target)
    except GiveBack:
        return _untried(target)
    except Fail as fail:  # its error and hint as Fail keeps them
        return Outcome(job_id, idx, "failed", error=fail.error, hint=fail.hint, claim=target)
    except Retry as retry:
        if retry.host_wide:
            return _host_asked_to_wait(runner, target, retry)
        return runner._retry(target, retry.error, retry.after)
    except Exception as exc:
        return runner._retry(target, _text(exc), None)
    if not isinstance(result, str):
        error = f"fetch returned {type(result).__name__}, not text"
        return Outcome(job_id, idx, "failed", error=error, claim=target)
    result = validation.plain(result)
    error = _unstorable(result)
    if error is not None:
        return Outcome(job_id, idx, "failed", error=error, claim=target)
    return Outcome(job_id, idx, "done", result=result, claim=target)


class _HeldClaims:
    """The targets a runner holds by its own claims, until its writer settles their outcomes; and whether a
    claim failed as the store answered (``in_doubt``), having perhaps been made all the same. Held by
    claim, oldest first: a claim requeued as stale while its fetch goes on may be made again beside it.
    ``claim_lock``: one claim at a time, and none while the held claims are checked against the store."""

    def __init__(self, runner: str) -> None:
        self.runner = runner
        self.claim_lock = threading.Lock()
        self._lock = threading.Lock()
        self._claims: dict[tuple[str, int], list[BatchTarget]] = {}  # each its claimed target, in order
        self.in_doubt = False

    def claim(self, limit: int, **request: Any) -> list[BatchTarget]:
        """``claim_batch_targets(limit, **request)``, its targets held; any error leaves the claim in doubt
        (a connection lost while the COMMIT was answered, say), to be made sure of by the keeper."""
        try:
            claimed = claim_batch_targets(limit, **request)
        except Exception:
            self.in_doubt = True
            raise
        with self._lock:
            for target in claimed:
                self._claims.setdefault((str(target.job_id), int(target.idx)), []).append(target)
        return claimed

    def settled(self, batch: list[Outcome], left: list[Outcome]) -> None:
        """Outcomes of the writer's round of ``batch``: each it did not leave to write again lets go of its
        claim, once (an outcome that names none, of its target's oldest)."""
        carried = {id(outcome) for outcome in left}
        with self._lock:
            for outcome in batch:
                key = (outcome.job_id, outcome.idx)
                held = self._claims.get(key)
                if not held or (carried and id(outcome) in carried):
                    continue
                claim = outcome.claim
                at = 0 if claim is None or held[0] is claim else _position(held, claim)
                if at is None:  # let go of already
                    continue
                del held[at]
                if not held:
                    del self._claims[key]

    @contextlib.contextmanager
    def sending(self, put_back: list[Outcome]) -> Iterator[list[Outcome]]:
        """With no claim under way, the retries and give-backs of ``put_back`` to send: not one whose target
        the runner holds by a newer claim, let go of here (an INFO line names it). That claim's fetch says
        what becomes of the target; this one would put it back from under it (its claim requeued as stale
        while its fetch went on, or its first sending taken by the store with the answer lost)."""
        with self.claim_lock:
            with self._lock:
                newer = [self._newer_claim(outcome) for outcome in put_back]
            for outcome, superseded in zip(put_back, newer, strict=True):
                if superseded:
                    log.info("sift runner %s: target %d of job %s is held by a newer claim: not put back",
                             self.runner, outcome.idx, outcome.job_id)  # fmt: skip
            yield [outcome for outcome, superseded in zip(put_back, newer, strict=True) if not superseded]

    def _newer_claim(self, outcome: Outcome) -> bool:
        """Whether a claim held of the outcome's target was made after the outcome's own (the lock held)."""
        held = self._claims.get((outcome.job_id, outcome.idx), [])
        return _position(held[:-1], outcome.claim) is not None

    def unknown(self, keys: list[tuple[str, int]]) -> list[tuple[str, int]]:
        with self._lock:
            return [key for key in keys if key not in self._claims]


class _Workers:
    """A runner's worker threads, ``work`` each, started one at a time as its fetches need them: at most
    ``most`` running at once (``alive``; one ended by an error makes room for another), none after
    ``close``."""

    def __init__(self, runner: str, most: int, work: Callable[[], None]) -> None:
        self.runner, self.most, self.work = runner, most, work
        self.alive = 0
        self.started = 0  # ever: each its number
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []  # those not known to have ended
        self._closed = False
        self._short = False  # a start failed, and was logged

    def start_one(self) -> None:
        """One more worker, unless ``most`` run or the runner is stopping. The first must start; another
        that cannot (the process out of threads) is done without, with a warning the first time."""
        with self._lock:
            if self._closed or self.alive >= self.most:
                return
            name = f"sift-worker {self.runner} {self.started}"
            thread = threading.Thread(target=self._run, name=name, daemon=True)
            self.alive += 1
            try:
                thread.start()
            except RuntimeError:
                self.alive -= 1
                if not self.started:
                    raise
                if not self._short:
                    log.warning(
                        "sift runner %s: a worker thread could not start; %d run", self.runner, self.alive
                    )
                self._short = True
                return
            self.started += 1
            self._threads = [*(t for t in self._threads if t.is_alive()), thread]

    def _run(self) -> None:
        try:
            self.work()
        finally:  # ended, by the stop or by an error that escaped: another may start in its place
            with self._lock:
                self.alive -= 1

    def close(self) -> list[threading.Thread]:
        """No more start; the threads started that had not ended, to be joined."""
        with self._lock:
            self._closed = True
            return list(self._threads)


def _position(claims: list[BatchTarget], claim: BatchTarget | None) -> int | None:
    """Where ``claim`` itself is among ``claims`` (a model's ``==`` is its key's, which claims share)."""
    return next((at for at, held in enumerate(claims) if held is claim), None)


def _host_asked_to_wait(runner: Runner, target: BatchTarget, retry: Retry) -> Outcome:
    """The site asked every request to wait (``Retry(host_wide=True)``, a 429 or 503 with
    ``Retry-After``): no runner claims its targets before then (``back_off_host``, at most
    ``MAX_BACK_OFF`` ahead), and this target is retried as any other."""
    wait = runner.backoff.delay(int(target.attempts)) if retry.after is None else retry.after
    host = url_host(str(target.url))
    if host and wait > 0:
        with runner._lock:  # the targets claimed ahead are not fetched before then either
            runner._waiting_hosts[host] = (unix_time() + wait, retry.error)
        try:
            back_off_host(host, unix_time() + wait)
        except BatchError:  # the target's own retry still waits; the other targets are only early
            log.exception("sift runner %s: could not back off %s", runner.name, host)
    return runner._retry(target, retry.error, wait)


def _host_waiting(runner: Runner, target: BatchTarget) -> tuple[float, str] | None:
    """Until when, and with what error, ``target``'s host asked ``runner`` to wait (None: no wait)."""
    host = url_host(str(target.url))
    with runner._lock:
        asked = runner._waiting_hosts.get(host)
        if asked is not None and asked[0] <= unix_time():
            del runner._waiting_hosts[host]
            asked = None
    return asked


def _keeper_round(runner: Runner) -> None:
    """One round of ``runner``'s keeper: forget the hosts' waits that have ended, give back claims it does
    not know of (after a claim in doubt), renew, requeue stale claims, finish, evict and sweep."""
    _forget_ended_waits(runner)
    if runner._held.in_doubt:
        _give_back_unknown_claims(runner)  # never raises: the renewal below must not wait for it
    renew_claims(runner.name)  # beside the writer's calls: it skips the rows they hold, waiting for none
    requeue_stale_claims(runner.stale_after, max_attempts=runner.max_attempts)
    finish_complete_jobs()
    if runner.budget is not None:
        evict_batch_oldest(runner.budget)
    if runner.sweep_ttl is not None:
        sweep_batch(runner.sweep_ttl)


def _forget_ended_waits(runner: Runner) -> None:
    """Drop each host whose wait has ended: one whose targets are all done is never looked up again, and a
    runner crawling many hosts would keep them all."""
    now = unix_time()
    with runner._lock:
        ended = [host for host, (until, _) in runner._waiting_hosts.items() if until <= now]
        for host in ended:
            del runner._waiting_hosts[host]


def _give_back_unknown_claims(runner: Runner) -> None:
    """After a claim in doubt: the targets the store says ``runner`` holds that none of its claims returned
    go back to pending untried, rather than be renewed for as long as it runs. With no claim under way, so
    that every claim made so far has returned: one that is still under way after a quarter of
    ``renew_every`` (at most a second), or a round's put-backs, puts it off to a later round, so that the
    renewal after it waits no longer (a claim or a put-back may wait on a lock the store holds for long)."""
    if not runner._held.claim_lock.acquire(timeout=min(runner.renew_every / 4, 1.0)):
        return  # in doubt still: made sure of at a later round
    try:
        runner._held.in_doubt = False  # a claim failing after this (none runs now) sets it again
        name = runner.name
        held = [(str(target.job_id), int(target.idx)) for target in stale_claims(0, runner=name)]
        for job_id, idx in runner._held.unknown(held):
            try:
                retry_batch_target(job_id, idx, runner=name, error=None, not_before=None, attempted=False)
            except (ClaimLost, JobNotFound, TargetNotFound):  # its outcome was written meanwhile
                continue
            log.warning("sift runner %s: target %d of job %s was claimed unknown to it: given back", name,
                        idx, job_id)  # fmt: skip
    except Exception:
        runner._held.in_doubt = True  # made sure of at the next round
        log.exception("sift runner %s: giving back the claims unknown to it failed", runner.name)
    finally:
        runner._held.claim_lock.release()


def _take_back_earlier_claims(runner: Runner) -> None:
    """Claims held under ``runner``'s name before it starts are an earlier runner's of the same name, which
    died (a restart): requeued as stale claims are, each attempt counted, before its keeper would renew
    them as its own. Until the store answers, or the runner is stopped."""
    while True:
        try:
            moved = requeue_stale_claims(
                0, runner=runner.name, max_attempts=runner.max_attempts, reason="its runner restarted"
            )
        except BatchError:
            log.exception("sift runner %s: requeueing an earlier run's claims failed", runner.name)
            if runner._stop.wait(RETRY_WAIT):
                return
            continue
        if moved:
            log.info("sift runner %s: %d claims of an earlier run requeued", runner.name, moved)
        return


def _claim_size(free: int, prefetch: int, workers: int, fetched: int, fetch_time: float) -> int:
    """The ``free`` workers' count, plus as many targets as ``workers`` start in ``PREFETCH_WINDOW`` seconds
    at the mean time of ``fetched`` fetches (``fetch_time`` seconds in all; none: none ahead), at most
    ``prefetch``. The time fetches take, not how soon workers came to claim: fetches that end together
    say nothing of how many more the workers would start."""
    if not fetched or not prefetch:
        return free
    if fetch_time * prefetch <= workers * PREFETCH_WINDOW * fetched:  # also fetches of no measurable time
        return free + prefetch
    return free + int(workers * PREFETCH_WINDOW * fetched / fetch_time)


def _worker_wanted(paced_next: bool, quick: bool, busy: int, alive: int, most: int) -> bool:
    """Whether a worker about to fetch should start one more first: each worker running is fetching, fewer
    than ``most`` run, and either fetches are not ``quick`` (see ``GROW_AFTER``), so that one stays free to
    claim or take the next target, or the first target waiting is paced (it must leave by its
    ``send_by``)."""
    return busy >= alive and alive < most and (not quick or paced_next)


def _takes_allow_private(fetch: Fetch) -> bool:
    """Whether ``fetch(target, allow_private=True)`` is a call its signature takes (True when it has none
    Python can read: the call then says)."""
    try:  # a wrapper's own signature, which its call binds: not the function it wraps
        signature = inspect.signature(fetch, follow_wrapped=False)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(None, allow_private=True)
    except TypeError:
        return False
    return True


def _stop_on_sigterm(stop: Callable[[], None]) -> Any:
    """On the main thread, SIGTERM calls ``stop``; returns the handler to put back (None: none set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, lambda signum, frame: stop())


def _untried(target: BatchTarget, *, not_before: int | None = None, error: str | None = None) -> Outcome:
    """Back to pending untried, its attempt given back: at once, its error as it was, or not before
    ``not_before`` with ``error``."""
    job_id, idx = str(target.job_id), int(target.idx)
    return Outcome(job_id, idx, "pending", error=error, not_before=not_before, attempted=False, claim=target)


def _seconds(field: str, value: Any, *, allow_zero: bool = False) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_SECONDS
        or (value == 0 and not allow_zero)
    ):
        least = "from 0" if allow_zero else "over 0"
        problem = f"must be a number of seconds {least} to {MAX_SECONDS:.0f}, got {value!r}"
        raise InvalidBatchInput(field, problem)
    return float(value)


def _unstorable(result: str) -> str | None:
    """Why the store cannot hold ``result`` (a NUL, a lone surrogate, over its limit of UTF-8 bytes); None
    when it can. An ASCII text, a runner's usual result, is not encoded: its length is its size."""
    if "\x00" in result:
        return "the result holds a NUL character (\\x00), which no store text may hold"
    if result.isascii():
        size = len(result)
    else:
        try:
            size = len(result.encode("utf-8"))
        except UnicodeEncodeError:
            return "the result is not valid UTF-8 text (it holds a lone surrogate)"
    if size <= validation.MAX_RESULT_BYTES:
        return None
    return f"the result is {size} bytes, over the store's {validation.MAX_RESULT_BYTES}"


def _text(exc: BaseException) -> str:
    """``Name: text`` of an exception, or its name alone when its text is empty or cannot be made; each a
    plain ``str``, so no method of a ``str`` subclass a user's exception gives runs here."""
    try:
        text = validation.plain(str(exc))
    except BaseException:  # a user's __str__ that raises, whatever: the target is retried all the same
        text = ""
    try:
        name = validation.plain(type(exc).__name__)
    except BaseException:  # a metaclass's __name__ that raises
        name = "Exception"
    return f"{name}: {text}" if text else name
