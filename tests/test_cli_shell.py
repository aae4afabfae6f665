"""``sift shell``: a Python console with the store open and the models, functions and ``db`` in scope,
fed commands on standard input."""

from __future__ import annotations

import importlib.util
import io
import os
import pty
import select
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import EXPECTED, dump, populate, run, sift_script

from sift import dcache


def shell(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, path: Path | str, script: str
) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(script))
    return run(capsys, "shell", "--db", path)


def test_models_functions_and_db_in_scope(
    store_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = "\n".join(
        [
            "print(BatchJob.select().count())",
            "print(BatchJob.select().where(BatchJob.status == JobStatus.DONE).get().id)",
            "print(batch_nbytes())",
            "print([t.idx for t in batch_targets('job-a')])",
            "print(db.execute_sql('SELECT COUNT(*) FROM batch_target').fetchone()[0])",
            "print(sorted(set(dcache.__all__) - set(globals())))",
            "print(db is dcache.db, db.is_closed())",
        ]
    )
    code, out, err = shell(capsys, monkeypatch, store_file, script + "\n")
    assert code == 0
    assert out.splitlines() == [
        "5",
        "job-a",
        str(sum(e.nbytes for e in EXPECTED.values())),
        "[0, 1, 2]",
        "10",
        "[]",
        "True False",
    ]
    banner = " ".join(err.split())
    assert banner.startswith(f"sift shell on {store_file}: 5 jobs, 582 bytes of results. In scope: db")
    for name in ("BatchJob", "BatchTarget", "JobStatus", "update_batch_target", "sweep_batch", "dcache"):
        assert name in banner
    assert "\n\n" not in err.strip()  # one paragraph


@pytest.fixture(params=["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The five jobs of :data:`EXPECTED` in a SQLite file, or in a PostgreSQL schema of the test's own."""
    target = (
        str(request.getfixturevalue("pg_target")) if request.param == "postgres" else str(tmp_path / "s.db")
    )
    populate(target)
    return target


#: The lines a Peewee user types: a grouped count (fn, SQL), a join (JOIN), a conditional sum (Case), a
#: result saved through the model and a refused target delete.
PEEWEE_SCRIPT = """\
T, J = BatchTarget, BatchJob
print(T.select(T.status, fn.COUNT(SQL('*'))).group_by(T.status).order_by(T.status).tuples()[:])
print(J.select(J.id, fn.COUNT(T.idx)).join(T, JOIN.LEFT_OUTER).group_by(J.id).order_by(J.id).tuples()[:])
print(T.select(fn.SUM(Case(None, [(T.status == 'done', 1)], 0))).scalar())
t = T.get((T.job_id == 'job-a') & (T.idx == 0))
t.result = 'changed by hand'
print(t.save())
try:
    T.delete().execute()
except ModelWriteRefused as e:
    print(type(e).__name__, e.field)

"""


def test_peewee_helpers_in_scope_and_writes_follow_the_rules(
    any_store: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = shell(capsys, monkeypatch, any_store, PEEWEE_SCRIPT)
    assert code == 0, err
    dcache.open_db(any_store)
    try:
        targets = {job_id: dcache.batch_targets(job_id) or [] for job_id in EXPECTED}
        statuses = sorted({t.status for ts in targets.values() for t in ts})
        count = {s: sum(t.status == s for ts in targets.values() for t in ts) for s in statuses}
        done = count.get("done", 0)
        assert out.splitlines() == [
            str([(s, count[s]) for s in statuses]),
            str([(job_id, len(targets[job_id])) for job_id in sorted(EXPECTED)]),
            str(done),
            "1",
            "ModelWriteRefused query",
        ]
        job = dcache.batch_job("job-a")
        assert job is not None
        assert job.nbytes == sum(len((t.result or "").encode()) for t in targets["job-a"])
        assert targets["job-a"][0].result == "changed by hand"
        assert dcache.check_store().ok
    finally:
        dcache.close_db()
    banner = " ".join(err.split())
    assert "Peewee's fn, JOIN, SQL, Case" in banner
    connections = "PostgreSQL, a pool of connections" if "://" in any_store else "SQLite, one connection"
    assert f"db (open: {connections}" in banner


def test_writes_from_the_shell_reach_the_file(
    store_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = shell(
        capsys, monkeypatch, store_file, "print(mark_in_flight_failed('from the shell', now=7))\n"
    )
    assert (code, out) == (0, "2\n")
    statuses = {row[0]: (row[4], row[5], row[9]) for row in dump(store_file)["batch_job"]}
    assert statuses["job-b"] == statuses["job-d"] == ("failed", "from the shell", 7)


def test_a_caught_error_does_not_end_a_script(
    store_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = "try:\n    touch_batch_job('nope')\nexcept JobNotFound as e:\n    print(e)\n\n"
    script += "print('still here')\n"
    code, out, err = shell(capsys, monkeypatch, store_file, script)
    assert code == 0
    assert out.splitlines() == ["job_id: no job 'nope'", "still here"]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("failing", "error"),
    [
        ("batch_job(1)", "InvalidBatchInput: job_id: must be a str, got int"),
        ("touch_batch_job('nope')", "JobNotFound: job_id: no job 'nope'"),
        ("1 +", "SyntaxError: invalid syntax"),
        ("for x in range(2):\n    print(x)\n    x / 0\n", "ZeroDivisionError: division by zero"),
    ],
)
def test_a_piped_script_stops_at_its_first_error(
    store_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    failing: str,
    error: str,
) -> None:
    """Like ``python - < script``: the traceback, exit status 1, and no line after the failing one runs."""
    script = f"print('before')\n{failing}\nmark_in_flight_failed('must not run')\nprint('after')\n"
    before = dump(store_file)
    code, out, err = shell(capsys, monkeypatch, store_file, script)
    assert code == 1
    assert out.splitlines()[0] == "before" and "after" not in out
    assert err.rstrip("\n").splitlines()[-1].endswith(error)
    assert dump(store_file) == before


@pytest.mark.parametrize(("line", "status"), [("exit()", 0), ("exit(3)", 3), ("raise SystemExit", 0)])
def test_exit_status(
    store_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    line: str,
    status: int,
) -> None:
    code, out, _ = shell(capsys, monkeypatch, store_file, f"print(1)\n{line}\nprint(2)\n")
    assert (code, out) == (status, "1\n")


def piped_console(store_file: Path, script: str) -> subprocess.CompletedProcess[str]:
    """The installed ``sift shell`` on ``store_file``, with ``script`` piped to it."""
    command = [str(sift_script()), "shell", "--db", str(store_file)]
    return subprocess.run(command, input=script, capture_output=True, text=True, timeout=60)


def test_the_console_script_with_piped_input(store_file: Path) -> None:
    proc = piped_console(
        store_file,
        "print(live_batch_jobs_total(), live_batch_jobs('bob'))\nprint(batch_job('job-c').error)\n",
    )
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == ["2 1", "every target failed"]
    assert proc.stderr.startswith("sift shell on ")
    assert "Traceback" not in proc.stderr


def test_piped_input_is_a_script_even_with_ipython_installed(
    store_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec

    def ipython_everywhere(name: str, *args: Any) -> Any:
        if name == "IPython":
            return object()  # never imported: piped input does not start IPython
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", ipython_everywhere)
    code, out, err = shell(capsys, monkeypatch, store_file, "print(1)\nbatch_job(1)\nprint(2)\n")
    assert (code, out) == (1, "1\n")
    assert err.rstrip("\n").splitlines()[-1].endswith("InvalidBatchInput: job_id: must be a str, got int")


def test_the_console_script_with_a_piped_script_that_raises(store_file: Path) -> None:
    proc = piped_console(
        store_file, "print(batch_job('job-c').error)\nbatch_targets('job-c', 'x')\nprint('after')\n"
    )
    assert proc.returncode == 1
    assert proc.stdout == "every target failed\n"
    assert "Traceback (most recent call last):" in proc.stderr
    assert proc.stderr.rstrip("\n").splitlines()[-1].startswith("TypeError: ")


def test_the_shell_closes_the_store(
    store_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shell(capsys, monkeypatch, store_file, "print(db.is_closed())\n")[1] == "False\n"
    assert dcache.db.is_closed()


class Terminal:
    """``sift shell`` with standard input, output and error on a pseudo-terminal, typed at like a user."""

    def __init__(self, path: Path, home: Path) -> None:
        self.master, slave = pty.openpty()
        env = dict(os.environ, HOME=str(home), TERM="xterm", COLUMNS="100", LINES="24")
        self.proc = subprocess.Popen(
            [str(sift_script()), "shell", "--db", str(path)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
        )
        os.close(slave)
        self.seen = b""
        self.pos = 0  # where the next wait_for starts looking

    def wait_for(self, text: bytes) -> None:
        """Read what the terminal shows until ``text`` appears after what was waited for before."""
        start = self.pos
        while text not in self.seen[start:]:
            ready, _, _ = select.select([self.master], [], [], 60)
            assert ready, f"{text!r} never appeared; the terminal shows {self.seen[start:]!r}"
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: the shell closed the terminal
                chunk = b""
            assert chunk, f"{text!r} never appeared; the terminal shows {self.seen[start:]!r}"
            self.seen += chunk
        self.pos = self.seen.index(text, start) + len(text)

    def type(self, keys: bytes, then: bytes = b">>> ") -> None:
        os.write(self.master, keys)
        self.wait_for(then)

    def close(self) -> int:
        os.write(self.master, b"exit()\r")
        code = self.proc.wait(timeout=60)
        os.close(self.master)
        return code


def test_on_a_terminal_line_editing_history_and_completion(store_file: Path, tmp_path: Path) -> None:
    term = Terminal(store_file, tmp_path)
    term.wait_for(b">>> ")
    # Tab completes the shell's names: "BatchJ" becomes "BatchJob(".
    term.type(b"x = BatchJ\t", b"x = BatchJob(")
    term.type(b")\r")
    term.type(b"print(type(x).__name__, 'completed')\r", b"BatchJob completed")
    term.wait_for(b">>> ")
    # The up arrow brings back the line before (no "^[[A" typed into the code).
    term.type(b"print(6 * 7, 'first')\r", b"42 first")
    term.wait_for(b">>> ")
    term.type(b"\x1b[A\r", b"42 first")
    term.wait_for(b">>> ")
    # Line editing: the left arrow moves back into the line to insert a character.
    term.type(b"print(1234)\x1b[D\x1b[D5\r", b"12354")
    term.wait_for(b">>> ")
    # On a terminal an error does not end the session.
    term.type(b"touch_batch_job('nope')\r", b"JobNotFound")
    term.type(b"print('still', 'here')\r", b"still here")
    assert term.close() == 0
    history = (tmp_path / ".python_history").read_text().splitlines()
    assert "print(6 * 7, 'first')" in history  # the console's history file, as with python -i
