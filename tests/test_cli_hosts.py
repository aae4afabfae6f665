"""``sift hosts`` (the busiest hosts with their policy, next due time and back-off; ``--set``), ``sift pause``
and ``sift resume``, and what ``sift stats`` shows of them; on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run
from helpers import make_job, snapshot

from sift import dcache


def hosted_job(job_id: str, caller: str, urls: list[str]) -> None:
    targets = [dcache.BatchTarget(idx=i, url=url, options="{}") for i, url in enumerate(urls)]
    dcache.create_batch_job(make_job(job_id, caller=caller, targets_total=len(urls)), targets)


def test_hosts_lists_the_busiest_with_their_policy(
    shared_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    hosted_job("j", "alice", ["https://a.example/1", "https://a.example/2", "https://B.example/1"])
    dcache.set_host_policy("a.example", max_running=2, min_interval=0.5)
    dcache.back_off_host("c.example", dcache.unix_now() + 600)
    dcache.claim_batch_targets(10, runner="r")
    code, out, err = run(capsys, "--db", shared_store, "hosts", "--json")
    assert (code, err) == (0, "")
    rows = json.loads(out)["hosts"]
    assert [(r["host"], r["running"], r["max_running"], r["min_interval"]) for r in rows] == [
        ("a.example", 1, 2, 0.5),  # paced: one a claim
        ("b.example", 1, None, None),
        ("c.example", 0, None, None),
    ]
    assert rows[0]["next_due"] is not None and rows[2]["backed_off_until"] is not None
    code, out, err = run(capsys, "--db", shared_store, "hosts")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["host", "running", "policy", "next", "due", "backed", "off", "until"]
    assert lines[1].startswith("a.example") and "max 2 running, 0.5s apart" in lines[1]
    assert lines[3].startswith("c.example") and lines[3].endswith(" UTC")


def test_hosts_set_stores_a_policy_under_the_site_name(
    shared_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--db", shared_store, "hosts", "--set", "0x7f000001", "--max-running", "1")
    assert (code, out, err) == (0, "127.0.0.1: max 1 running\n", "")
    code, out, err = run(
        capsys, "--db", shared_store, "hosts", "--set", "*", "--min-interval", "1.5", "--json"
    )
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "host": "*",
        "max_running": None,
        "min_interval": 1.5,
        "next_due": None,
        "backed_off_until": None,
    }
    dcache.open_db(shared_store)
    assert [(p.host, p.max_running, p.min_interval) for p in dcache.host_policies()] == [
        ("*", None, 1.5),
        ("127.0.0.1", 1, None),
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["hosts", "--set", "https://a.example/x", "--max-running", "1"], "sift: host: must be a host name"),
        (["hosts", "--set", "a.example", "--min-interval", "-1"], "sift: min_interval: must be seconds"),
        (["hosts", "--max-running", "1"], "sift: --set: --max-running and --min-interval need --set HOST"),
        (["hosts", "--release", "a.example", "--set", "b.example"], "sift: --release: --release and --set"),
        (["hosts", "--release", "*"], "sift: host: "),
        (["hosts", "--release", "https://a.example/"], "sift: host: must be a host name"),
        (["pause", "--job", "nope"], "sift: job_id: no job 'nope'"),
        (["resume", "--caller", ""], "sift: caller: must not be empty"),
    ],
)
def test_bad_input_exits_1_naming_the_field_and_changes_nothing(
    shared_store: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    hosted_job("j", "alice", ["https://a.example/1"])
    dcache.set_host_policy("a.example", max_running=3)
    dcache.pause_caller("bob")
    before = snapshot()
    code, out, err = run(capsys, "--db", shared_store, *argv)
    assert (code, out) == (1, "") and err.startswith(message), err
    dcache.open_db(shared_store)
    assert snapshot() == before


def test_hosts_release_ends_a_back_off(shared_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    hosted_job("j", "alice", ["https://a.example/1"])
    dcache.back_off_host("a.example", dcache.unix_now() + 600)
    db = shared_store
    assert run(capsys, "--db", db, "hosts", "--release", "A.Example") == (
        0,
        "A.Example: back-off released\n",
        "",
    )
    assert run(capsys, "--db", db, "hosts", "--release", "a.example") == (
        0,
        "a.example was not backed off; left unchanged\n",
        "",
    )
    code, out, err = run(capsys, "--db", db, "hosts", "--release", "a.example", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {"host": "a.example", "action": "release", "changed": False}
    dcache.open_db(db)
    assert dcache.backed_off_hosts() == []
    assert [t.url for t in dcache.claim_batch_targets(10, runner="r")] == ["https://a.example/1"]


def test_a_back_off_that_has_ended_is_not_listed(
    shared_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row whose back-off ended by itself holds nothing now: ``sift hosts`` lists the hosts whose row holds
    something (a setting, a due time to come, a back-off in force), as ``sift stats`` counts them, and
    ``--release`` says no back-off was in force, changing nothing."""
    ended = dcache.unix_now() - 60
    dcache.back_off_host("a.example", ended, now=ended - 10)
    dcache.back_off_host("b.example", dcache.unix_now() + 600)
    assert [p.host for p in dcache.host_policies()] == ["a.example", "b.example"]
    assert dcache.backed_off_hosts() == ["b.example"]
    db = shared_store
    code, out, err = run(capsys, "--db", db, "hosts", "--json")
    assert (code, err) == (0, "")
    assert [(r["host"], r["backed_off_until"] is not None) for r in json.loads(out)["hosts"]] == [
        ("b.example", True)
    ]
    code, out, err = run(capsys, "--db", db, "hosts")
    assert (code, err) == (0, "")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["b.example"]
    dcache.open_db(db)
    before = snapshot()
    assert run(capsys, "--db", db, "hosts", "--release", "a.example") == (
        0,
        "a.example was not backed off; left unchanged\n",
        "",
    )
    dcache.open_db(db)
    assert snapshot() == before


def test_pause_and_resume_a_job_and_a_caller(shared_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    hosted_job("j", "alice", ["https://a.example/1", "https://a.example/2"])
    db = shared_store
    assert run(capsys, "--db", db, "pause", "--job", "j") == (0, "job j paused\n", "")
    assert run(capsys, "--db", db, "pause", "--job", "j") == (
        0,
        "job j was already paused; left unchanged\n",
        "",
    )
    assert run(capsys, "--db", db, "pause", "--caller", "bob") == (0, "caller bob paused\n", "")
    code, out, err = run(capsys, "--db", db, "stats", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["paused"] == {"jobs": ["j"], "callers": ["bob"], "backed_off_hosts": []}
    code, out, err = run(capsys, "--db", db, "stats")
    assert (code, err) == (0, "")
    assert "Paused        1 jobs, 1 callers; 0 hosts backed off (sift hosts)" in out.splitlines()
    dcache.open_db(db)
    assert dcache.claim_batch_targets(10, runner="r") == []
    assert run(capsys, "--db", db, "resume", "--job", "j", "--json")[1] == (
        '{\n  "job": "j",\n  "action": "resume",\n  "changed": true\n}\n'
    )
    assert run(capsys, "--db", db, "resume", "--caller", "bob") == (0, "caller bob resumed\n", "")
    assert run(capsys, "--db", db, "resume", "--caller", "bob") == (
        0,
        "caller bob was not paused; left unchanged\n",
        "",
    )
    dcache.open_db(db)
    assert len(dcache.claim_batch_targets(10, runner="r")) == 2


def test_pause_needs_one_job_or_one_caller(shared_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--db", shared_store, "pause")
    assert (code, out) == (2, "") and "one of the arguments --job --caller is required" in err
    code, out, err = run(capsys, "--db", shared_store, "pause", "--job", "j", "--caller", "bob")
    assert (code, out) == (2, "") and "not allowed with argument" in err
