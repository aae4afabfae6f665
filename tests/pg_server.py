"""A private PostgreSQL server for the fault tests: its own data directory, a free port on 127.0.0.1 and its
unix socket in a fresh temporary directory, so that stopping or crashing it never disturbs the shared
test server (``SIFT_TEST_POSTGRES``).

It runs from the installed binaries (``initdb``, ``pg_ctl``: the newest ``/usr/lib/postgresql/*/bin``, else
those on ``PATH``). ``initdb`` refuses to run as root, so as root the server runs as the ``postgres`` OS user
(``runuser``), which owns the directory. Authentication: ``trust`` for the superuser ``postgres``, and
``scram-sha-256`` over TCP for the role :data:`PASSWORD_ROLE`, whose password is :data:`PASSWORD`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

#: A role that logs in over TCP with a password only (scram-sha-256), and its password.
PASSWORD_ROLE = "sift_pw"
PASSWORD = "s3cret-Pass_word"

#: The database the tests' stores live in (each test in a schema of its own).
DATABASE = "sift"

_RUN_AS = "postgres"  # the OS user the server runs as when the tests run as root


def bin_dir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: the newest installed version's, else ``PATH``'s."""

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in path.parent.name.split(".") if part.isdigit())

    installed = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").is_file()]
    if installed:
        return max(installed, key=version)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def server_missing() -> str | None:
    """Why no private server can be started here, or None."""
    found = bin_dir()
    if found is None or not (found / "pg_ctl").is_file():
        return "no PostgreSQL server binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin or on PATH"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(_RUN_AS)
        except KeyError:
            return f"running as root, and there is no {_RUN_AS!r} OS user to run initdb as"
        if shutil.which("runuser") is None:
            return "running as root, and there is no runuser to run initdb as the postgres user"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PrivateServer:
    """A PostgreSQL server of the tests' own; :meth:`create` starts one, :meth:`destroy` removes it."""

    def __init__(self, root: Path, bindir: Path) -> None:
        self.root = root
        self.bindir = bindir
        self.data = root / "data"
        self.socket_dir = root / "socket"
        self.log = root / "server.log"
        self.port = 0
        self.database = DATABASE

    @classmethod
    def create(cls) -> PrivateServer:
        bindir = bin_dir()
        assert bindir is not None, server_missing()
        server = cls(Path(tempfile.mkdtemp(prefix="sift-pg-")), bindir)
        try:
            server._init()
            server._start_on_a_free_port()
            with server.admin("postgres") as admin:
                admin.execute(f"CREATE DATABASE {DATABASE}")
                admin.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD '{PASSWORD}'")
                admin.execute(f"GRANT CREATE ON DATABASE {DATABASE} TO {PASSWORD_ROLE}")
        except BaseException:
            server.destroy()
            raise
        return server

    def _command(self, *args: str) -> list[str]:
        as_user = ["runuser", "-u", _RUN_AS, "--"] if os.geteuid() == 0 else []
        return [*as_user, *args]

    def _run(self, *args: str) -> None:
        done = subprocess.run(self._command(*args), capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args)} failed ({done.returncode}): {done.stderr}{done.stdout}\n{log}"
            )

    def _init(self) -> None:
        self.socket_dir.mkdir()
        if os.geteuid() == 0:
            user = pwd.getpwnam(_RUN_AS)
            for path in (self.root, self.socket_dir):
                os.chown(path, user.pw_uid, user.pw_gid)
        # --no-sync only makes initdb itself faster; the running server keeps fsync and synchronous_commit on.
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "-E", "UTF8",
                  "--auth=trust", "--no-sync")  # fmt: skip
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n"
            "host all all 127.0.0.1/32 trust\n"
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.socket_dir}'\n"
                "max_connections = 60\n"
                "shared_buffers = 32MB\n"
                "password_encryption = 'scram-sha-256'\n"
            )

    def _start_on_a_free_port(self) -> None:
        for attempt in range(3):  # another program may take the port between the probe and the start
            self.port = _free_port()
            try:
                self.start()
                return
            except RuntimeError:
                if attempt == 2:
                    raise

    def pg_ctl(self, action: str, *args: str) -> None:
        self._run(str(self.bindir / "pg_ctl"), action, "-D", str(self.data), "-w", "-t", "120", *args)

    def start(self) -> None:
        self.pg_ctl("start", "-l", str(self.log), "-o", f"-p {self.port}")

    def stop(self, mode: str) -> None:
        """``pg_ctl stop -m mode``: ``fast`` ends every session and checkpoints; ``immediate`` is a crash
        (no checkpoint: the next start replays the WAL)."""
        self.pg_ctl("stop", "-m", mode)

    def restart(self, mode: str) -> None:
        self.pg_ctl("restart", "-m", mode, "-l", str(self.log), "-o", f"-p {self.port}")

    def destroy(self) -> None:
        """Stop the server (as a crash: nothing is kept) and remove its directory."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, *, user: str = "postgres", password: str | None = None, database: str = DATABASE,
            port: int | None = None) -> str:  # fmt: skip
        """A ``postgresql://`` URL of this server over TCP."""
        login = user if password is None else f"{user}:{password}"
        return f"postgresql://{login}@127.0.0.1:{port or self.port}/{database}"

    def admin(self, database: str = DATABASE) -> psycopg.Connection[tuple[object, ...]]:
        """A superuser connection over the unix socket, in autocommit."""
        return psycopg.connect(
            host=str(self.socket_dir), port=self.port, user="postgres", dbname=database, autocommit=True
        )


def started(purpose: str) -> PrivateServer:
    """A private server started for ``purpose``; without one here, the caller's cases are skipped with the
    reason, except under CI (``CI=true``), where they fail."""
    reason = server_missing()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no private PostgreSQL server for {purpose}: {reason}", pytrace=False)
        pytest.skip(f"no private PostgreSQL server for {purpose}: {reason}")
    return PrivateServer.create()
