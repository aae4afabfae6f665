"""What keeps the hot paths flat in history, pinned without any timing.

Two causes are pinned on a populated WAL file, at two sizes of retained history:

- the query plan of every statement the manager runs (``EXPLAIN QUERY PLAN`` on the compiled SQL with
  its parameters bound): each reaches its rows through an index or the integer primary key, and none
  scans ``batch_job`` or ``batch_target`` without one;
- the statements each hot call issues on the shared connection (``set_trace_callback``): the exact
  sequence, the same at both sizes.

A scan of the partial indexes ``batch_job_live`` and ``batch_job_evictable`` is allowed: those indexes
hold only live jobs (queued or running), or only finished jobs that still hold bytes, so the scan is
bounded by the live or evictable jobs, not by the retained history. Eviction stops at the first rows of
that scan (LIMIT), and a no-op eviction never runs it (see the statement counts).
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import create_partial, make_job, make_targets, rule_statements

from sift import dcache
from sift.dcache.backends.sqlite import writes as sqlite_writes
from sift.dcache.backends.sqlite.schema import OWN_INDEXES, TOTAL_NBYTES_SQL
from sift.dcache.statements import Statement
from sift.dcache.tables import SCHEMA_VERSION

FINISHED = ("done", "partial", "failed", "cancelled")
RESULT = "r" * 32
JOB_PK = "sqlite_autoindex_batch_job_1"  # batch_job(id)
TARGET_PK = "sqlite_autoindex_batch_target_1"  # batch_target(job_id, idx)

#: Two sizes of retained history; everything pinned here must be the same at both.
HISTORY = (20, 2_000)

pytestmark = pytest.mark.sqlite_only


def populate(jobs: int) -> None:
    """``jobs`` retained finished jobs with 10 finished targets each, all holding results, written with
    plain SQL as another program would; then a few live jobs and the runner's job with pending targets."""
    with dcache.db.atomic():
        dcache.db.executemany(
            "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, error, targets_total, "
            "targets_done, created_at, lease, nbytes) VALUES (?, ?, 'fleet', ?, ?, '', 10, 10, ?, ?, ?)",
            [
                (f"old-{i:05d}", f"caller-{i % 7}", f"key-{i}", FINISHED[i % 4], 1_000 + i, 1_000 + i, 320)
                for i in range(jobs)
            ],
        )
        dcache.db.executemany(
            "INSERT INTO batch_target (job_id, idx, url, options, status, result) "
            "VALUES (?, ?, ?, '{}', 'done', ?)",
            [
                (f"old-{i:05d}", j, f"https://example.com/{i}/{j}", RESULT)
                for i in range(jobs)
                for j in range(10)
            ],
        )
    for k in range(5):
        dcache.create_batch_job(make_job(f"live-{k}", caller=f"caller-{k}", targets_total=0, lease=9_000))
    runner = make_job("runner", status="running", targets_total=30, created_at=9_000, lease=9_000)
    create_partial(runner, make_targets(20))


@pytest.fixture(scope="module", params=HISTORY, ids=[f"history{n}" for n in HISTORY])
def populated_file(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, Path]:
    """A closed store file holding ``request.param`` retained jobs, built once per module."""
    path = tmp_path_factory.mktemp(f"history{request.param}") / "store.db"
    dcache.open_db(path)
    try:
        populate(request.param)
    finally:
        dcache.close_db()
    assert not Path(f"{path}-wal").exists()  # closing checkpointed everything into the file
    return int(request.param), path


@pytest.fixture
def history(populated_file: tuple[int, Path], tmp_path: Path) -> Iterator[int]:
    """A copy of the populated file, opened as the store (a real WAL file); yields its retained jobs."""
    jobs, template = populated_file
    path = tmp_path / "store.db"
    shutil.copyfile(template, path)
    dcache.open_db(path)
    yield jobs
    dcache.close_db()


# -- Query plans ----------------------------------------------------------------------------------------

#: A value for every slot any statement has. The row they name exists in the populated store.
SLOT_VALUES: dict[str, Any] = {
    "job_id": "old-00001",
    "idx": 3,
    "caller": "caller-1",
    "idem_key": "key-1",
    "cutoff": 1_500,
    "final": 1,
    "size": 1024,
    "now": 10_000,
    "status": "done",
    "result": "x" * 1024,
    "error": None,
    "hint": None,
    "reason": "restart",
    "id": "new-job",
    "caller_class": "fleet",
    "targets_total": 3,
    "targets_done": 0,
    "created_at": 10_000,
    "lease": 10_000,
    "nbytes": 0,
    "url": "https://example.com/",
    "options": "{}",
    "after_created": -1,
    "after_order": -1,
    "take": 10,
    "runner": "runner-1",
    "max_attempts": 3,
    "failed": 1,
    "host": "example.com",
    "now_ms": 10_000_000,
    "after": "caller-1",
    "not_before": 12_000,
    "given_back": 0,
    "count": 1,
    "job_ids": '["old-00001", "runner"]',  # SQLite's list: a JSON array (backend.listed)
    "turns": 1,
    "after_idx": 2,
    "limit": 5,
    "due": 10_000_000,
}

#: Every statement of the manager, and how its plan must reach rows: exactly this set of index accesses,
#: each an index with the columns it is searched on, or a partial index it scans. Pinning the columns
#: matters: an index searched on a prefix only (say batch_job_idem on caller alone) grows with history.
#: An INSERT … VALUES has no plan to show. A new statement in manager.py fails
#: test_every_statement_is_pinned until it is added here.
JOB_BY_ID = f"{JOB_PK} (id=?)"
TARGET_BY_KEY = f"{TARGET_PK} (job_id=? AND idx=?)"
TARGETS_OF_JOB = f"{TARGET_PK} (job_id=?)"
#: The pause tables, each probed by its key for every live job a claim considers.
UNPAUSED = {
    "sqlite_autoindex_batch_paused_job_1 (job_id=?)",
    "sqlite_autoindex_batch_paused_caller_1 (caller=?)",
}
POLICY_BY_HOST = "sqlite_autoindex_batch_host_policy_1 (host=?)"
#: Two partial indexes hold exactly the live jobs (batch_job_live by caller, batch_job_claim in claim
#: order): a statement over every live job may scan either.
LIVE_SCAN = ({"batch_job_live"}, {"batch_job_claim"})
#: Each statement's index accesses, or a tuple of the sets SQLite may choose between.
EXPECTED_ACCESS: dict[str, set[str] | tuple[set[str], ...]] = {
    # API reads
    "_SELECT_JOB": {JOB_BY_ID},
    "_IDEM": {"batch_job_idem (caller=? AND idem_key=?)"},
    # either partial index of the live jobs keyed by caller
    "_LIVE": ({"batch_job_live (caller=?)"}, {"batch_job_ring (caller=?)"}),
    "_LIVE_TOTAL": LIVE_SCAN,  # a SCAN of a partial index: bounded by the live jobs
    "_SELECT_TARGETS": {JOB_BY_ID, TARGETS_OF_JOB},
    # a page of a job's targets: one range of the target's primary key, in its order
    "_PAGE": {f"{TARGET_PK} (job_id=? AND idx>?)"},
    # sweep and eviction (their no-op forms run only _ANY_EXPIRED, or only the byte total)
    "_ANY_EXPIRED": {"batch_job_lease (lease<?)"},
    "_EXPIRED": {"batch_job_lease (lease<?)"},
    "_EVICTABLE": {"batch_job_evictable"},  # a SCAN of the partial index, in order, stopped by LIMIT
    "_DELETE_TARGETS": {TARGETS_OF_JOB},
    "_DELETE_JOB": {JOB_BY_ID},
    # the other writes
    "_TARGETS_TOTAL": {JOB_BY_ID},
    "_TARGET_STATUS": {TARGET_BY_KEY},
    "_SET_JOB_STATUS": {JOB_BY_ID},
    "_TOUCH": {JOB_BY_ID},
    "_MARK_FAILED": LIVE_SCAN,  # a SCAN of a partial index: bounded by the live jobs
    # many runners: the claim locks the ring's one row, walks the callers with a live job in byte order
    # (each step one search of batch_job_ring), each caller's live jobs in claim order, probing each for
    # a pending target, and takes the first pending targets of one job (of one host, with a host limit,
    # found by a skip scan of batch_target_host); fair=False walks every live job in claim order
    "LOCK_RING": {"INTEGER PRIMARY KEY (rowid=?)"},
    "_SAVE_RING": {"INTEGER PRIMARY KEY (rowid=?)"},
    # the next caller and its oldest job at once: batch_job_ring in its order (caller, then claim order; from
    # its first entry, for the first caller), each live job probed for a pending target
    # (and each such job, and its caller, probed in the pause tables by key)
    "_NEXT_CALLER_JOB": {"batch_job_ring (caller>?)", "batch_target_host (job_id=? AND host>?)", *UNPAUSED},
    "_FIRST_CALLER_JOB": {"batch_job_ring", "batch_target_host (job_id=? AND host>?)", *UNPAUSED},
    "_CALLER_JOB": {
        "batch_job_ring (caller=? AND created_at>?)",
        "batch_target_host (job_id=? AND host>?)",
        *UNPAUSED,
    },
    "_NEXT_JOB": {"batch_job_claim (created_at>?)", "batch_target_host (job_id=? AND host>?)", *UNPAUSED},
    # the host rules: whether any host has a row (the first entry of the table's key, LIMIT 1), then each
    # host the walk reaches by its key, and a paced host's next due time written by its key
    "_ANY_POLICY": {"sqlite_autoindex_batch_host_policy_1"},
    "_HOST_POLICY": {POLICY_BY_HOST},
    "_ADD_HOST": set(),
    "_SET_NEXT_DUE": {POLICY_BY_HOST},
    # the walk to a job's next host not held back: each host by one search of batch_target_host, each
    # checked by the policy's key, and the one it stops at read with its policy by the same key
    "_HOST_FROM": {"batch_target_host (job_id=? AND host>?)", POLICY_BY_HOST},
    "_HOST_AFTER": {"batch_target_host (job_id=? AND host>?)", POLICY_BY_HOST},
    # the running targets' hosts: a scan of batch_target_running, bounded by what runners hold
    "_RUNNING_HOSTS": {"batch_target_running"},
    # each picked target by its rowid, picked from the pending targets of the job (of one host)
    "_CLAIM_TARGETS": {"batch_target_host (job_id=? AND host>?)", "INTEGER PRIMARY KEY (rowid=?)"},
    "_CLAIM_HOST_TARGETS": {
        "batch_target_host (job_id=? AND host>? AND host<?)",  # one host, as a range
        "INTEGER PRIMARY KEY (rowid=?)",
    },
    # claims: one runner's by batch_target_running, the stale ones by a scan of it (running targets only)
    # the renewal picks the runner's claims (PostgreSQL: those no other transaction holds), then each by rowid
    "_RENEW": {"batch_target_running (runner=?)", "INTEGER PRIMARY KEY (rowid=?)"},
    "_RELEASE": {"batch_target_running (runner=?)"},
    "_STALE_JOBS": {"batch_target_running", f"{JOB_PK} (id=?)"},
    "_FAIL_STALE": {"batch_target_running"},
    "_REQUEUE_STALE": {"batch_target_running"},
    "_STALE_CLAIMS": {"batch_target_running"},
    "_ANY_STALE": {"batch_target_running"},
    "_COUNT_FAILED": {JOB_BY_ID},
    "_FINISH_JOB": {JOB_BY_ID, TARGETS_OF_JOB},  # a job whose targets are all final: counts its failed
    "_LOCK_JOB": {JOB_BY_ID},
    "_JOB_STATUS": {JOB_BY_ID},
    "_JOB_COMPLETE": {JOB_BY_ID},
    "_TARGET_RUNNER": {TARGET_BY_KEY},
    "_CLAIM_JOBS": {JOB_BY_ID},  # each job of the list (a JSON array read by json_each) by its key
    "_RESCUE": LIVE_SCAN,  # live jobs only, each lease checked: not the history's old leases
    # who waits and which hosts are busy (a metrics scrape): the live jobs by caller, a SCAN of their partial
    # index; the running targets, a SCAN of theirs, each job by its key
    "_OUTSTANDING": (*LIVE_SCAN, {"batch_job_ring"}),  # each a partial index of the live jobs
    "_RUNNING": {"batch_target_running", JOB_BY_ID},
    # the CLI's dry-run previews (not hot): they read every due or evictable job by design
    "_SWEEP_CANDIDATES": {"batch_job_lease (lease<?)"},
    "_EVICT_CANDIDATES": {"batch_job_evictable"},
    # the client's calls: a key hit's request compared with the stored job's; a cancel
    "_STORED_CLASS": {JOB_BY_ID},
    "_STORED_TARGETS": {TARGETS_OF_JOB},
    "_CANCEL_JOB": {JOB_BY_ID, TARGETS_OF_JOB},
    "_FAIL_OPEN_TARGETS": {TARGETS_OF_JOB},
    "_JOB_EXISTS": {JOB_BY_ID},
    "_INSERT_JOB": set(),
    "_INSERT_TARGET": set(),
    # delayed targets: a claim moves the due ones back from batch_target_delayed, which holds only the
    # waiting ones; finish_complete_jobs reads the live jobs only
    # (each one's host probed by the policy's key: a host still backed off keeps it waiting)
    "_PROMOTE_DUE": {"batch_target_delayed (not_before>? AND not_before<?)", POLICY_BY_HOST},
    "_COMPLETE_JOBS": LIVE_SCAN,
    "_LOCK_RETRIED_JOB": {JOB_BY_ID},
    "_LEASE_RETRIED": {JOB_BY_ID},
    "_TARGET_STATE": {TARGET_BY_KEY},
    "_RETRY": {TARGET_BY_KEY},
    "_FAILED_TOTALS": {TARGETS_OF_JOB},
    "_REOPEN_TARGETS": {TARGETS_OF_JOB},
    "_REOPEN_JOB": {JOB_BY_ID},
}

#: The only statements that may sort in a temporary B-tree, and what they sort.
SORTS = {
    # only the rows of one (caller, idem_key): that key's resubmissions, not the history
    "_IDEM": "USE TEMP B-TREE FOR ORDER BY",
    # only the due jobs, which the preview lists anyway (ties in lease by created_at, id)
    "_SWEEP_CANDIDATES": "USE TEMP B-TREE FOR RIGHT PART OF ORDER BY",
}

#: The plan lines a flat statement may have. Anything else (a plain SCAN of a table, an automatic
#: index, a temporary B-tree) fails the test.
PLAN_LINE = re.compile(
    r"SEARCH \w+ USING (?:COVERING )?(?:INDEX (?P<index>\w+ \(.+\))|(?P<pk>INTEGER PRIMARY KEY \(.+\)))"
    r"(?: LEFT-JOIN)?"
    r"|SCAN \w+ USING (?:COVERING )?INDEX "
    r"(?P<partial>batch_job_live|batch_job_claim|batch_job_ring|batch_job_evictable|batch_target_running"
    r"|sqlite_autoindex_batch_host_policy_1)"  # _ANY_POLICY: its first entry only (LIMIT 1)
    r"|(?P<subquery>(?:CORRELATED )?SCALAR SUBQUERY \d+|LIST SUBQUERY \d+)"
    # the claim's CTE: at most ``take`` target keys, read from the partial index of pending targets; the
    # walk of a job's hosts: one row a host, each found by a search of that index
    r"|(?P<cte>MATERIALIZE picked|SCAN picked"
    r"|CO-ROUTINE walk|SETUP|SCAN CONSTANT ROW|RECURSIVE STEP|SCAN walk)"
    # a list bound as one JSON array (``backend.one_of``): its elements, not a table
    r"|(?P<values>SCAN json_each VIRTUAL TABLE INDEX \d+:)"
)


def plan(sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[str]:
    return [row[3] for row in dcache.db.execute_sql("EXPLAIN QUERY PLAN " + sql, params).fetchall()]


def bound(statement: Statement) -> tuple[str, tuple[Any, ...]]:
    """The statement's SQL and its parameters, bound the way the manager binds them (only its own slots:
    the manager never passes a statement a value it has no slot for)."""
    slots = {name for name in (getattr(p, "name", None) for p in statement.template) if name is not None}
    return statement.bind({name: SLOT_VALUES[name] for name in slots})


def accesses(lines: list[str], name: str) -> set[str]:
    used = set()
    for line in lines:
        match = PLAN_LINE.fullmatch(line)
        if match is None and SORTS.get(name) == line:
            continue
        assert match is not None, (
            f"{name}: plan line {line!r} is neither an index search nor a partial-index scan"
        )
        if not match["subquery"] and not match["cte"] and not match["values"]:
            used.add(match["index"] or match["pk"] or match["partial"])
    return used


def test_every_statement_is_pinned(file_store: Path) -> None:
    statements = set(rule_statements())
    assert statements == set(EXPECTED_ACCESS)


#: Statistics an operator's ANALYZE (or PRAGMA optimize) may leave for the index of pending targets: about
#: one pending target per job, or per job and host, in a million. With either, SQLite took an equality on
#: the index's leading columns for one row and sorted what it matched (every pending target of a job, or of
#: a job's host): the claims' reads give the hosts as a range, so the index's order stands.
#: Those two run in the full lane only: the fast lane pins each plan plain and after ANALYZE.
PENDING_STATS = {"one_per_job": "1000000 1 1 1", "one_per_host": "1000000 500 1 1"}


@pytest.mark.parametrize(
    "analyzed", ["plain", "analyzed", *(pytest.param(k, marks=pytest.mark.slow) for k in PENDING_STATS)]
)
@pytest.mark.parametrize("name", sorted(EXPECTED_ACCESS))
def test_statement_plan_uses_an_index(history: int, name: str, analyzed: str) -> None:
    if analyzed != "plain":  # an operator ran ANALYZE: the statistics must not talk SQLite into a table scan
        dcache.db.execute_sql("ANALYZE")
    if analyzed in PENDING_STATS:
        dcache.db.execute_sql("DELETE FROM sqlite_stat1 WHERE idx = 'batch_target_host'")
        dcache.db.execute_sql(
            "INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES ('batch_target', 'batch_target_host', ?)",
            (PENDING_STATS[analyzed],),
        )
        dcache.db.execute_sql("ANALYZE sqlite_schema")  # SQLite reads the statistics again
    lines = plan(*bound(rule_statements()[name]))
    expected = EXPECTED_ACCESS[name]
    assert accesses(lines, name) in (expected if isinstance(expected, tuple) else (expected,)), lines
    # a CTE's own rows (the claim's picked targets, the walk's hosts) are the only rows scanned
    assert not any(re.fullmatch(r"SCAN (?!picked$|walk$)\w+", line) for line in lines)


#: What a result write (update_batch_target, and each target of update_batch_targets) opens for writing,
#: besides the two tables and the byte total's row. batch_job_lease is the original schema's and moves with
#: every lease; batch_job_evictable is opened because the lease is in its key and the bytes in its
#: condition, but a live job is never in it; batch_target_host loses the target that leaves pending (a
#: claimed target has left it already).
#: Every other index sift adds is left alone: no index keyed on the lease holds live jobs.
RESULT_WRITE_INDEXES = {
    "move": {"sqlite_autoindex_batch_job_1", "batch_job_lease", "batch_job_evictable"},
    # the lease is ``now`` already (every result but a job's first in each second): the lease's index is
    # left alone, where setting the lease to the value it holds would still move its entry
    "move at lease": {"sqlite_autoindex_batch_job_1", "batch_job_evictable"},
    # a result leaves the pending or the running targets (a claimed target is running when written)
    # (both are opened because their filters read the status; a target is in at most one of them, before
    # and after, so only the index it leaves gets an entry written)
    # (the pending targets by host, which back-offs read, likewise)
    "write": {TARGET_PK, "batch_target_host", "batch_target_pending_host", "batch_target_running"},
    # pending or failed: the same, and the claim's runner and heartbeat cleared (the running index's key)
    "write unclaimed": {
        TARGET_PK,
        "batch_target_host",
        "batch_target_pending_host",
        "batch_target_running",
    },
}


def written_btrees(sql: str, params: tuple[Any, ...]) -> set[str]:
    """The tables and indexes a statement's program opens for writing (its OpenWrite instructions)."""
    names = dict(
        dcache.db.execute_sql("SELECT rootpage, name FROM sqlite_master WHERE rootpage > 0").fetchall()
    )
    program = dcache.db.execute_sql("EXPLAIN " + sql, params).fetchall()
    return {names[row[3]] for row in program if row[1] == "OpenWrite"}


#: SQLite's statements of one result write (``backends/sqlite/writes.py``), bound as a runner's write binds
#: them: the job moved by the target's change (setting the lease, or where it is ``now`` already), then the
#: target written (a claimed status, or pending or failed, which also end the claim).
MOVE_PARAMS = ("runner", "runner-1", 10_000, 1, 0, 1, 1024)
RESULT_WRITES = {
    "move": (sqlite_writes._move_sql(1, False), MOVE_PARAMS),
    "move at lease": (sqlite_writes._move_sql(1, True), MOVE_PARAMS),
    "write": (sqlite_writes._WRITE_ONE, ("runner", 0, "done", "r", None, None)),
    "write unclaimed": (sqlite_writes._WRITE_ONE_UNCLAIMED, ("runner", 0, "failed", None, "e", None)),
}


@pytest.mark.parametrize("analyzed", ["plain", "analyzed"])
@pytest.mark.parametrize("name", sorted(RESULT_WRITES))
def test_a_result_write_finds_its_job_and_target_by_key(history: int, name: str, analyzed: str) -> None:
    # the job by its id (the lease checked on the row, not by its index), the target by its key, read
    # once for the count and once for the job's move: whatever the statistics, no scan
    if analyzed == "analyzed":
        dcache.db.execute_sql("ANALYZE")
    lines = plan(*RESULT_WRITES[name])
    searches = [line for line in lines if line.startswith("SEARCH")]
    expected = ["SEARCH batch_target USING INDEX " + TARGET_BY_KEY]
    if name.startswith("move"):
        expected = [
            "SEARCH batch_job USING INDEX " + JOB_BY_ID,
            *[f"SEARCH t USING INDEX {TARGET_BY_KEY}"] * 2,
        ]
    assert searches == expected, lines
    assert all(line.startswith(("SEARCH", "SCALAR SUBQUERY", "CORRELATED SCALAR SUBQUERY")) for line in lines)


@pytest.mark.parametrize("name", sorted(RESULT_WRITE_INDEXES))
def test_indexes_a_result_write_touches(history: int, name: str) -> None:
    written = written_btrees(*RESULT_WRITES[name])
    tables = {"batch_job", "batch_target", "batch_totals"}
    assert written - tables == RESULT_WRITE_INDEXES[name]


@pytest.mark.parametrize("analyzed", ["plain", "analyzed"])
@pytest.mark.parametrize("rows", [2, 256])
def test_a_set_move_finds_its_job_and_each_target_by_key(history: int, rows: int, analyzed: str) -> None:
    # update_batch_targets on SQLite: the job's move (its count checking the set) reads the set's rows
    # (constants) and finds the job by id and each target by its key, whatever the statistics; the targets
    # are then written one by one with the one target's writes (test_a_result_write_finds_its_job_and_...)
    if analyzed == "analyzed":
        dcache.db.execute_sql("ANALYZE")
    lines = plan(sqlite_writes._move_sql(rows, True), ("runner", None, 10_000, rows, *[0, 1, 10] * rows))
    searched = {line for line in lines if line.startswith("SEARCH")}
    keys = {re.sub(r"^SEARCH \w+ USING INDEX ", "", line) for line in searched}
    assert keys == {TARGET_BY_KEY, JOB_BY_ID}, lines
    rest = {
        "MATERIALIZE w",
        f"SCAN {rows} CONSTANT ROWS",
        "SCAN w",
        "BLOOM FILTER ON t (job_id=? AND idx=?)",
        "SCALAR SUBQUERY",
        "CORRELATED SCALAR SUBQUERY",
    }
    assert {re.sub(r" \d+$", "", line) for line in lines} - searched <= rest, lines


#: Every UPDATE of one row by its key that the store or another program may run, changing every column a
#: partial index is keyed on or filtered by. SQLite tests the old and the new row against each partial
#: index over a changed column; an IN list of more than two values there is tested through a temporary
#: table built on each such write (twice per result write: it once cost more than the rest of the step).
ROW_WRITES = {
    "batch_job": (
        "UPDATE batch_job SET caller = ?, status = ?, created_at = ?, lease = ?, nbytes = ? WHERE id = ?"
    ),
    "batch_target": "UPDATE batch_target SET status = ?, runner = ?, result = ? WHERE job_id = ? AND idx = ?",
}


@pytest.mark.parametrize("table", sorted(ROW_WRITES))
def test_a_row_write_builds_no_temporary_table(history: int, table: str) -> None:
    sql = ROW_WRITES[table]
    program = dcache.db.execute_sql("EXPLAIN " + sql, [None] * sql.count("?")).fetchall()
    assert [row[1] for row in program if row[1] in {"OpenEphemeral", "OpenAutoindex"}] == []
    assert "OpenWrite" in {row[1] for row in program}  # the program is the write's, not an empty one


@pytest.mark.parametrize(
    "name",
    [*RESULT_WRITES, "_SET_JOB_STATUS", "_TOUCH", "_DELETE_JOB"],
)
def test_a_rule_writing_one_row_builds_no_temporary_table(history: int, name: str) -> None:
    sql, params = RESULT_WRITES[name] if name in RESULT_WRITES else bound(rule_statements()[name])
    program = dcache.db.execute_sql("EXPLAIN " + sql, params)
    assert "OpenEphemeral" not in {row[1] for row in program.fetchall()}


def test_an_index_an_earlier_version_defined_otherwise_is_made_again(tmp_path: Path) -> None:
    # An earlier version's batch_job_evictable tested the finished statuses with IN (...): open_db makes it
    # again as the schema defines it, in the open's one upgrade transaction, and the store keeps its rows.
    path = tmp_path / "store.db"
    dcache.open_db(path)
    dcache.create_batch_job(make_job("kept", status="done", targets_total=1), make_targets(1))
    dcache.close_db()
    earlier = (
        "CREATE INDEX batch_job_evictable ON batch_job(lease, created_at, id) "
        "WHERE nbytes > 0 AND status IN ('done', 'partial', 'failed', 'cancelled')"
    )
    with sqlite3.connect(path) as conn:
        conn.execute("DROP INDEX batch_job_evictable")
        conn.execute(earlier)
    conn.close()
    dcache.open_db(path)
    try:
        stored = dcache.db.execute_sql(
            "SELECT sql FROM sqlite_master WHERE name = 'batch_job_evictable'"
        ).fetchone()[0]
        assert stored == OWN_INDEXES["batch_job_evictable"] != earlier
        assert "status = 'cancelled'" in stored
        assert plan(*bound(rule_statements()["_EVICTABLE"])) == ["SCAN t1 USING INDEX batch_job_evictable"]
        assert dcache.batch_job("kept") is not None
    finally:
        dcache.close_db()


#: Indexes earlier versions made, as they made them, which open_db drops.
RETIRED_INDEXES = {
    "batch_job_live_lease": "ON batch_job(lease) WHERE status IN ('queued', 'running')",
    "batch_target_pending": "ON batch_target(job_id, idx) WHERE status = 'pending'",
}


@pytest.mark.parametrize("index", sorted(RETIRED_INDEXES))
def test_a_store_an_earlier_version_made_loses_its_retired_index(tmp_path: Path, index: str) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path)
    dcache.close_db()
    with sqlite3.connect(path) as conn:  # as an earlier version left it
        conn.execute(f"CREATE INDEX {index} {RETIRED_INDEXES[index]}")
        conn.execute("PRAGMA user_version = 4")
    conn.close()
    dcache.open_db(path)
    try:
        names = {row[0] for row in dcache.db.execute_sql("SELECT name FROM sqlite_master").fetchall()}
        assert index not in names
        assert {"batch_job_claim", "batch_target_host"} <= names
        assert dcache.db.execute_sql("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        dcache.close_db()


def test_batch_nbytes_reads_the_total_by_primary_key(history: int) -> None:
    assert plan(TOTAL_NBYTES_SQL) == ["SEARCH batch_totals USING INTEGER PRIMARY KEY (rowid=?)"]
    assert dcache.batch_nbytes() == history * 320


def trigger_bodies() -> dict[str, str]:
    rows = dcache.db.execute_sql("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name")
    bodies = {}
    for name, sql in rows.fetchall():
        match = re.search(r"\bBEGIN\s+(.*?);\s*END\s*$", sql, flags=re.S | re.I)
        assert match is not None, sql
        bodies[name] = re.sub(r"\b(?:NEW|OLD)\.\w+", "0", match[1])
    return bodies


def test_trigger_bodies_update_the_total_by_primary_key(history: int) -> None:
    # The triggers run inside every write that changes a job's bytes (each runner step): each must touch
    # the one totals row by its key, never sum over batch_job.
    bodies = trigger_bodies()
    assert set(bodies) == {"batch_totals_insert", "batch_totals_delete", "batch_totals_update"}
    for name, body in bodies.items():
        assert body.startswith("UPDATE batch_totals "), (name, body)
        assert plan(body) == ["SEARCH batch_totals USING INTEGER PRIMARY KEY (rowid=?)"], (name, body)


# -- Statement counts -------------------------------------------------------------------------------------


@contextmanager
def traced() -> Iterator[list[str]]:
    """Every statement run on the shared connection inside the block, as sqlite3 reports it."""
    conn: sqlite3.Connection = dcache.db.connection()
    log: list[str] = []
    conn.set_trace_callback(log.append)
    try:
        yield log
    finally:
        conn.set_trace_callback(None)


KIND = re.compile(
    r'(?P<bare>BEGIN IMMEDIATE|COMMIT|ROLLBACK)\b.*|(?P<verb>UPDATE|INSERT INTO|DELETE FROM) "?(?P<table>\w+)'
    r'.*|SELECT .*? FROM "?(?P<from>\w+).*',
    flags=re.S,
)


def kinds(log: list[str]) -> list[str]:
    """The statements of a trace, named by verb and table.

    Python reports each trigger sub-program SQLite starts with the text of the statement that fired it,
    so a write that fires a batch_totals trigger shows up two or three times in a row; those repeats are
    one statement here (every statement below has its own text: executemany rows differ in their values).
    """
    named = []
    previous = None
    for sql in log:
        if sql == previous:
            continue
        previous = sql
        match = KIND.fullmatch(
            re.sub(r"^WITH .*? (?=UPDATE \"?batch_target\"? SET|SELECT )", "", sql.strip(), flags=re.S)
        )
        assert match is not None, sql
        if match["bare"]:
            named.append(match["bare"])
        elif match["verb"]:
            named.append(f"{match['verb'].split()[0]} {match['table']}")
        else:
            named.append(f"SELECT {match['from']}")
    return named


BEGIN, COMMIT = "BEGIN IMMEDIATE", "COMMIT"
ONE_KB = "x" * 1024


#: A claim's start: the ring's row, the delayed targets come due moved back (one statement, reading only
#: batch_target_delayed), whether any host has a policy row (none here), the first caller with pending work
#: and that caller's oldest such job.
CLAIM_START = [
    BEGIN,
    "SELECT batch_claim_ring",
    "UPDATE batch_target",
    "SELECT batch_host_policy",
    "SELECT batch_job",
]
#: One turn of a claim: the job's targets taken.
TAKE = ["UPDATE batch_target"]
#: The ring's walk comes round: the next caller with pending work (none), the first caller (known, or none).
ROUND = ["SELECT batch_job", "SELECT batch_job"]
#: The claim's end: the cursor saved, the jobs taken from marked running (one statement).
CLAIM_END = ["UPDATE batch_claim_ring", "UPDATE batch_job", COMMIT]


def runner_update(idx: int = 0) -> None:
    dcache.update_batch_target("runner", idx, "done", result=ONE_KB, now=10_000)


def second_result() -> None:
    """A result written in the second of the job's last one (the runner's job holds lease 9,000)."""
    dcache.update_batch_target("runner", 0, "done", result=ONE_KB, now=9_000)


#: A set write of 10 results' statements as sqlite3 reports them: the job's update twice more (its
#: batch_totals trigger), and the one target's write once for each target.
RAW_SET = 15


#: name: (the call, the statements it issues, how many statement starts sqlite3 reports in all).
#: The raw count also counts each trigger sub-program SQLite starts: the runner step's job UPDATE fires
#: batch_totals_update, whose WHEN is true (the bytes change), and is reported 3 times. A result write
#: first updates the job only if its lease is ``now`` already, which leaves the lease's index alone; the
#: job's first result in a new second finds no such row (one report), and sets the lease.
CALLS: dict[str, tuple[Callable[[], object], list[str], int]] = {
    "runner step: update_batch_target to done with 1 KB, in the second of the job's lease": (
        second_result,
        [BEGIN, "UPDATE batch_job", "UPDATE batch_target", COMMIT],
        6,
    ),
    "runner step: update_batch_target to done with 1 KB, the lease moving to a new second": (
        runner_update,
        [BEGIN, "UPDATE batch_job", "UPDATE batch_job", "UPDATE batch_target", COMMIT],
        7,
    ),
    "update_batch_targets of 10 results: one transaction, one statement for the job, one write a target": (
        lambda: dcache.update_batch_targets(
            "runner", [{"idx": i, "status": "done", "result": ONE_KB} for i in range(10)], now=9_000
        ),
        [BEGIN, "UPDATE batch_job", *["UPDATE batch_target"] * 10, COMMIT],
        RAW_SET,
    ),
    "update_batch_targets of 10 results in a new second: the job's one write moves the lease": (
        lambda: dcache.update_batch_targets(
            "runner", [{"idx": i, "status": "done", "result": ONE_KB} for i in range(10)], now=10_000
        ),
        [BEGIN, "UPDATE batch_job", "UPDATE batch_job", *["UPDATE batch_target"] * 10, COMMIT],
        RAW_SET + 1,
    ),
    "runner step: no-op evict_batch_oldest": (
        lambda: dcache.evict_batch_oldest(10**15),
        ["SELECT batch_totals"],
        1,
    ),
    "no-op sweep_batch": (lambda: dcache.sweep_batch(100, now=1_000), ["SELECT batch_job"], 1),
    "batch_job": (lambda: dcache.batch_job("old-00001"), ["SELECT batch_job"], 1),
    "batch_job miss": (lambda: dcache.batch_job("nope"), ["SELECT batch_job"], 1),
    "batch_job_by_idem": (
        lambda: dcache.batch_job_by_idem("caller-1", "key-1", 10**6, now=10_000),
        ["SELECT batch_job"],
        1,
    ),
    "live_batch_jobs": (lambda: dcache.live_batch_jobs("caller-1"), ["SELECT batch_job"], 1),
    "live_batch_jobs_total": (dcache.live_batch_jobs_total, ["SELECT batch_job"], 1),
    "batch_nbytes": (dcache.batch_nbytes, ["SELECT batch_totals"], 1),
    "batch_targets": (lambda: dcache.batch_targets("old-00001"), ["SELECT batch_job"], 1),
    # the targets in INSERTs of many rows, a power of two each: 2, then 1
    "create_batch_job with 3 targets": (
        lambda: dcache.create_batch_job(make_job("new", targets_total=3), make_targets(3)),
        [BEGIN, "INSERT batch_job", *["INSERT batch_target"] * 2, COMMIT],
        7,
    ),
    # one turn for the only caller, the ring's walk comes round (every member known), then the other 4
    # targets as whole rounds in one take
    "claim_batch_targets of 5 from the runner's job": (
        lambda: dcache.claim_batch_targets(5, now=10_000),
        [*CLAIM_START, *TAKE, *ROUND, *TAKE, *CLAIM_END],
        12,
    ),
    # the job runs out in the rounds' take: the caller leaves the ring, which is then empty
    "claim_batch_targets of all 20 pending targets, limit 25": (
        lambda: dcache.claim_batch_targets(25, now=10_000),
        [*CLAIM_START, *TAKE, *ROUND, *TAKE, "SELECT batch_job", *CLAIM_END],
        13,
    ),
    "claim_batch_targets with nothing pending": (
        lambda: (dcache.claim_batch_targets(20, now=10_000), dcache.claim_batch_targets(5, now=10_001)),
        [
            *CLAIM_START,
            *TAKE,
            *ROUND,
            *TAKE,
            *CLAIM_END,
            BEGIN,
            "SELECT batch_claim_ring",
            "UPDATE batch_target",
            "SELECT batch_host_policy",
            *ROUND,
            COMMIT,
        ],
        19,
    ),
    "rescue_stale_jobs": (
        lambda: dcache.rescue_stale_jobs(60, "runner lost", now=10_000),
        [BEGIN, "UPDATE batch_job", COMMIT],
        3,
    ),
    "put_batch_targets of 4 targets": (
        lambda: dcache.put_batch_targets("runner", make_targets(4, start=20)),
        [BEGIN, "SELECT batch_job", "INSERT batch_target", COMMIT],
        4,
    ),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_hot_call_statements(history: int, name: str) -> None:
    call, expected, raw = CALLS[name]
    with traced() as log:
        call()
    assert kinds(log) == expected, log
    assert len(log) == raw, log


def test_rewriting_a_finished_target_issues_the_same_statements(history: int) -> None:
    # A rewrite with the same result changes no bytes: the trigger's WHEN is false (one report fewer).
    dcache.update_batch_target("runner", 1, "done", result=ONE_KB, now=10_000)
    with traced() as log:
        dcache.update_batch_target("runner", 1, "done", result=ONE_KB, now=10_000)
    assert kinds(log) == [BEGIN, "UPDATE batch_job", "UPDATE batch_target", COMMIT]
    assert len(log) == 5, log


#: A runner step's statements: a result in the second of the job's lease, or in a new second.
SAME_SECOND = (BEGIN, "UPDATE batch_job", "UPDATE batch_target", COMMIT, "SELECT batch_totals")
NEW_SECOND = (
    BEGIN,
    "UPDATE batch_job",
    "UPDATE batch_job",
    "UPDATE batch_target",
    COMMIT,
    "SELECT batch_totals",
)


@pytest.mark.parametrize(("seconds_apart", "expected"), [(1, NEW_SECOND), (0, SAME_SECOND)])
def test_the_runner_step_does_not_grow_with_history(
    history: int, seconds_apart: int, expected: tuple[str, ...]
) -> None:
    # Twenty runner steps in a row issue exactly the same statements: nothing accumulates from call to call.
    dcache.touch_batch_job("runner", now=10_000)
    counts = set()
    for idx in range(20):
        with traced() as log:
            dcache.update_batch_target(
                "runner", idx, "done", result=ONE_KB, now=10_000 + (idx + 1) * seconds_apart
            )
            dcache.evict_batch_oldest(10**15)
        counts.add(tuple(kinds(log)))
    assert counts == {expected}


def pages_written(store: Path, write: Callable[[], object]) -> set[str]:
    """The tables and indexes whose pages ``write`` appends to the -wal file: its frames' page numbers (the
    WAL index header's ``mxFrame`` before and after), named through SQLite's ``dbstat`` table."""

    def frames() -> int:
        with open(f"{store}-shm", "rb") as f:
            return int.from_bytes(f.read(20)[16:20], sys.byteorder)

    try:
        names = dict(dcache.db.execute_sql("SELECT pageno, name FROM dbstat").fetchall())
    except dcache.StoreUnavailable:  # a SQLite built without the dbstat table
        pytest.skip("this SQLite has no dbstat table")
    before = frames()
    write()
    after = frames()
    assert after > before  # no checkpoint restarted the -wal file meanwhile
    page_size = dcache.db.execute_sql("PRAGMA page_size").fetchone()[0]
    with open(f"{store}-wal", "rb") as f:
        wal = f.read()
    offsets = (32 + frame * (24 + page_size) for frame in range(before, after))  # each frame's header
    return {names.get(int.from_bytes(wal[at : at + 4], "big"), "") for at in offsets}


def test_a_result_in_the_second_of_the_lease_writes_no_page_of_the_lease_index(
    history: int, tmp_path: Path
) -> None:
    """What the lease's form of the job's update saves: the lease index's page in every commit but a job's
    first of each second (the -wal file's frames, each copied back by a checkpoint later)."""
    store = tmp_path / "store.db"
    moved = pages_written(store, lambda: runner_update(0))  # the lease goes from 9,000 to 10,000
    kept = pages_written(store, lambda: runner_update(1))  # and stays
    assert "batch_job_lease" in moved
    assert "batch_job_lease" not in kept
    assert {"batch_job", "batch_target", "batch_totals"} <= kept


#: Every b-tree a result in the lease's second appends pages of, besides the two tables and the byte total's
#: row: the indexes the target leaves (pending, by job and by host; or running once claimed).
#: ``sqlite_schema`` is page 1, whose header holds the file's size: it is written when a page split grows
#: the file.
RESULT_PAGES = {
    "pending": {"batch_target_host", "batch_target_pending_host"},
    "running": {"batch_target_running"},
}


@pytest.mark.parametrize("status", sorted(RESULT_PAGES))
def test_a_result_write_appends_pages_of_these_btrees_only(history: int, tmp_path: Path, status: str) -> None:
    """The -wal frames a runner step appends, which a checkpoint later copies back and syncs: each b-tree a
    result write changes costs a page in every commit (``python scripts/bench --only raw`` counts them)."""
    store = tmp_path / "store.db"
    if status == "running":
        claimed = dcache.claim_batch_targets(2, now=10_000, fair=False)
        assert [(t.job_id, t.idx) for t in claimed] == [("runner", 0), ("runner", 1)]
    runner_update(0)  # the job's lease moves to 10,000
    written = pages_written(store, lambda: runner_update(1))
    assert written - {"sqlite_schema"} == {"batch_job", "batch_target", "batch_totals"} | RESULT_PAGES[status]


def test_a_result_in_the_second_of_the_lease_leaves_the_lease_alone(history: int) -> None:
    """The lease's index entry moves only when the lease does: the results of one second write it once (the
    statement that runs opens no lease index: test_indexes_a_result_write_touches), and count as before."""
    runner_update(0)
    with traced() as log:
        runner_update(1)
    assert kinds(log) == [BEGIN, "UPDATE batch_job", "UPDATE batch_target", COMMIT]
    job = dcache.batch_job("runner")
    assert job is not None and (job.lease, job.targets_done, job.nbytes) == (10_000, 2, 2 * len(ONE_KB))
