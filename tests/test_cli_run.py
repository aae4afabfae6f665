"""``sift run``: a runner process from the command line, on every backend, fetching from a real site on
127.0.0.1; SIGTERM stops it with exit 0 and no claim held; bad options exit 1 naming them; its log lines
count what it did, the targets given back untried too."""

from __future__ import annotations

import fcntl
import os
import pty
import shlex
import signal
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import populate, run, sift_script, snapshot_of
from docs_pages import block
from runner_site import serving

from sift import dcache
from sift.dcache import db

TESTS = Path(__file__).parent
WAIT = 60.0


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def final(job_id: str) -> bool:
    job = dcache.batch_job(job_id)
    return job is not None and job.status in ("done", "partial", "failed")


def start(store: str, *options: str) -> subprocess.Popen[str]:
    argv = [str(sift_script()), "--db", store, "run", "--concurrency", "4", "--renew-every", "1", *options]
    # from the tests' directory: --fetch imports runner_site from the current directory
    return subprocess.Popen(argv, cwd=TESTS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    return err


@pytest.mark.slow
def test_sift_run_fetches_a_job_and_stops_on_sigterm(shared_store: str) -> None:
    with serving() as site:
        job_id = dcache.submit(
            "alice", [f"{site.base}{p}" for p in ("/ok/0", "/missing/1", "/busy/2")], idem_key=""
        )
        proc = start(shared_store, "--fetch", "runner_site:fetch")
        wait_for(lambda: final(job_id.job_id), "the job to finish")
        err = stop(proc)
        targets = dcache.batch_targets(job_id.job_id) or []
        assert [(t.status, t.attempts) for t in targets] == [("done", 1), ("failed", 1), ("done", 2)]
        busy = site.times["/busy/2"]
        assert busy[1] - busy[0] >= 1.0
        job = dcache.batch_job(job_id.job_id)
        assert job is not None and (job.status, job.targets_done) == ("partial", 3)
        count = db.execute_sql("SELECT COUNT(*) FROM batch_target WHERE status = 'running'").fetchone()[0]
        assert count == 0
        assert "stopped; 2 done, 1 failed, 1 retried, 0 given back" in err
        assert dcache.check_store().ok


@pytest.mark.slow
def test_sift_run_allow_private_reaches_the_fetch(shared_store: str) -> None:
    with serving() as site:
        job_id = dcache.submit("alice", [f"{site.base}/ok/0"], idem_key="").job_id
        proc = start(shared_store, "--fetch", "runner_site:fetch_private", "--allow-private")
        wait_for(lambda: final(job_id), "the job to finish")
        stop(proc)
        assert [t.status for t in dcache.batch_targets(job_id) or []] == ["done"]


@pytest.mark.slow
def test_the_guides_one_line_runs(shared_store: str) -> None:
    line = block("sift-run").replace("sift.db", shared_store).replace("myapp:fetch", "runner_site:fetch")
    argv = shlex.split(line)
    assert argv[0] == "sift"
    with serving() as site:
        job_id = dcache.submit("alice", [f"{site.base}/ok/0"], idem_key="").job_id
        proc = subprocess.Popen(
            [str(sift_script()), *argv[1:]],
            cwd=TESTS,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: final(job_id), "the job to finish")
        stop(proc)
        assert [t.result for t in dcache.batch_targets(job_id) or []] == [f"page /ok/0 by {proc.pid}"]


@pytest.mark.slow
def test_sift_run_prefetch_0_claims_only_for_the_free_workers(shared_store: str) -> None:
    """One worker: a target fetched at once, then targets that hang. After the quick one, a claim with the
    default prefetch takes targets ahead; with ``--prefetch 0`` it takes one, for the one free worker."""
    with serving() as site:
        urls = [f"{site.base}/ok/0", *(f"{site.base}/hang/{i}" for i in range(1, 10))]
        job_id = dcache.submit("alice", urls, idem_key="").job_id
        # the last --concurrency given is the one argparse keeps
        proc = start(shared_store, "--fetch", "runner_site:fetch", "--concurrency", "1", "--prefetch", "0")

        def statuses() -> list[str]:
            return [t.status for t in dcache.batch_targets(job_id) or []]

        wait_for(lambda: statuses()[0] == "done" and site.asked("/hang/") == 1, "a target to hang")
        held = statuses()
        site.release.set()
        stop(proc)
    assert held == ["done", "running", *["pending"] * 8]
    assert site.asked("/hang/1") == 1


@pytest.mark.slow
def test_sift_run_logs_the_targets_given_back(shared_store: str) -> None:
    with serving() as site:
        job_id = dcache.submit("alice", [f"{site.base}/ok/0", f"{site.base}/ok/1"], idem_key="").job_id
        proc = start(shared_store, "--fetch", "runner_site:fetch_give_back_once")
        lines: list[str] = []

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: final(job_id), "the job to finish")
        # a log line comes every LOG_EVERY seconds: wait for one written after the job finished
        logged = "2 done, 0 failed, 0 retried, 2 given back, 0 running"
        wait_for(lambda: any(logged in line for line in lines), "a log line with the targets given back")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0
        reader.join(WAIT)
        targets = dcache.batch_targets(job_id) or []
        # each was given back once, untried: its one attempt is the fetch that wrote it
        assert [(t.status, t.attempts) for t in targets] == [("done", 1), ("done", 1)]
        assert site.asked() == 2
    assert lines[-1].endswith(": stopped; 2 done, 0 failed, 0 retried, 2 given back\n")


@pytest.mark.parametrize(
    "value",
    [
        "-1",
        "many",
        "2.5",
        "",
        "9223372036854775808",
        # "²" is a digit to str.isdigit(), not to int(), which refuses a text of over 4,300 digits
        pytest.param("\u00b2", marks=pytest.mark.slow),
        pytest.param("0" * 5000 + "1" * 20, marks=pytest.mark.slow),
    ],
)
def test_sift_run_refuses_a_bad_prefetch_and_leaves_the_store_as_it_was(tmp_path: Path, value: str) -> None:
    path = tmp_path / "store.db"
    populate(path)
    before = snapshot_of(path)
    argv = [str(sift_script()), "--db", str(path), "run", "--fetch", "runner_site:fetch", "--prefetch", value]
    # accepted, the runner would run until stopped: the timeout fails the test
    done = subprocess.run(argv, cwd=TESTS, capture_output=True, text=True, timeout=WAIT)
    message = f"sift: --prefetch: must be a whole number from 0 to 2**63-1, got {value!r}\n"
    assert (done.returncode, done.stdout, done.stderr) == (1, "", message)
    assert snapshot_of(path) == before


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--fetch", "nosuchmodule_xyz:fetch"], "--fetch: cannot import 'nosuchmodule_xyz'"),
        (["--fetch", "runner_site"], "--fetch: expected MODULE:FUNCTION"),
        (["--fetch", "runner_site:nothing"], "--fetch: 'runner_site' has no function 'nothing'"),
        (["--fetch", "runner_site:fetch", "--weight", "fleet"], "--weight: expected CLASS=TURNS"),
        (["--fetch", "runner_site:fetch", "--concurrency", "0"], "sift: --concurrency: must be"),
        (["--fetch", "runner_site:fetch", "--max-attempts", "0"], "sift: --max-attempts: must be"),
        (["--fetch", "runner_site:fetch", "--backoff-first", "-1"], "sift: --backoff-first: "),
        (["--fetch", "runner_site:fetch", "--stale-after", "5", "--renew-every", "5"], "--renew-every: "),
        (["--fetch", "runner_site:fetch", "--unfair", "--weight", "fleet=2"], "sift: --weight: "),
        (["--fetch", "runner_site:fetch", "--allow-private"], "sift: --allow-private: fetch must take"),
        (["--fetch", "runner_site:fetch", "--grace", "soon"], "--grace"),
        # a digit to str.isdigit, not to int(); and a grace longer than a thread can wait
        pytest.param(
            ["--fetch", "runner_site:fetch", "--weight", "fleet=" + "9" * 5000],
            "--weight: expected CLASS=TURNS",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["--fetch", "runner_site:fetch", "--weight", "fleet=\u00b2"],
            "--weight: expected CLASS=TURNS",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["--fetch", "runner_site:fetch", "--grace", "10000000000"],
            "grace: must be a number of seconds from 0 to",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_sift_run_refuses_bad_options(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    options: list[str],
    message: str,
) -> None:
    path = tmp_path / "store.db"
    dcache.open_db(path)
    dcache.close_db()
    monkeypatch.chdir(TESTS)
    code, _, err = run(capsys, "--db", path, "run", *options)
    assert code == 1
    assert message in err


@pytest.mark.slow
def test_sift_run_on_a_terminal_shows_a_live_line(file_store: Path) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    env = dict(os.environ, COLUMNS="120", LINES="24")
    with serving() as site:
        job_id = dcache.submit("alice", [f"{site.base}/ok/0", f"{site.base}/busy/1"], idem_key="").job_id
        argv = [str(sift_script()), "--db", str(file_store), "run", "--fetch", "runner_site:fetch"]
        try:
            proc = subprocess.Popen(argv, cwd=TESTS, stdout=subprocess.PIPE, stderr=slave, env=env, text=True)
        finally:
            os.close(slave)
        chunks: list[bytes] = []

        def read() -> None:
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    return
                if not data:
                    return
                chunks.append(data)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: final(job_id), "the job to finish")
        wait_for(lambda: b"retried=1" in b"".join(chunks), "the live line to show the retry")
        stop(proc)
        reader.join(WAIT)
        os.close(master)
    shown = b"".join(chunks).decode(errors="replace")
    assert "sift run" in shown and "target/s" in shown and "running=" in shown and "failed=0" in shown
    assert "given back=0" in shown
