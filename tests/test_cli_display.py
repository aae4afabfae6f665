"""What the ``sift`` command shows of a store's contents: any time the store accepts prints (as its number
when no date can show it), text from the store cannot steer the terminal (``--json`` stays exact), and
text-mode ``sift show`` reads only what it prints, a page of targets at a time; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run, sift_script
from helpers import make_job, make_targets

from sift import dcache
from sift.cli.commands.show import COLUMNS
from sift.cli.report import format_age, format_time, table, terminal_safe, utc_text

#: The last second a date can show, and values past it the store accepts: the next second, a unix time in
#: milliseconds (the year 55,840), the largest 64-bit value.
LAST_DATE = 253_402_300_799
UNDISPLAYABLE = [LAST_DATE + 1, 1_700_000_000_000, 2**63 - 1]

ESC, BEL, BS, DEL, CSI = "\x1b", "\x07", "\x08", "\x7f", "\x9b"
RLO, LRI, PDI = "\u202e", "\u2066", "\u2069"

#: Characters no text output may hold but the newlines that end its lines.
UNSAFE = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]}

#: Every text field the store keeps for a job and its target, each carrying terminal controls.
EVIL = {
    "id": f"job{ESC}]0;title{BEL}{RLO}",
    "caller": f"eve{ESC}[2K{ESC}[1A",
    "idem_key": f"key{CSI}2J{LRI}x{PDI}",
    "job_error": f"gone{ESC}[8mhidden{ESC}[0m{BS * 4}{DEL}\nsecond line",
    "url": f"https://ok/{ESC}]52;c;ZWNobyBwd25lZAo={BEL}",
    "error": f"boom{ESC}[8m{BS * 4}\r",
    "hint": f"see{RLO}txt.exe",
}


@pytest.fixture(params=["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store that does not exist yet: a SQLite file (WAL), or a PostgreSQL schema of the test's own."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_target"))
    return str(tmp_path / "store.db")


def sift(target: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """The installed ``sift`` command, run on ``target``."""
    return subprocess.run(
        [str(sift_script()), *argv, "--db", target], capture_output=True, text=True, timeout=300, check=False
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    return proc.stdout


# -- Times ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("unix", "shown"),
    [
        (0, "1970-01-01 00:00:00 UTC"),
        (1_735_689_600, "2025-01-01 00:00:00 UTC"),
        (LAST_DATE, "9999-12-31 23:59:59 UTC"),
        *[(unix, str(unix)) for unix in UNDISPLAYABLE],
        (-62_135_596_801, "-62135596801"),  # before the year 1: a sweep's cutoff can be negative
    ],
)
def test_a_time_prints_as_a_date_or_else_as_its_number(unix: int, shown: str) -> None:
    assert format_time(unix) == shown
    assert utc_text(unix) == (None if shown.lstrip("-").isdigit() else shown)


@pytest.mark.parametrize("unix", [0, *UNDISPLAYABLE])
def test_an_age_is_a_span_for_any_time_the_store_accepts(unix: int) -> None:
    age = format_age(unix, 1_735_689_600)
    assert re.fullmatch(r"(in )?\d+[dhms]( \d+[dhms])?( ago)?", age), age


@pytest.mark.slow
@pytest.mark.parametrize("unix", UNDISPLAYABLE)
def test_the_commands_print_a_time_past_year_9999_as_its_number(target: str, unix: int) -> None:
    dcache.open_db(target)
    try:
        dcache.create_batch_job(
            make_job("now", targets_total=1, created_at=1_000, lease=1_000), make_targets(1)
        )
        dcache.create_batch_job(
            make_job("far", targets_total=1, created_at=unix, lease=unix), make_targets(1)
        )
    finally:
        dcache.close_db()
    jobs = ok(sift(target, "jobs")).splitlines()
    assert jobs[1].split()[0] == "far" and str(unix) in jobs[1].split()
    show = ok(sift(target, "show", "far")).splitlines()
    assert [line.split()[:2] for line in show[6:8]] == [["Created", str(unix)], ["Lease", str(unix)]]
    stats = ok(sift(target, "stats"))
    assert re.search(rf"^Newest lease +{unix}  \(in \d+d( \d+h)?\)$", stats, re.MULTILINE), stats
    assert re.search(r"^Oldest lease +1970-01-01 00:16:40 UTC  \(", stats, re.MULTILINE), stats
    report = json.loads(ok(sift(target, "stats", "--json")))
    assert report["newest_lease"]["unix"] == unix and report["newest_lease"]["utc"] is None
    assert report["oldest_lease"]["utc"] == "1970-01-01 00:16:40 UTC"
    assert [job["created_at"] for job in json.loads(ok(sift(target, "jobs", "--json")))] == [unix, 1_000]


# -- Text from the store ----------------------------------------------------------------------------------


def store_evil(target: str) -> None:
    """One job whose every text field carries terminal controls: a failed target and a done one."""
    dcache.open_db(target)
    try:
        job = make_job(EVIL["id"], caller=EVIL["caller"], idem_key=EVIL["idem_key"], targets_total=2)
        dcache.create_batch_job(job, [*make_targets(1, url=EVIL["url"]), *make_targets(1, start=1)])
        dcache.update_batch_target(EVIL["id"], 0, "failed", error=EVIL["error"], hint=EVIL["hint"], now=1_000)
        dcache.update_batch_target(EVIL["id"], 1, "done", result='{"ok":true}', now=1_000)
        dcache.set_batch_job_status(EVIL["id"], "failed", EVIL["job_error"], now=1_000)
    finally:
        dcache.close_db()


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"a{ESC}[2Kb", "a\\x1b[2Kb"),
        (f"{BEL}{BS}{DEL}{CSI}\x00\x9f", "\\x07\\x08\\x7f\\x9b\\x00\\x9f"),
        (f"{RLO}{LRI}{PDI}\u202a\u2067", "\\u202e\\u2066\\u2069\\u202a\\u2067"),
        ("one\ntwo\r\tthree", "one\\ntwo\\r three"),
        ("café 東京 🙂 \\x1b", "café 東京 🙂 \\x1b"),
    ],
)
def test_terminal_safe_escapes_what_could_steer_a_terminal(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs"],
        ["show", EVIL["id"]],
        ["sweep", "--ttl", "0s", "--dry-run"],
        ["evict", "--max-bytes", "0", "--dry-run"],
    ],
    ids=["jobs", "show", "sweep", "evict"],
)
def test_text_output_shows_controls_from_the_store_escaped(target: str, argv: list[str]) -> None:
    store_evil(target)
    out = ok(sift(target, *argv))
    assert not set(out) & (UNSAFE - {"\n"}), repr(out)
    assert terminal_safe(EVIL["id"]) in out and terminal_safe(EVIL["caller"]) in out
    if argv[0] == "show":
        assert "job\\x1b]0;title\\x07\\u202e" in out and "eve\\x1b[2K\\x1b[1A" in out
        for field in ("idem_key", "job_error", "url", "error", "hint"):
            assert terminal_safe(EVIL[field]) in out, field
        assert len(out.splitlines()) == 8 + 1 + 3  # the job, a blank line, the table's header and two rows


@pytest.mark.parametrize("argv", [["jobs", "--json"], ["show", EVIL["id"], "--json"]], ids=["jobs", "show"])
def test_json_output_holds_the_stored_text_exactly(target: str, argv: list[str]) -> None:
    store_evil(target)
    data = json.loads(ok(sift(target, *argv)))
    job = data[0] if argv[0] == "jobs" else data["job"]
    assert (job["id"], job["caller"], job["idem_key"], job["error"]) == (
        EVIL["id"],
        EVIL["caller"],
        EVIL["idem_key"],
        EVIL["job_error"],
    )
    if argv[0] == "show":
        row = data["targets"][0]
        assert (row["url"], row["error"], row["hint"]) == (EVIL["url"], EVIL["error"], EVIL["hint"])


# -- What text-mode show reads ----------------------------------------------------------------------------


def long_text(idx: int, width: int) -> str:
    """Text longer than a column shows, with controls and wide characters around the place it is cut."""
    return f"{idx}:" + "é" * (width - 6) + f"{ESC}[1m{RLO}東" * 3 + "x" * 1000


@pytest.mark.slow
@pytest.mark.parametrize("stored", [2_500, 1_000, 1])
def test_show_reads_only_the_columns_it_prints_a_page_at_a_time(
    target: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, stored: int
) -> None:
    big = json.dumps({"blob": "o" * 2_000})
    targets = make_targets(stored, options=big)
    for t in targets[::7]:
        t.url = long_text(t.idx, 60)
    dcache.open_db(target)
    try:
        dcache.create_batch_job(make_job("big", targets_total=stored), targets)
        for idx in range(0, stored, 3):
            result = json.dumps({"body": "r" * idx})
            hint = long_text(idx, 30) if idx % 2 else ""
            dcache.update_batch_target("big", idx, "done", result=result, hint=hint, now=1_000)
        for idx in range(1, stored, 3):
            dcache.update_batch_target("big", idx, "failed", error=long_text(idx, 40), now=1_000)
        every: list[dict[str, object]] = [
            {
                "idx": t.idx,
                "status": t.status,
                "url": t.url,
                "error": t.error,
                "hint": t.hint,
                "attempts": t.attempts,
                "runner": t.runner,
                "result_bytes": None if t.result is None else len(t.result.encode()),
            }
            for t in dcache.BatchTarget.select()
            .where(dcache.BatchTarget.job_id == "big")
            .order_by(dcache.BatchTarget.idx)
        ]
    finally:
        dcache.close_db()
    with caplog.at_level(logging.DEBUG, logger="peewee"):
        code, out, err = run(capsys, "show", "big", "--db", target)
    assert (code, err) == (0, "")
    # What a table of every target, each read whole, shows.
    assert out.splitlines()[9:] == table(every, COLUMNS)
    statements = [r.msg for r in caplog.records if r.name == "peewee" and isinstance(r.msg, tuple)]
    on_targets = [(sql, params) for sql, params in statements if '"batch_target"' in sql]
    assert on_targets
    for sql, params in on_targets:
        assert '"options"' not in sql, sql
        assert '"result"' not in re.sub(
            r'[\w_]+\((CAST\()?"t1"\."result"( AS BLOB\))?\) AS "result_bytes"', "", sql
        )
        if '"url"' in sql:  # a page of rows: a bounded LIMIT
            limit = re.search(r"LIMIT (\?|%s)$", sql)
            assert limit is not None and isinstance(params[-1], int) and 0 < params[-1] <= 1_000, sql
    pages = [sql for sql, _ in on_targets if '"url"' in sql]
    assert len(pages) >= 2 * -(-stored // 1_000)  # two passes over the pages: measure, then print


MEASURE = """
import contextlib, io, sys, tracemalloc
from sift.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(["show", "small", "--db", sys.argv[1]])  # imports every module the command uses
tracemalloc.start()
code = main(["show", "big", "--db", sys.argv[1]])
print(tracemalloc.get_traced_memory()[1], file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.slow
def test_show_holds_a_bounded_part_of_a_big_job_in_memory(target: str) -> None:
    count, size = 4_000, 20_000
    big = json.dumps({"blob": "o" * size})
    dcache.open_db(target)
    try:
        dcache.create_batch_job(make_job("small", targets_total=1), make_targets(1))
        dcache.create_batch_job(
            make_job("big", targets_total=count),
            (make_targets(1, start=i, options=big)[0] for i in range(count)),
        )
    finally:
        dcache.close_db()
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, target],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 8 + 1 + 1 + count
    peak = int(proc.stderr.strip().splitlines()[-1])
    # The options alone are 80 MB; the two passes hold a page of short cells and the lines printed.
    assert peak < count * size / 20, (
        f"peak {peak:,} bytes of Python objects for {count * size:,} bytes of options"
    )


def test_show_lists_a_target_a_foreign_writer_stored_below_idx_0(target: str) -> None:
    dcache.open_db(target)
    try:
        dcache.create_batch_job(make_job("j", targets_total=1), make_targets(1))
        columns = "(job_id, idx, url, options, status)"  # a foreign writer's SQL: the models refuse idx -1
        values = f"({dcache.db.param}, -1, {dcache.db.param}, '{{}}', {dcache.db.param})"
        params = ("j", "https://foreign/", "pending")
        dcache.db.execute_sql(f"INSERT INTO batch_target {columns} VALUES {values}", params)
    finally:
        dcache.close_db()
    rows = ok(sift(target, "show", "j")).splitlines()[10:]
    assert [row.split()[:4] for row in rows] == [  # idx, status, attempts, url (no runner: unclaimed)
        ["-1", "pending", "0", "https://foreign/"],
        ["0", "pending", "0", "https://example.com/0"],
    ]
