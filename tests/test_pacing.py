"""Host policies and back-off: what ``set_host_policy``, ``host_policies``, ``back_off_host`` and
``release_host`` store, one transaction each; how claims follow them is below."""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pg_server
import pytest
from helpers import (
    SITE_SPELLINGS,
    claim_buffers,
    count_round_trips,
    count_statements,
    make_job,
    refuse_each,
    snapshot,
)

from sift import dcache
from sift.dcache import HostPolicy, clock
from sift.dcache.politeness import MAX_BACK_OFF, PACING_SLACK, SEND_WINDOW
from sift.testing import SiftClock


@pytest.fixture
def sift_clock() -> Iterator[SiftClock]:
    """The store's clock under the test's control, as sift.testing's fixture of that name gives it."""
    test_clock = SiftClock(1_700_000_000)
    previous = clock.set_test_clock(test_clock.time)
    try:
        yield test_clock
    finally:
        clock.set_test_clock(previous)


def test_a_policy_is_stored_under_the_site_name(store: Any) -> None:
    assert dcache.set_host_policy("Exämple.COM.:8443", max_running=2, min_interval=0.25) == HostPolicy(
        "xn--exmple-cua.com", 2, 0.25, None, None
    )
    assert dcache.set_host_policy("*", min_interval=datetime.timedelta(milliseconds=1500)).min_interval == 1.5
    for spelling in ("2130706433", "0x7f000001", "127.1", "[::ffff:127.0.0.1]", "::ffff:127.0.0.1"):
        assert dcache.set_host_policy(spelling, max_running=1).host == "127.0.0.1"
    assert dcache.host_policies() == [
        HostPolicy("*", None, 1.5, None, None),
        HostPolicy("127.0.0.1", 1, None, None, None),
        HostPolicy("xn--exmple-cua.com", 2, 0.25, None, None),
    ]


def test_none_clears_a_setting(store: Any) -> None:
    dcache.set_host_policy("example.com", max_running=3, min_interval=2)
    assert dcache.set_host_policy("example.com", min_interval=2) == HostPolicy(
        "example.com", None, 2.0, None, None
    )
    assert dcache.set_host_policy("example.com") == HostPolicy("example.com", None, None, None, None)


def test_a_back_off_never_shortens_and_is_capped(store: Any) -> None:
    assert dcache.back_off_host("example.com", 1_030.5, now=1_000) == 1_030.5
    assert dcache.back_off_host("EXAMPLE.com", 1_010, now=1_000) == 1_030.5  # a shorter one changes nothing
    assert dcache.back_off_host("example.com", 1e12, now=1_000) == 1_000 + MAX_BACK_OFF
    (policy,) = dcache.host_policies()
    assert policy == HostPolicy("example.com", None, None, None, 1_000 + MAX_BACK_OFF)
    dcache.set_host_policy("example.com", max_running=1)  # a policy keeps the back-off
    assert dcache.host_policies()[0].backed_off_until == 1_000 + MAX_BACK_OFF


def test_release_ends_a_back_off_in_force_and_keeps_the_policy(store: Any) -> None:
    dcache.set_host_policy("a.com", max_running=2, min_interval=1)
    dcache.back_off_host("a.com", 1_030, now=1_000)
    dcache.back_off_host("b.com", 1_010, now=1_000)
    assert dcache.backed_off_hosts(now=1_005) == ["a.com", "b.com"]
    assert dcache.release_host("A.COM.", now=1_005) is True  # the site's name, as claims count it
    assert dcache.backed_off_hosts(now=1_005) == ["b.com"]
    assert dcache.host_policies()[0] == HostPolicy("a.com", 2, 1.0, None, None)
    assert dcache.release_host("a.com", now=1_005) is False  # none in force any more
    before = snapshot()
    assert dcache.release_host("b.com", now=1_020) is False  # it had ended: nothing to release
    assert dcache.release_host("never.com", now=1_005) is False  # no row, and none made
    assert snapshot() == before
    dcache.back_off_host("a.com", 1_050, now=1_005)  # a new back-off after a release holds again
    assert dcache.backed_off_hosts(now=1_011) == ["a.com"]


#: Each politeness call with one bad argument, and the field it names, by function.
BAD_POLITENESS: dict[str, list[tuple[Callable[[], object], str]]] = {
    "set_host_policy": [
        (lambda: dcache.set_host_policy("", max_running=1), "host"),
        (lambda: dcache.set_host_policy("https://example.com/x", max_running=1), "host"),
        (lambda: dcache.set_host_policy(" example.com", max_running=1), "host"),
        (lambda: dcache.set_host_policy(7, max_running=1), "host"),  # type: ignore[arg-type]
        (lambda: dcache.set_host_policy("a.com", max_running=0), "max_running"),
        (lambda: dcache.set_host_policy("a.com", max_running=True), "max_running"),
        (lambda: dcache.set_host_policy("a.com", min_interval=-1), "min_interval"),
        (lambda: dcache.set_host_policy("a.com", min_interval=float("nan")), "min_interval"),
        (lambda: dcache.set_host_policy("a.com", min_interval=10**9), "min_interval"),
        (lambda: dcache.set_host_policy("a.com", min_interval="1"), "min_interval"),
    ],
    "back_off_host": [
        (lambda: dcache.back_off_host("*", 2_000, now=1_000), "host"),
        (lambda: dcache.back_off_host("a.com", float("inf"), now=1_000), "until"),
        (lambda: dcache.back_off_host("a.com", "2000", now=1_000), "until"),  # type: ignore[arg-type]
        (lambda: dcache.back_off_host("a.com", 2_000, now=-1), "now"),
    ],
    "release_host": [
        (lambda: dcache.release_host("*"), "host"),
        (lambda: dcache.release_host("https://a.com/x"), "host"),
        (lambda: dcache.release_host(""), "host"),
        (lambda: dcache.release_host(None), "host"),  # type: ignore[arg-type]
        (lambda: dcache.release_host("a.com", now=float("nan")), "now"),
    ],
}


@pytest.mark.parametrize("function", list(BAD_POLITENESS))
def test_bad_input_names_its_field_and_changes_nothing(store: Any, function: str) -> None:
    dcache.set_host_policy("a.com", max_running=2, min_interval=1)
    refuse_each((f"{function} #{i}", call, field) for i, (call, field) in enumerate(BAD_POLITENESS[function]))


# -- Claims follow the host rules ---------------------------------------------------------------------------


def add_hosted_job(caller: str, name: str, urls: list[str], *, created_at: int = 1) -> str:
    """A job ``caller/name`` whose target ``i`` is ``urls[i]``."""
    job_id = f"{caller}/{name}"
    targets = [dcache.BatchTarget(idx=i, url=url, options="{}") for i, url in enumerate(urls)]
    dcache.create_batch_job(
        make_job(job_id, caller=caller, targets_total=len(urls), created_at=created_at), targets
    )
    return job_id


def hosts_of(targets: list[dcache.BatchTarget]) -> list[str]:
    return [dcache.url_host(t.url) for t in targets]


def test_max_running_caps_a_host_as_per_host_does_the_stricter_wins(store: Any) -> None:
    add_hosted_job("alice", "j", [f"https://{h}.com/{i}" for h in "abc" for i in range(5)])
    dcache.set_host_policy("a.com", max_running=2)
    dcache.set_host_policy("*", max_running=4)  # b.com and c.com: the default's
    got = dcache.claim_batch_targets(100, runner="r", now=5)
    assert Counter(hosts_of(got)) == {"a.com": 2, "b.com": 4, "c.com": 4}
    assert dcache.claim_batch_targets(100, runner="r", now=6) == []  # every host at its cap
    dcache.update_batch_target("alice/j", got[0].idx, "done", result="x", runner="r", now=7)
    again = dcache.claim_batch_targets(100, per_host=1, runner="r", now=8)  # per_host is stricter here: 1
    assert again == []
    dcache.set_host_policy("*")  # no default: b.com and c.com run as many as per_host allows
    assert Counter(hosts_of(dcache.claim_batch_targets(100, per_host=5, runner="r", now=9))) == {
        "a.com": 1,
        "b.com": 1,
        "c.com": 1,
    }


SPELLINGS = [
    *SITE_SPELLINGS,
    "https://\uff45\uff58\u00e4\uff4d\uff50\uff4c\uff45.com/",  # exämple.com in full-width letters
]


@pytest.mark.parametrize("policy_host", ["*", "spelled"])
def test_max_running_1_over_the_spellings_of_a_site_claims_one_at_a_time(
    store: Any, policy_host: str
) -> None:
    add_hosted_job("alice", "j", [f"{url}{i}" for i, url in enumerate(SPELLINGS * 2)])
    if policy_host == "*":
        dcache.set_host_policy("*", max_running=1)
    else:
        dcache.set_host_policy("0x7f000001", max_running=1)
        dcache.set_host_policy("\uff45\uff58\u00e4\uff4d\uff50\uff4c\uff45.com", max_running=1)
    running: list[dcache.BatchTarget] = []
    seen = []
    for step in range(len(SPELLINGS) * 2):
        got = dcache.claim_batch_targets(100, runner="r", now=10 + step)
        assert sorted(Counter(hosts_of(running + got)).values()) == [1] * len(set(hosts_of(running + got)))
        running += got
        if not running:
            break
        done = running.pop(0)  # the oldest running target finishes: its site may take the next one
        seen.append(dcache.url_host(done.url))
        dcache.update_batch_target(done.job_id, done.idx, "done", result="x", runner="r", now=10 + step)
    assert sorted(set(seen)) == ["127.0.0.1", "xn--exmple-cua.com"]
    assert len(seen) == len(SPELLINGS) * 2  # all done, one at a time per site


def test_min_interval_gives_a_host_one_target_a_claim_until_it_is_due(
    store: Any, sift_clock: SiftClock
) -> None:
    add_hosted_job("alice", "j", [f"https://{h}.com/{i}" for h in "ab" for i in range(4)])
    dcache.set_host_policy("a.com", min_interval=1.0)
    start = sift_clock.time()
    got = dcache.claim_batch_targets(100, runner="r")
    assert Counter(hosts_of(got)) == {"a.com": 1, "b.com": 4}
    # the paced target's request must leave within the send window; the others have no such time
    assert {dcache.url_host(t.url): t.send_by for t in got} == {
        "a.com": pytest.approx(start + SEND_WINDOW, abs=0.001),
        "b.com": None,
    }
    (paced,) = [p for p in dcache.host_policies() if p.host == "a.com"]
    assert paced.next_due == pytest.approx(start + 1.0 + PACING_SLACK, abs=0.001)
    sift_clock.advance(0.999 + PACING_SLACK)
    assert dcache.claim_batch_targets(100, runner="r") == []  # not due: skipped, nothing else to take
    sift_clock.advance(0.001)
    assert hosts_of(dcache.claim_batch_targets(100, runner="r")) == ["a.com"]
    sift_clock.advance(0.5)
    assert dcache.claim_batch_targets(100, runner="r") == []
    dcache.set_host_policy("a.com", min_interval=0)  # paced no more, though its due time is still ahead
    dcache.set_host_policy("*", min_interval=60)
    assert dcache.claim_batch_targets(100, runner="r") == []  # the due time a claim wrote still holds
    sift_clock.advance(0.5 + PACING_SLACK)
    assert hosts_of(dcache.claim_batch_targets(100, runner="r")) == ["a.com", "a.com"]


def test_a_default_interval_paces_each_host_on_its_own(store: Any, sift_clock: SiftClock) -> None:
    add_hosted_job("alice", "j", [f"https://{h}.com/{i}" for h in "abc" for i in range(3)])
    dcache.set_host_policy("*", min_interval=0.25)
    dcache.set_host_policy("c.com", min_interval=0)  # c.com is not paced
    assert hosts_of(dcache.claim_batch_targets(100, runner="r")) == [
        "a.com",
        "b.com",
        "c.com",
        "c.com",
        "c.com",
    ]
    assert [p.host for p in dcache.host_policies()] == ["*", "a.com", "b.com", "c.com"]
    sift_clock.advance(0.25 + PACING_SLACK)
    assert hosts_of(dcache.claim_batch_targets(100, runner="r")) == ["a.com", "b.com"]


def test_a_backed_off_host_waits_while_the_others_keep_their_fair_order(
    store: Any, sift_clock: SiftClock
) -> None:
    add_hosted_job("alice", "j", [f"https://{h}.com/{i}" for h in "ab" for i in range(3)])
    add_hosted_job("bob", "j", [f"https://{h}.com/{i}" for h in "ac" for i in range(3)])
    add_hosted_job("carol", "j", [f"https://d.com/{i}" for i in range(3)])
    until = dcache.back_off_host("a.com", sift_clock.time() + 30)
    order = []
    while sift_clock.time() < until:
        got = dcache.claim_batch_targets(1, runner="r")
        order += [(t.job_id, dcache.url_host(t.url)) for t in got]
        sift_clock.advance(1)
    assert (
        order
        == [  # one a turn, alice, bob, carol, round and round, a.com never
            ("alice/j", "b.com"),
            ("bob/j", "c.com"),
            ("carol/j", "d.com"),
        ]
        * 3
    )
    assert sift_clock.time() == until  # held back for its whole period
    got = dcache.claim_batch_targets(100, runner="r")
    assert [(t.job_id, dcache.url_host(t.url)) for t in got] == [
        ("alice/j", "a.com"),
        ("bob/j", "a.com"),
    ] * 3


def test_a_released_host_is_claimed_at_once(store: Any, sift_clock: SiftClock) -> None:
    add_hosted_job("alice", "j", ["https://a.com/0", "https://b.com/0"])
    dcache.back_off_host("a.com", sift_clock.time() + 600)
    assert hosts_of(dcache.claim_batch_targets(10, runner="r")) == ["b.com"]
    assert dcache.release_host("a.com") is True
    assert hosts_of(dcache.claim_batch_targets(10, runner="r")) == ["a.com"]


def test_a_back_off_holds_a_host_in_every_job_and_for_every_runner(store: Any, sift_clock: SiftClock) -> None:
    for caller in ("alice", "bob"):
        add_hosted_job(caller, "j", [f"https://a.com/{i}" for i in range(2)])
    dcache.back_off_host("a.com", sift_clock.time() + 0.5)
    for runner in ("r1", "r2"):
        assert dcache.claim_batch_targets(10, runner=runner, fair=False) == []
    sift_clock.advance(0.5)
    assert len(dcache.claim_batch_targets(10, runner="r1", fair=False)) == 4


def waiting_until(job_id: str) -> dict[int, int | None]:
    """Each target's stored ``not_before`` (None: claimable now, or not pending), by idx."""
    sql = f"SELECT idx, not_before FROM batch_target WHERE job_id = {dcache.db.param} ORDER BY idx"
    rows = dcache.db.execute_sql(sql, (job_id,)).fetchall()
    return {int(idx): None if until is None else int(until) for idx, until in rows}


def test_a_back_off_moves_its_hosts_targets_out_of_the_claims_way_and_a_release_back(
    store: Any, sift_clock: SiftClock
) -> None:
    """The held targets wait to the back-off's last second (a claim never reads them); a longer back-off
    moves them on; a release brings back those that waited for it, and a retry keeps its own time."""
    t = int(sift_clock.time())
    job = add_hosted_job("alice", "j", [*[f"https://a.com/{i}" for i in range(4)], "https://b.com/0"])
    assert [c.idx for c in dcache.claim_batch_targets(2, runner="r", fair=False)] == [0, 1]
    dcache.retry_batch_target(job, 1, runner="r", error="503", not_before=t + 100)
    dcache.back_off_host("a.com", t + 30.5)
    assert waiting_until(job) == {0: None, 1: t + 100, 2: t + 30, 3: t + 30, 4: None}
    dcache.back_off_host("a.com", t + 60.5)  # longer: the waiting ones wait on
    assert waiting_until(job) == {0: None, 1: t + 100, 2: t + 60, 3: t + 60, 4: None}
    dcache.back_off_host("a.com", t + 10)  # shorter: nothing changes
    assert waiting_until(job) == {0: None, 1: t + 100, 2: t + 60, 3: t + 60, 4: None}
    sift_clock.advance(10)
    assert hosts_of(dcache.claim_batch_targets(10, runner="r")) == ["b.com"]
    assert dcache.release_host("a.com") is True
    assert waiting_until(job) == {0: None, 1: t + 100, 2: None, 3: None, 4: None}
    assert [c.idx for c in dcache.claim_batch_targets(10, runner="r")] == [2, 3]


def test_a_due_retry_and_a_new_target_wait_out_their_hosts_back_off_to_the_millisecond(
    store: Any, sift_clock: SiftClock
) -> None:
    t = int(sift_clock.time())
    job = add_hosted_job("alice", "j", ["https://a.com/0"])
    dcache.claim_batch_targets(1, runner="r")
    dcache.retry_batch_target(job, 0, runner="r", error="503", not_before=t + 5)
    dcache.back_off_host("a.com", t + 30.5)
    later = add_hosted_job("bob", "j", ["https://a.com/1"])  # sent while the host is backed off
    sift_clock.advance(6)
    assert dcache.claim_batch_targets(10, runner="r") == []  # the retry came due: it waits on
    assert waiting_until(job) == {0: t + 30}
    sift_clock.advance(24.4)
    assert dcache.claim_batch_targets(10, runner="r") == []  # 0.1 s to go
    sift_clock.advance(0.1)
    got = dcache.claim_batch_targets(10, runner="r")
    assert sorted((c.job_id, c.idx) for c in got) == [(job, 0), (later, 0)]


def vm_steps(call: Any) -> tuple[Any, int]:
    """``call()``'s value and the SQLite virtual-machine instructions it ran on the store's connection."""
    count = [0]

    def step() -> int:
        count[0] += 1
        return 0  # go on

    connection = dcache.db.connection()
    connection.set_progress_handler(step, 1)
    try:
        return call(), count[0]
    finally:
        connection.set_progress_handler(None, 1)


@pytest.mark.sqlite_only
def test_a_claims_work_in_sqlite_does_not_grow_with_the_backed_off_hosts_it_passes(store: Any) -> None:
    """SQLite's virtual-machine steps for one claim (a count, not a time): a job with 20 backed-off hosts
    and one with 2,000 cost the same to claim its one free target from, as the held targets wait out of the
    claims' index."""
    steps = []
    for held in (20, 2_000):
        for table in ("batch_target", "batch_job", "batch_host_policy"):
            dcache.db.execute_sql(f"DELETE FROM {table}")
        dcache.db.execute_sql("UPDATE batch_claim_ring SET caller = NULL, turns = 0")
        hosts = [f"h{n:05d}.com" for n in range(held)]
        add_hosted_job("alice", "j", [*[f"https://{h}/" for h in hosts], "https://z.com/"])
        for host in hosts:
            dcache.back_off_host(host, 10_000, now=5)
        got, count = vm_steps(lambda: dcache.claim_batch_targets(10, runner="r", now=6))
        assert hosts_of(got) == ["z.com"]
        steps.append(count)
    assert steps[1] == steps[0], steps


# -- The claim's cost: by what it hands out and what it skips, not by the targets waiting behind them -------


def held_back_store(waiting: int) -> None:
    """``waiting`` targets behind each of: a paused caller, a paused job, a backed-off host, a host not due;
    and 20 targets that may go."""
    db = dcache.db
    for table in (
        "batch_target",
        "batch_job",
        "batch_host_policy",
        "batch_paused_job",
        "batch_paused_caller",
    ):
        db.execute_sql(f"DELETE FROM {table}")
    db.execute_sql("UPDATE batch_claim_ring SET caller = NULL, turns = 0")
    with db.atomic():
        add_hosted_job("bob", "j", [f"https://b.com/{i}" for i in range(waiting)] or ["https://z.com/b"])
        add_hosted_job("alice", "paused", [f"https://p.com/{i}" for i in range(waiting)], created_at=1)
        urls = [f"https://{h}.com/{i}" for h in ("held", "paced") for i in range(waiting)]
        add_hosted_job("alice", "mixed", [*urls, *[f"https://z.com/{i}" for i in range(20)]], created_at=2)
    dcache.pause_caller("bob")
    dcache.pause_batch_job("alice/paused")
    dcache.back_off_host("held.com", 10_000, now=5)
    dcache.set_host_policy("paced.com", min_interval=1)
    assert len(dcache.claim_batch_targets(1, per_job=1, runner="r", now=5)) == 1  # paced.com: next due at 6.1


def claim_costs(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """A claim of 10 with 0, 100 and 5,000 targets waiting behind each paused caller, paused job, backed-off
    host and host not due: its statements (on PostgreSQL its round trips), and on PostgreSQL the buffers
    of its server function, its nested statements' included."""
    on_postgres = dcache.db.backend.statement_key == "postgres"
    counts, buffers = [], []
    for waiting in (0, 100, 5_000):
        held_back_store(waiting)
        if on_postgres:
            # The back-off's move left its old index entries to VACUUM, as autovacuum would take them: the
            # claim's own reads are measured, not the setup's dead rows.
            dcache.db.execute_sql("VACUUM ANALYZE batch_target")
            buffers.append(claim_buffers())
        seen = count_round_trips(monkeypatch) if on_postgres else count_statements(monkeypatch)
        got = dcache.claim_batch_targets(10, runner="r", now=5)
        monkeypatch.undo()
        assert hosts_of(got) == ["z.com"] * 10
        counts.append(len(seen))
    return counts, buffers


@pytest.mark.slow
def test_a_claims_statements_do_not_grow_with_targets_behind_paused_work_or_held_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same statements with 100 or 5,000 targets waiting behind each held-back kind; at most twice
    those of the same claim with none waiting."""
    dcache.open_db(":memory:")
    try:
        counts, _ = claim_costs(monkeypatch)
    finally:
        dcache.close_db()
    assert counts[1] == counts[2] <= 2 * counts[0], counts


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[pg_server.PrivateServer]:
    """A PostgreSQL server of this module's own: VACUUM clears dead rows only older than every transaction
    of the server's clients, and another client of the shared test server (a second test run) may hold one."""
    server = pg_server.started("the claim's buffers")
    try:
        yield server
    finally:
        server.destroy()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_claims_work_on_postgres_does_not_grow_with_targets_behind_paused_work_or_held_hosts(
    private_postgres: pg_server.PrivateServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's server function: three round trips each, and its buffers nearly the same with 100 or
    5,000 targets waiting behind each held-back kind."""
    dcache.open_db(f"{private_postgres.url()}?schema=pacing")
    try:
        counts, buffers = claim_costs(monkeypatch)
    finally:
        dcache.close_db()
    assert counts == [3, 3, 3], counts
    assert buffers[2] <= 1.5 * buffers[1], buffers


# -- Pacing from 4 runner processes at once -----------------------------------------------------------------

PACED = "slow.example"
PACED_TARGETS = 4
UNFINISHED = "SELECT COUNT(*) FROM batch_target WHERE status IN ('pending', 'running')"


def _pacing_runner(target: str, name: str, barrier: Any) -> dict[str, Any]:
    """Claim in a loop, recording the wall-clock window (before, after) of each claim that got a target of
    the paced host; write every result; until nothing is left."""
    import time

    dcache.open_db(target)
    windows: list[tuple[float, float, int]] = []
    barrier.wait()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        before = time.time()
        claimed = dcache.claim_batch_targets(3, runner=name)
        after = time.time()
        paced = [t for t in claimed if dcache.url_host(t.url) == PACED]
        windows += [(before, after, len(paced))] if paced else []
        for t in claimed:
            dcache.update_batch_target(t.job_id, t.idx, "done", result=name, runner=name)
        if not claimed:
            if dcache.db.execute_sql(UNFINISHED).fetchone()[0] == 0:
                break
            time.sleep(0.05)  # the paced host is not due yet: the others are done
    dcache.close_db()
    return {"windows": windows}


@pytest.mark.slow
def test_min_interval_holds_across_4_processes_claiming_at_once(shared_store: str) -> None:
    import math
    from itertools import combinations

    from helpers import run_processes

    dcache.set_host_policy(PACED, min_interval=1.0)
    for c in range(2):
        urls = [f"https://{PACED}/{c}-{i}" for i in range(PACED_TARGETS // 2)]
        urls += [f"https://fast{n}.example/{i}" for n in range(3) for i in range(8)]
        add_hosted_job(f"caller-{c}", "j", urls)
    reports = run_processes(_pacing_runner, [(shared_store, f"runner-{r}") for r in range(4)])
    assert not [r for r in reports if "errors" in r], reports
    windows = [tuple(w) for r in reports for w in r["windows"]]
    assert sorted(w[2] for w in windows) == [1] * PACED_TARGETS  # one target of the host a claim
    for x, y in combinations(windows, 2):
        # each claim read the store's clock inside its window: whichever came second read it a second later
        first_to_second = [math.ceil(b[1] * 1000) - math.floor(a[0] * 1000) for a, b in ((x, y), (y, x))]
        assert max(first_to_second) >= 1000, (x, y)
    # read back from the store: each of the host's targets was claimed (heartbeat) in a second of its own
    dcache.open_db(shared_store)
    paced = [t.heartbeat for t in dcache.BatchTarget.select() if dcache.url_host(t.url) == PACED]
    heartbeats = sorted(beat for beat in paced if beat is not None)
    assert len(heartbeats) == PACED_TARGETS and len(set(heartbeats)) == PACED_TARGETS, heartbeats
    (policy,) = [p for p in dcache.host_policies() if p.host == PACED]
    assert policy.next_due is not None
    assert (round(policy.next_due * 1000) - round(PACING_SLACK * 1000)) // 1000 == heartbeats[-1] + 1
    assert dcache.check_store().ok


# -- The upgrade: the politeness tables ---------------------------------------------------


def test_an_older_store_reads_read_only_and_gains_the_tables_when_opened(shared_store: str) -> None:
    import sqlite3
    from contextlib import closing

    from sift.dcache.tables import POLITENESS_VERSION, SCHEMA_VERSION

    older = POLITENESS_VERSION - 1

    add_hosted_job("alice", "j", ["https://a.example/1"])
    for table in ("batch_host_policy", "batch_paused_job", "batch_paused_caller"):
        dcache.db.execute_sql(f"DROP TABLE {table}")
    if shared_store.endswith(".db"):
        dcache.db.execute_sql(f"PRAGMA user_version = {older}")
    else:
        dcache.db.execute_sql(f"UPDATE sift_schema SET version = {older}")
    dcache.close_db()
    dcache.open_db(shared_store, readonly=True)
    assert (dcache.host_policies(), dcache.paused_jobs(), dcache.paused_callers()) == ([], [], [])
    assert dcache.backed_off_hosts() == []
    dcache.open_db(shared_store)  # the upgrade
    assert dcache.pause_caller("alice") and dcache.paused_callers() == ["alice"]
    assert dcache.claim_batch_targets(5, runner="r") == []
    if shared_store.endswith(".db"):
        with closing(sqlite3.connect(shared_store)) as conn:
            assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    else:
        assert dcache.db.execute_sql("SELECT version FROM sift_schema").fetchone()[0] == SCHEMA_VERSION
