"""``sift simulate --hosts N``: real host processes on one store (a SQLite file, or a PostgreSQL schema of
its own), one of them SIGKILLed part-way; and the end check, which must fail when the store or a journal
says something went wrong."""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import re
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run
from conftest import drop_schema

from sift import dcache
from sift.cli.simulation.coordinator import HostsRun, assign, run_hosts
from sift.cli.simulation.cores import busy_pct, cores_time
from sift.cli.simulation.host import MAX_ATTEMPTS, STALE_REASON, Host, HostConfig
from sift.cli.simulation.hosts_verdicts import check_run
from sift.cli.simulation.journal import read_journal
from sift.cli.simulation.workload import JobSpec, Settings, plan
from sift.cli.store import CommandError

HOSTS = [
    "--hosts",
    "3",
    "--jobs",
    "80",
    "--targets",
    "8",
    "--workers",
    "2",
    "--budget",
    "96KiB",
    "--stale-after",
    "6s",
    "--seed",
    "4",
    # Fetches that take time: the victim then holds claimed targets most of the time, so the kill (at a
    # third of the targets) finds it holding some (with none, 1 run in 10 on PostgreSQL killed it empty).
    "--fetch-ms",
    "10",
]
#: The budget keeps about two thirds of the jobs (the rest are evicted, oldest lease first): the tampering
#: tests need finished jobs that are still findable, failed targets among them. Which jobs stay depends on
#: timing: a third of the jobs keeps about 4 failed targets on average, so about 1 run in 60 keeps none;
#: two thirds keep about 12, and a run with none is a few in a million.
SETTINGS = Settings(jobs=80, targets=8, workers=2, budget=1024 * 1024, seed=4)
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(autouse=True)
def journals_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command keeps its journals in a new directory under $TMPDIR: this test's, not /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def store_rows(target: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Jobs (id, status, error, targets_done, targets_total, nbytes) and targets (job_id, status, result,
    error, runner, attempts), read with the package's own connection closed and a plain query."""
    dcache.open_db(target)
    try:
        jobs = dcache.db.execute_sql(
            "SELECT id, status, error, targets_done, targets_total, nbytes FROM batch_job"
        ).fetchall()
        targets = dcache.db.execute_sql(
            "SELECT job_id, status, result, error, runner, attempts FROM batch_target"
        ).fetchall()
    finally:
        dcache.close_db()
    return jobs, targets


@pytest.mark.slow
@pytest.mark.parametrize("store_target", BACKENDS, indirect=True)
def test_three_hosts_one_killed(store_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "simulate", "--db", store_target, "--json", *HOSTS)
    summary = json.loads(out)
    failed = [check for check in summary["invariants"] if not check["ok"]]
    assert (code, failed, err) == (0, [], "")
    hosts = summary["per_host"]
    assert [(h["host"], h["state"], h["exit"]) for h in hosts] == [
        (0, "finished", 0),
        (1, "finished", 0),
        (2, "killed", -signal.SIGKILL),  # a real SIGKILL, as multiprocessing reports it
    ]
    kill = summary["kill"]
    assert kill["host"] == 2 and kill["held_targets"] >= 1
    # The killed host's claims were requeued, by the survivors' keepers only, and none failed: each target
    # it held had attempts left. No live host's write was refused. The held targets are those the store
    # showed running under its runners once nothing it sent could land: on SQLite, read while it was frozen,
    # exactly those went stale; on PostgreSQL, read once the server had ended its connections, a keeper may
    # have requeued some already (or be requeueing them, its rows locked and so not counted).
    requeued, held = summary["total"]["requeued"], kill["held_targets"]
    assert requeued >= held if store_target.startswith("postgresql:") else requeued == held
    assert hosts[2]["requeued"] == 0
    assert summary["total"]["failed_stale"] == 0 and summary["total"]["claims_lost"] == 0
    assert summary["total"]["targets_written"] == sum(h["targets_written"] for h in hosts)
    assert 0 < summary["cores_busy_pct"] <= 100  # the hosts ran: some core was busy
    # Independently of the check: every job ended, each target written by a runner (none failed stale),
    # claimed once or, when the killed host's claim of it was requeued, twice (by the counts the keepers
    # recorded at most), its last claim a survivor's or the killed host's own; the counts follow the rows.
    jobs, targets = store_rows(store_target)
    assert {status for _, status, *_ in jobs} <= {"done", "partial", "failed"}
    assert {status for _, status, *_ in targets} <= {"done", "failed"}
    assert not [t for t in targets if t[3] == STALE_REASON]
    assert {attempts for *_, attempts in targets} <= {1, 2} and MAX_ATTEMPTS > 2
    assert sum(attempts - 1 for *_, attempts in targets) <= summary["total"]["requeued"]
    prefix = f"{journal_prefix(Path(summary['journals']))}-host-"
    runners = {f"{prefix}{h}-{n}" for h in (0, 1, 2) for n in (0, 1)}
    assert {runner for _, status, *_, runner, _ in targets if status == "done"} <= runners
    # a failed target's claim ended with its write (no runner); every target was written by a claimer
    assert {runner for _, status, *_, runner, _ in targets if status == "failed"} <= {None}
    finished: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for job, status, result, *_ in targets:
        finished[job] = finished.get(job, 0) + (status in ("done", "failed"))
        sizes[job] = sizes.get(job, 0) + (0 if result is None else len(result.encode("utf-8")))
    assert [(j[3], j[5]) for j in jobs] == [(finished.get(j[0], 0), sizes.get(j[0], 0)) for j in jobs]
    assert summary["bytes_stored"] == sum(j[5] for j in jobs)
    # The killed host's journal ends where it was killed: no end record.
    journals = Path(summary["journals"])
    assert read_journal(journals / "host-0.jsonl")[-1]["k"] == "end"
    assert read_journal(journals / "host-2.jsonl")[-1]["k"] != "end"


def journal_prefix(journals: Path) -> str:
    """The run's prefix, from the first job a host's journal records."""
    first = next(r for r in read_journal(journals / "host-0.jsonl") if r["k"] == "sub")
    return str(first["id"]).rpartition("-")[0]


def test_cores_busy_is_the_share_of_cpu_time_not_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From two readings of /proc/stat's first line (user nice system idle iowait irq softirq steal …):
    the ticks spent neither idle nor waiting on I/O, over all the ticks between them."""
    stat = tmp_path / "stat"
    monkeypatch.setattr("sift.cli.simulation.cores.PROC_STAT", str(stat))
    stat.write_text("cpu  100 0 50 700 50 0 0 0 0 0\ncpu0 50 0 25 350 25 0 0 0 0 0\n")
    before = cores_time()
    assert before == (900, 750)
    stat.write_text("cpu  250 10 80 800 70 5 3 2 99 0\n")  # guest time (99) is already in user's
    after = cores_time()
    assert after == (1220, 870)
    assert busy_pct(before, after) == round(100 * (320 - 120) / 320, 1)  # 62.5
    assert busy_pct(before, before) is None  # no time went by
    stat.unlink()
    assert cores_time() is None and busy_pct(before, cores_time()) is None


def test_repeats_go_to_another_host() -> None:
    specs = plan(SETTINGS)
    shares = assign(specs, 3)
    assert sorted(s.number for share in shares for s in share) == [s.number for s in specs]
    host_of = {s.number: h for h, share in enumerate(shares) for s in share}
    repeats = [s for s in specs if s.repeat]
    assert repeats
    for spec in repeats:
        original = next(s for s in specs if s.idem_key == spec.idem_key and not s.repeat)
        assert host_of[spec.number] == (host_of[original.number] + 1) % 3


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, HostsRun]]:
    """One real three-host run with a kill on a SQLite file, for the tampering tests below."""
    path = tmp_path_factory.mktemp("hosts") / "sim.db"
    journals = path.parent / "journals"
    journals.mkdir()
    dcache.open_db(path)
    try:
        result = run_hosts(SETTINGS, str(path), 3, 6, True, journals)
    finally:
        dcache.close_db()
    yield path, result


def failing(run: HostsRun) -> list[str]:
    return [check.name for check in check_run(run, SETTINGS.budget) if not check.ok]


@pytest.fixture
def checked(finished_run: tuple[Path, HostsRun]) -> Iterator[HostsRun]:
    """The run, with the store open; its journals are a copy each test may change."""
    path, result = finished_run
    dcache.open_db(path)
    try:
        assert failing(result) == []
        yield copy.deepcopy(result)
    finally:
        dcache.close_db()


def a_record(run: HostsRun, kind: str, host: int = 0, **match: Any) -> dict[str, Any]:
    return next(
        r for r in run.journals[host] if r["k"] == kind and all(r.get(k) == v for k, v in match.items())
    )


CLAIMS_CHECK = "no target held by two runners at once; each attempt claimed once"
REQUEUES_CHECK = "every job finished, none failed by a requeue, and every requeue recorded"


@pytest.mark.slow
def test_a_double_claim_fails_the_check(checked: HostsRun) -> None:
    """Host 1 claimed a target just before host 0 did, though host 1 lived: the two held it at once."""
    claim = a_record(checked, "claim")
    checked.journals[1].append({**claim, "c": 10_000, "t": claim["t"] - 0.001})
    assert failing(checked) == [CLAIMS_CHECK]


@pytest.mark.slow
def test_attempts_the_journals_do_not_match_fail_the_check(checked: HostsRun) -> None:
    """A written target whose stored attempts (0) fall short of the claims its claimer journaled."""
    sql = "UPDATE batch_target SET attempts = ? WHERE job_id = ? AND idx = ?"
    job, idx, attempts = dcache.db.execute_sql(
        "SELECT job_id, idx, attempts FROM batch_target WHERE status = 'done' LIMIT 1"
    ).fetchone()
    dcache.db.execute_sql(sql, (0, job, idx))
    try:
        assert failing(checked) == [CLAIMS_CHECK]
    finally:
        dcache.db.execute_sql(sql, (attempts, job, idx))


@pytest.mark.slow
def test_a_target_written_by_another_host_than_its_claimer_fails_the_check(checked: HostsRun) -> None:
    """The result names host 1 where host 0 claimed it (same length, so every count still holds)."""
    job, idx = dcache.db.execute_sql(
        "SELECT job_id, idx FROM batch_target WHERE result LIKE '%\"host\": 0,%' LIMIT 1"
    ).fetchone()
    sql = "UPDATE batch_target SET result = replace(result, ?, ?) WHERE job_id = ? AND idx = ?"
    dcache.db.execute_sql(sql, ('"host": 0,', '"host": 1,', job, idx))
    try:
        assert failing(checked) == [
            "every target out of pending was claimed, and written once by its last claimer"
        ]
    finally:
        dcache.db.execute_sql(sql, ('"host": 1,', '"host": 0,', job, idx))
    assert failing(checked) == []


@pytest.mark.slow
def test_a_miscounted_job_fails_the_check(checked: HostsRun) -> None:
    job = dcache.db.execute_sql("SELECT id FROM batch_job WHERE nbytes > 0 LIMIT 1").fetchone()[0]
    dcache.db.execute_sql("UPDATE batch_job SET nbytes = nbytes + 1 WHERE id = ?", (job,))
    try:
        failed = failing(checked)
        assert "nbytes equals the UTF-8 bytes of each job's results" in failed
        assert "batch_nbytes() equals SUM(nbytes)" not in failed  # the trigger keeps the total
        assert "check_store() finds no violation" in failed
    finally:
        dcache.db.execute_sql("UPDATE batch_job SET nbytes = nbytes - 1 WHERE id = ?", (job,))


@pytest.mark.slow
def test_a_target_failed_stale_with_attempts_left_fails_the_check(checked: HostsRun) -> None:
    """A failed target given the requeue's reason: no runner wrote that, and MAX_ATTEMPTS allowed more."""
    job, idx, error = dcache.db.execute_sql(
        "SELECT job_id, idx, error FROM batch_target WHERE status = 'failed' LIMIT 1"
    ).fetchone()
    sql = "UPDATE batch_target SET error = ? WHERE job_id = ? AND idx = ?"
    dcache.db.execute_sql(sql, (STALE_REASON, job, idx))
    try:
        assert failing(checked) == [
            "every target out of pending was claimed, and written once by its last claimer",
            REQUEUES_CHECK,
        ]
    finally:
        dcache.db.execute_sql(sql, (error, job, idx))


@pytest.mark.slow
def test_requeues_the_keepers_did_not_record_fail_the_check(checked: HostsRun) -> None:
    """A stored target claimed by the killed host before its journaled claim (so claimed twice, once
    requeued), while no keeper's journal records a requeue."""
    assert checked.kill is not None
    job, idx = dcache.db.execute_sql("SELECT job_id, idx FROM batch_target LIMIT 1").fetchone()
    first = min(
        r["t"]
        for records in checked.journals.values()
        for r in records
        if r["k"] == "claim" and [job, idx] in r["got"]
    )
    extra = {"k": "claim", "c": 10_000, "t": first - 0.001, "lat": 0.0, "got": [[job, idx]]}
    checked.journals[checked.kill.host].append(extra)
    for records in checked.journals.values():
        records[:] = [r for r in records if r["k"] != "requeue"]
    sql = "UPDATE batch_target SET attempts = attempts + ? WHERE job_id = ? AND idx = ?"
    dcache.db.execute_sql(sql, (1, job, idx))
    try:
        assert failing(checked) == [REQUEUES_CHECK]
    finally:
        dcache.db.execute_sql(sql, (-1, job, idx))


@pytest.mark.slow
def test_a_job_lost_by_a_live_host_fails_the_check(checked: HostsRun) -> None:
    checked.journals[0].append({"k": "lost", "job": "x", "why": "deleted while this host held a claim"})
    assert failing(checked) == [REQUEUES_CHECK]


@pytest.mark.slow
def test_a_repeat_answered_with_another_id_fails_the_check(checked: HostsRun) -> None:
    hit = next(
        r for records in checked.journals.values() for r in records if r["k"] == "sub" and not r["new"]
    )
    hit["id"] = f"{checked.prefix}-99999"
    assert failing(checked) == ["every idempotent repeat answered with the same id"]


@pytest.mark.slow
def test_two_findable_jobs_of_one_key_fail_the_check(checked: HostsRun) -> None:
    """Two finished jobs given one (caller, key): any two, since the eviction may leave one job with a key."""
    rows = dcache.db.execute_sql(
        "SELECT id, caller, idem_key FROM batch_job WHERE status IN ('done', 'partial') ORDER BY id LIMIT 2"
    ).fetchall()
    assert len(rows) == 2
    sql = "UPDATE batch_job SET caller = ?, idem_key = ? WHERE id = ?"
    for job_id, _, _ in rows:
        dcache.db.execute_sql(sql, (rows[0][1], "tampered-key", job_id))
    try:
        assert failing(checked) == ["every idempotent repeat answered with the same id"]
    finally:
        for job_id, caller, key in rows:
            dcache.db.execute_sql(sql, (caller, key, job_id))


@pytest.mark.slow
def test_a_stale_after_too_short_fails_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With stale_after 0 every claim is stale at once: the keepers requeue claims that live hosts hold
    (their late writes are refused, ClaimLost), and the check says so (no host is killed here)."""
    argv = ["--hosts", "2", "--no-kill", "--jobs", "400", "--targets", "10", "--stale-after", "0s"]
    code, out, _ = run(capsys, "simulate", "--db", tmp_path / "sim.db", "--json", *argv)
    summary = json.loads(out)
    assert code == 1 and summary["ok"] is False and summary["kill"] is None
    assert summary["total"]["requeued"] > 0
    failed = [check["name"] for check in summary["invariants"] if not check["ok"]]
    assert failed[0] == CLAIMS_CHECK and set(failed) <= {CLAIMS_CHECK, REQUEUES_CHECK}


def test_hosts_need_a_store_processes_can_share(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "simulate", "--db", ":memory:", "--hosts", "2")
    assert (code, out) == (1, "")
    assert err == "sift: --hosts: several processes cannot share an in-memory store; name a file\n"


def test_human_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--hosts", "2", "--no-kill", "--jobs", "12", "--targets", "3"]
    code, out, _ = run(capsys, "simulate", "--db", tmp_path / "sim.db", *argv)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("Simulated 12 of 12 submissions on 2 hosts (2 API threads, 4 runner threads")
    assert [line.split()[0] for line in lines[2:11]] == [
        "store",
        "journals",
        "killed",
        "requeued",
        "submissions",
        "longest",
        "eviction",
        "bytes",
        "cores",
    ]
    assert lines[4].split(None, 1)[1] == "none (--no-kill, or a single host)"
    assert re.fullmatch(
        rf"  cores busy +[0-9.]+% of this machine's {os.cpu_count()} cores during the run .*", lines[10]
    )
    header = lines[12].split()
    assert header[:8] == [
        "host",
        "state",
        "seconds",
        "targets",
        "targets/s",
        "claims",
        "claims/s",
        "requeued",
    ]
    assert [line.split()[:2] for line in lines[13:15]] == [["0", "finished"], ["1", "finished"]]
    assert lines[15].split()[0] == "total"
    assert lines[-1] == "All invariants hold."


@pytest.mark.slow
def test_fetches_wait_the_network_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--fetch-ms: each fetch sleeps at least half the given time, so one runner thread's run lasts at least
    that long per target written (a run without the wait takes a few milliseconds per target)."""
    argv = ["--hosts", "1", "--workers", "1", "--jobs", "3", "--targets", "2", "--fetch-ms", "300"]
    code, out, _ = run(capsys, "simulate", "--db", tmp_path / "sim.db", "--json", *argv)
    summary = json.loads(out)
    assert (code, summary["ok"], summary["fetch_ms"]) == (0, True, 300)
    written = summary["total"]["targets_written"]
    assert written >= 3 and summary["seconds"] >= written * 0.150


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--fetch-ms", "20"], 1, "sift: --fetch-ms: only with --hosts\n"),
        (["--fetch-ms", "0"], 1, "sift: --fetch-ms: only with --hosts\n"),
        (["--stale-after", "10m"], 1, "sift: --stale-after: only with --hosts\n"),
        (["--stale-after", "5s"], 1, "sift: --stale-after: only with --hosts\n"),  # the default, given
        (["--no-kill"], 1, "sift: --no-kill: only with --hosts\n"),
        (["--stale-after", "soon"], 1, "sift: --stale-after: 'soon' is not a duration"),  # parsed first
        (["--hosts", "2", "--fetch-ms", "-1"], 2, "argument --fetch-ms: must be a whole number from 0"),
        (["--hosts", "2", "--fetch-ms", "0.5"], 2, "argument --fetch-ms: must be a whole number from 0"),
    ],
)
def test_host_options_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    """Without --hosts no host fetches, is killed or is requeued, so --fetch-ms, --no-kill and --stale-after
    would change nothing: refused, even at their defaults, as are values that are not whole milliseconds;
    no store is made either way."""
    got, out, err = run(capsys, "simulate", "--db", tmp_path / "sim.db", *argv)
    assert (got, out) == (code, "")
    assert message in err
    assert list(tmp_path.iterdir()) == []


def test_a_host_whose_thread_cannot_connect_says_why_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every thread of a host opens its connection before the host is ready: the first that fails is what
    the host reports, the others stop without work, and the host does not wait for the coordinator."""
    path = tmp_path / "sim.db"
    dcache.open_db(path)
    calls = iter(range(1_000))
    real = dcache.batch_nbytes

    def first_fails() -> int:
        if next(calls) == 0:
            raise dcache.StoreUnavailable("database: too many connections (simulated)")
        return real()

    monkeypatch.setattr(dcache, "batch_nbytes", first_fails)
    journal = str(tmp_path / "host-0.jsonl")
    config = HostConfig(str(path), journal, 0, "p", SETTINGS, 6, tuple(plan(SETTINGS)[:4]))
    ours, theirs = multiprocessing.Pipe()
    Host(config).serve(theirs)  # returns: it waits for no "go"
    kind, host, errors = ours.recv()
    assert (kind, host, len(errors)) == ("failed", 0, 1)
    assert errors[0].strip().endswith("StoreUnavailable: database: too many connections (simulated)")
    assert [r["k"] for r in read_journal(Path(journal))] == ["error"]
    assert dcache.db.is_closed()


def test_a_submission_is_journaled_at_the_start_of_its_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another host may claim a job's targets before the submitting call returns: the submission's record
    holds the call's start, so in the journals merged by time every claim of the job comes after it."""
    path = tmp_path / "sim.db"
    dcache.open_db(path)
    journal = str(tmp_path / "host-0.jsonl")
    spec = plan(SETTINGS)[0]
    host = Host(HostConfig(str(path), journal, 0, "p", SETTINGS, 6, (spec,)))
    real = host.submit
    called: list[float] = []

    def submit(submitted: JobSpec) -> tuple[str, bool]:
        called.append(time.monotonic())
        answered = real(submitted)
        host.stop.set()  # the API thread records the answer, then stops instead of polling the job
        return answered

    monkeypatch.setattr(host, "submit", submit)
    try:
        host.api([spec], 1)
    finally:
        dcache.close_db()
    (record,) = [r for r in read_journal(Path(journal)) if r["k"] == "sub"]
    assert record["new"] and record["t"] <= called[0]


def test_a_host_that_dies_before_it_is_ready_stops_the_run_at_once(tmp_path: Path) -> None:
    """The coordinator holds no copy of a host's end of the pipe: a host that dies is seen at once."""
    missing = str(tmp_path / "no-such-directory" / "sim.db")
    with pytest.raises(CommandError, match=r"^host 0 did not start: exit status 1$"):
        run_hosts(SETTINGS, missing, 1, 6, False, tmp_path)


# -- The flood workload ----------------------------------------------------------------------------------

#: Two hosts, none killed; four flood jobs of 150 targets, then one small job from each small caller.
FLOOD = [
    *("--hosts", "2", "--no-kill", "--workload", "flood", "--jobs", "8", "--targets", "150"),
    *("--workers", "2", "--budget", "1GB"),
]


def flood_summary(capsys: pytest.CaptureFixture[str], target: str, *extra: str) -> dict[str, Any]:
    code, out, err = run(capsys, "simulate", "--db", target, "--json", *FLOOD, *extra)
    summary: dict[str, Any] = json.loads(out)
    failed = [check for check in summary["invariants"] if not check["ok"]]
    assert (code, failed, err) == (0, [], "")
    rows = summary["fairness"]["callers"]
    assert [row["caller"] for row in rows] == ["flood", "small-0", "small-1", "small-2", "small-3"]
    assert all(row["first_result_s"] is not None for row in rows)
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("store_target", BACKENDS, indirect=True)
def test_flood_with_a_per_host_limit(store_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--per-host 2 across two host processes: the sampler never saw a host above 2 running targets (the
    end check), and the hot hosts were seen at the limit."""
    summary = flood_summary(capsys, store_target, "--per-host", "2")
    fairness = summary["fairness"]
    assert fairness["claim"] == {"per_host": 2}
    names = [check["name"] for check in summary["invariants"]]
    assert "no host ever had more than 2 targets running (sampled)" in names
    assert fairness["busiest_host_peak"] <= 2 and fairness["host_peaks_counted"].startswith("sampled")
    assert max(fairness["host_peaks"][f"hot-{n}.example"] for n in range(3)) == 2


@pytest.mark.slow
@pytest.mark.parametrize("store_target", BACKENDS, indirect=True)
def test_flood_oldest_first_makes_small_callers_wait(
    store_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Counted from the journals merged by time: with fair claiming a small caller's first target comes
    after fewer of the flood's targets than with oldest-first claiming, which hands out the older flood
    first."""
    fair = flood_summary(capsys, store_target)
    dcache.close_db()
    drop_store(store_target)
    oldest = flood_summary(capsys, store_target, "--oldest-first")
    assert oldest["fairness"]["claim"] == {"fair": False}

    def waits(summary: dict[str, Any]) -> list[int]:
        return sorted(row["flood_before_first"] for row in summary["fairness"]["callers"][1:])

    assert waits(fair)[len(waits(fair)) // 2] < waits(oldest)[len(waits(oldest)) // 2]


def drop_store(target: str) -> None:
    if target.startswith("postgresql"):
        drop_schema(target.rpartition("schema=")[2])
    else:
        for path in Path(target).parent.glob(f"{Path(target).name}*"):
            path.unlink()
