"""Run the shell transcripts of the docs again and write their output into the pages, so no transcript is
written by hand.

    python scripts/docs_transcripts.py           # rewrite every transcript
    python scripts/docs_transcripts.py --check   # exit 1 if one is not current (the tests run this)
    python scripts/docs_transcripts.py --check --slow   # the slow blocks too
    python scripts/docs_transcripts.py --fast    # rewrite every transcript but the slow ones

A transcript is a ``console`` block of docs/ after the comment
``<!-- generated: scripts/docs_transcripts.py [WORD ...] -->``. Its ``$ `` lines are run one after another
by one bash per block, with the ``sift`` of this Python; each command's standard output and error follow
it, and a blank line ends it.

The transcripts of one page share a session: a new directory (the commands' working directory) holding
a copy of the README and a link to the repository's ``scripts``, and the exported variables a block leaves
for the next. The words of a marker say
what the block needs first:

``init``
    ``sift init`` makes a new empty store ``sim.db`` there, and ``$SIFT_DB`` names it.
``demo``
    The demo store ``sift.db``: the 47 new jobs among the first 56 submissions of ``sift simulate``'s
    workload (seed 1), submitted, run and finished one at a time through the package's functions, on the
    fixed clock below, so that every run makes the same file.
``claims``
    Adds to ``sift.db`` a job of four targets whose runner ``dead-host:7`` died 20 minutes before the
    fixed clock holding three of them, one at its third attempt.
``mistakes``
    Another program (plain sqlite3) writes three mistakes into ``sift.db``: a job's ``targets_done`` one
    short, a job status ``archived``, and a job deleted without its targets.
``flood``
    ``flood.db``, a store in the middle of a flood: the flood workload's plan (one caller's 20 jobs of 500
    targets, then four small callers' jobs of 1 to 3 targets, seed 1) submitted, then eight claims of 4
    with the claim's defaults (fair across callers), on the fixed clock.
``old``
    ``old.db``, a store made without incremental auto-vacuum (the schema an older sift wrote), filled and
    then mostly swept, so that it holds free pages.
``clock``
    Every ``sift`` of the page's later blocks reads the fixed clock ``NOW`` (2026-11-29 12:00:00 UTC) as
    the time: ``demo``, ``claims`` and ``old`` set it too. The stores of those setups are written on that
    clock, so their dates and ages are the same on every run. (The ``sift`` on the transcripts' PATH is a
    small wrapper that sets the store's test clock, ``sift.dcache.clock.set_test_clock``, then runs
    ``sift.cli.main``; ``sift simulate --hosts`` needs the real clock and never runs under it.)
``pg=NAME``
    The block uses the PostgreSQL test server (``$SIFT_TEST_POSTGRES``, default
    ``postgresql://postgres@127.0.0.1:5432/test``): the schema ``NAME`` in its commands is run as a new
    schema of a name of its own (``NAME_<random hex>``), shown as ``NAME`` in the output, and dropped when
    the page is done, as is every ``sift_sim_*`` schema the output names (the schemas ``sift simulate``
    makes). Without a server answering, the block is left as it is, and the script says so (``--check``
    fails under ``CI=true``).
``slow``
    The block takes longer than the tests can spend on it (a minute, or many seconds of CPU): the script
    runs it again when it rewrites the pages (unless given ``--fast``), and ``--check`` leaves it out
    unless given ``--slow`` (``scripts/scale_sim.py``, ``scripts/pg_footprint.py`` and
    ``scripts/crash_trials.py``, which tests of their own run; together several minutes). The crash
    trials kill at random moments, so even masked their lines differ between runs: ``--check --slow``
    reports that block whenever they do.
``vary``
    The block's counts differ from run to run (``sift simulate``'s threads interleave differently):
    ``--check`` compares it with every number masked.

What the output shows differently from what the commands printed: the session's directory is shown as
``/tmp/demo``, and its ``tmp`` subdirectory (``$TMPDIR`` of the commands) as ``/tmp``.

What ``--check`` masks, in every block: the random part of the names ``sift-simulate-*`` and
``sift-simulate-journals-*`` (the temporary directories ``sift simulate`` makes) and of ``sift_sim_*`` (the
schemas it makes, named by date, time and pid); in ``vary`` blocks, every number too (durations, rates and
counts), the units of a span of time (``2h 3m``, ``58m 30s``, ``29m``), the plural ``s`` of the word after a
number (``1 job``, ``2 jobs``; ``1 in-flight job``, ``2 in-flight jobs``), and the width of every run of
spaces and tabs (a table's columns follow its numbers). Nothing else: everything else must be as the page
shows it. In write mode, a block that differs only in what is masked is left as it is.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import re
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SCRIPT = "scripts/docs_transcripts.py"
BLOCK = re.compile(
    r"<!-- generated: scripts/docs_transcripts\.py((?: [\w=-]+)*) -->\n```console\n(.*?)```\n", re.S
)
#: The fixed clock of the ``clock`` word: 2026-11-29 12:00:00 UTC.
NOW = 1_795_953_600
SHOWN_DIR = "/tmp/demo"
SHOWN_TMP = "/tmp"
PG_URL = os.environ.get("SIFT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
#: The random parts of names that differ on every run, masked by --check.
RANDOM_NAMES = [
    (re.compile(r"sift-simulate-journals-[a-z0-9_]+"), "sift-simulate-journals-*"),
    (re.compile(r"sift-simulate-[a-z0-9_]{8}\b"), "sift-simulate-*"),
    (re.compile(r"sift_sim_\d{8}_\d{6}_\d+"), "sift_sim_*"),
]
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
SIM_SCHEMA = re.compile(r"\bsift_sim_\d{8}_\d{6}_\d+\b")
SEPARATOR = "__sift_docs_transcript_" + secrets.token_hex(8) + "__"

# The ``sift`` of the transcripts: this Python's command, on the fixed clock when $SIFT_DOCS_NOW is set.
SHIM = """#!{python}
import os, sys
from sift.cli import main
if __name__ == "__main__":  # simulate --hosts starts its hosts by spawn, which imports this file again
    if os.environ.get("SIFT_DOCS_NOW"):
        from sift.dcache import clock
        clock.set_test_clock(lambda: int(os.environ["SIFT_DOCS_NOW"]))
    sys.argv[0] = "sift"
    sys.exit(main())
"""


def commands(transcript: str) -> list[str]:
    return [line[2:] for line in transcript.splitlines() if line.startswith("$ ")]


def masked(text: str, vary: bool) -> str:
    for pattern, shown in RANDOM_NAMES:
        text = pattern.sub(shown, text)
    if not vary:
        return text
    text = re.sub(r"\bN[dhms](?: N[dhms])*\b", "N<span>", NUMBER.sub("N", text))  # "2h 3m", "58m 30s", "29m"
    # "1 job", "2 jobs"; "1 in-flight job", "2 in-flight jobs"
    text = re.sub(r"\bN ((?:[\w-]+ )?)(\w+?)s\b", r"N \1\2", text)
    return re.sub(r"[ \t]+", " ", text)


# -- the setups (each runs in a process of its own: the store is the process's one database) ------------


def setup_demo(where: Path) -> None:
    """The demo store: the simulate workload's first submissions, run one at a time on the fixed clock."""
    from sift import dcache
    from sift.cli.simulation.workload import (
        ERRORS,
        FAIL_P,
        Settings,
        corpus,
        envelope,
        final_status,
        plan,
        submission,
        target_urls,
    )

    rng = random.Random(1)
    text = corpus(1)
    dcache.open_db(where / "sift.db")
    specs = [spec for spec in plan(Settings(jobs=56, seed=1)) if not spec.repeat]
    now = NOW - 60 * 60
    for spec in specs:
        job_id = f"demo-{spec.number:05d}"
        job, targets = submission(spec, job_id, now)
        dcache.create_batch_job(job, targets)
        dcache.set_batch_job_status(job_id, dcache.JobStatus.RUNNING, now=now)
        failed = 0
        for idx, url in enumerate(target_urls(spec)):
            now += 5
            if rng.random() < FAIL_P:
                failed += 1
                error, hint = ERRORS[rng.randrange(len(ERRORS))]
                dcache.update_batch_target(
                    job_id, idx, dcache.TargetStatus.FAILED, error=error, hint=hint, now=now
                )
            else:
                result = envelope(rng, text, url)
                dcache.update_batch_target(job_id, idx, dcache.TargetStatus.DONE, result=result, now=now)
        status, error = final_status(failed, spec.targets)
        dcache.set_batch_job_status(job_id, status, error, now=now)
    dcache.close_db()


def setup_claims(where: Path) -> None:
    """A job whose runner died 20 minutes ago holding three of its four targets, one at its third attempt."""
    from sift import dcache

    dcache.open_db(where / "sift.db")
    then = NOW - 20 * 60
    job = dcache.BatchJob(
        id="demo-claimed",
        caller="crawler-eu",
        caller_class="fleet",
        idem_key="",
        status=dcache.JobStatus.QUEUED,
        targets_total=4,
        created_at=then,
        lease=then,
    )
    urls = [f"https://crawler-eu.example/page/claimed/{idx}" for idx in range(4)]
    dcache.create_batch_job(
        job, [dcache.BatchTarget(idx=idx, url=url, options="{}") for idx, url in enumerate(urls)]
    )
    dcache.claim_batch_targets(3, runner="dead-host:7", now=then)
    dcache.close_db()
    # Two earlier runners died holding target 2: it is at its third attempt.
    with closing(sqlite3.connect(where / "sift.db")) as conn, conn:
        conn.execute("UPDATE batch_target SET attempts = 3 WHERE job_id = 'demo-claimed' AND idx = 2")


def setup_mistakes(where: Path) -> None:
    """Three mistakes another program writes: a count one short, a status sift does not know, an orphan."""
    with closing(sqlite3.connect(where / "sift.db")) as conn, conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM batch_job WHERE targets_done > 2 ORDER BY id")]
        conn.execute("UPDATE batch_job SET targets_done = targets_done - 1 WHERE id = ?", (ids[0],))
        conn.execute("UPDATE batch_job SET status = 'archived' WHERE id = ?", (ids[1],))
        conn.execute("DELETE FROM batch_job WHERE id = ?", (ids[2],))


def setup_flood(where: Path) -> None:
    """A store in the middle of a flood: the flood plan submitted, then eight fair claims of 4."""
    from sift import dcache
    from sift.cli.simulation.workload import Settings, plan, submission

    dcache.open_db(where / "flood.db")
    now = NOW - 10 * 60
    for spec in plan(Settings(workload="flood", jobs=40, targets=500, seed=1)):
        job, targets = submission(spec, f"flood-{spec.number:05d}", now)
        dcache.create_batch_job(job, targets)
        now += 1
    for n in range(8):
        dcache.claim_batch_targets(4, runner=f"runner-{n % 2}", now=now)
    dcache.close_db()


def setup_old(where: Path) -> None:
    """A store an older sift made (no incremental auto-vacuum), filled, then most of it swept."""
    from sift import dcache
    from sift.dcache.backends.sqlite.schema import BASE_SCHEMA

    path = where / "old.db"
    with closing(sqlite3.connect(path)) as old:
        old.execute("PRAGMA journal_mode = wal")
        for statement in BASE_SCHEMA:
            old.execute(statement)
    dcache.open_db(path)
    for n in range(60):
        job_id = f"old-{n:03d}"
        lease = NOW - 2 * 24 * 3600 + n * 60 if n < 54 else NOW - 3600 + n
        job = dcache.BatchJob(
            id=job_id,
            caller="crawler-eu",
            caller_class="fleet",
            idem_key="",
            status=dcache.JobStatus.QUEUED,
            targets_total=10,
            created_at=lease,
            lease=lease,
        )
        targets = [
            dcache.BatchTarget(idx=i, url=f"https://crawler-eu.example/old/{n}/{i}", options="{}")
            for i in range(10)
        ]
        dcache.create_batch_job(job, targets)
        for idx in range(10):
            dcache.update_batch_target(job_id, idx, dcache.TargetStatus.DONE, result="r" * 3000, now=lease)
        dcache.set_batch_job_status(job_id, dcache.JobStatus.DONE, now=lease)
    dcache.sweep_batch(24 * 3600, now=NOW)
    dcache.close_db()


SETUPS: dict[str, Callable[[Path], None]] = {
    "demo": setup_demo,
    "claims": setup_claims,
    "mistakes": setup_mistakes,
    "old": setup_old,
    "flood": setup_flood,
}
CLOCKED = {"demo", "claims", "old", "flood", "clock"}
WORDS = {*SETUPS, "init", "clock", "vary", "slow"}


# -- running a page's transcripts ---------------------------------------------------------------------


@dataclass
class Session:
    """One page's directory, its exported variables, and the PostgreSQL schemas it used."""

    where: Path
    env: dict[str, str]
    state: Path
    schemas: set[str] = field(default_factory=set)

    def shown(self, text: str) -> str:
        text = text.replace(str(self.where / "tmp"), SHOWN_TMP)
        return text.replace(str(self.where), SHOWN_DIR)


def postgres_answers() -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    try:
        with psycopg.connect(PG_URL, connect_timeout=5):
            return True
    except psycopg.Error:
        return False


def drop_schemas(names: set[str]) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for name in sorted(names):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def run_block(session: Session, words: list[str], lines: list[str]) -> str:
    """The transcript of ``lines`` after the setups ``words`` name, in the page's session."""
    for word in words:
        if word in SETUPS:
            subprocess.run(
                [sys.executable, __file__, "--setup", word, str(session.where)], check=True, env=session.env
            )
        if word == "init":
            subprocess.run(
                ["sift", "init"], cwd=session.where, env=session.env, check=True, capture_output=True
            )
            session.env["SIFT_DB"] = "sim.db"
        if word in CLOCKED:
            session.env["SIFT_DOCS_NOW"] = str(NOW)
    renames: dict[str, str] = {}
    for word in words:
        if word.startswith("pg="):
            shown = word[3:]
            renames[shown] = f"{shown}_{secrets.token_hex(4)}"
            session.schemas.add(renames[shown])
    script = ["exec 2>&1", f"source {session.state} 2>/dev/null || true"]
    for line in lines:
        for shown, real in renames.items():
            line = re.sub(rf"\b{shown}\b", real, line)
        script += [line, f"printf '%s\\n' {SEPARATOR}"]
    script.append(f"export -p > {session.state}")
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=session.where,
        env=session.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    outputs = done.stdout.split(f"{SEPARATOR}\n")[: len(lines)]
    out: list[str] = []
    for line, output in zip(lines, outputs, strict=True):
        if output and not output.endswith("\n"):
            output += "\n"
        for shown, real in renames.items():
            output = output.replace(real, shown)
        session.schemas |= set(SIM_SCHEMA.findall(output))
        out.append(f"$ {line}\n{session.shown(output)}")
    return "\n".join(out)


def regenerate(page: Path, text: str, pg: bool, slow: bool) -> tuple[str, list[str]]:
    """The page with its transcripts run again (a block that differs only in what is masked kept as it
    is), and the notes of what could not run."""
    notes: list[str] = []
    bin_dir = str(Path(sys.executable).parent)
    with tempfile.TemporaryDirectory(prefix="sift-docs-") as name:
        where = Path(name).resolve()
        (where / "bin").mkdir()
        (where / "tmp").mkdir()
        shim = where / "bin" / "sift"
        shim.write_text(SHIM.format(python=sys.executable), encoding="utf-8")
        shim.chmod(0o755)
        shutil.copy(ROOT / "README.md", where)
        (where / "scripts").symlink_to(ROOT / "scripts")
        env = {
            **os.environ,
            "PATH": f"{where / 'bin'}{os.pathsep}{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "COLUMNS": "100",
            "LC_ALL": "C.UTF-8",
            "TZ": "UTC",
            "TMPDIR": str(where / "tmp"),
            "PYTHONPATH": str(ROOT),
        }
        for variable in ("SIFT_DB", "SIFT_DOCS_NOW"):
            env.pop(variable, None)
        session = Session(where, env, where / "bin" / "state.sh")

        def one(match: re.Match[str]) -> str:
            words = match.group(1).split()
            unknown = [w for w in words if w not in WORDS and not w.startswith("pg=")]
            if unknown:
                raise SystemExit(f"{page}: unknown words {unknown} in a transcript's marker")
            old = match.group(2)
            if "slow" in words and not slow:
                return match.group(0)
            if any(w.startswith("pg=") for w in words) and not pg:
                notes.append(f"{page}: no PostgreSQL server at {PG_URL}; a transcript was not run")
                return match.group(0)
            new = run_block(session, words, commands(old))
            if masked(new, "vary" in words) == masked(old, "vary" in words):
                new = old
            return f"<!-- generated: {SCRIPT}{match.group(1)} -->\n```console\n{new}```\n"

        try:
            return BLOCK.sub(one, text), notes
        finally:
            if session.schemas and pg:
                drop_schemas(session.schemas)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a transcript is not current")
    parser.add_argument("--slow", action="store_true", help="with --check, run the slow blocks too")
    parser.add_argument("--fast", action="store_true", help="rewrite the pages, the slow blocks left out")
    parser.add_argument("--setup", nargs=2, metavar=("NAME", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.setup:
        SETUPS[args.setup[0]](Path(args.setup[1]))
        return 0
    pages = [p for p in sorted(DOCS.rglob("*.md")) if BLOCK.search(p.read_text(encoding="utf-8"))]
    pg = postgres_answers()
    slow = args.slow or not (args.check or args.fast)
    stale: list[Path] = []
    notes: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        texts = {page: page.read_text(encoding="utf-8") for page in pages}
        results = dict(zip(pages, pool.map(lambda p: regenerate(p, texts[p], pg, slow), pages), strict=True))
    for page in pages:
        new, page_notes = results[page]
        notes += page_notes
        if new != texts[page]:
            stale.append(page)
            if not args.check:
                page.write_text(new, encoding="utf-8")
    for note in notes:
        print(note, file=sys.stderr)
    if args.check and stale:
        for page in stale:
            print(f"{page}: a transcript is not current: run python {SCRIPT}", file=sys.stderr)
        return 1
    if args.check and notes and os.environ.get("CI") == "true":
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
