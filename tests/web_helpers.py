"""The dashboard as users run it: ``sift web`` in a process of its own on 127.0.0.1, on a free port."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: How long a server may take to start on a busy machine.
START_TIMEOUT_S = 60


@contextmanager
def sift_web(target: str, *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``sift web --db target --bind 127.0.0.1:0 args...`` running; yields its base URL and the process.
    Stopped with SIGTERM afterwards, which must end it with status 0."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "sift", "web", "--db", target, "--bind", "127.0.0.1:0", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # blocks until the server says where it listens, or exits
        found = re.search(r"on (http://127\.0\.0\.1:\d+)/", line)
        assert found, f"sift web said {line!r} (exit status {process.poll()})"
        yield found.group(1), process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=START_TIMEOUT_S)
        if process.stdout is not None:
            process.stdout.close()
    assert status == 0, f"sift web exited {status} on SIGTERM"


def token_file(directory: Path, token: str = "s3cret-token") -> str:
    path = directory / "token"
    path.write_text(token + "\n", encoding="utf-8")
    return str(path)
