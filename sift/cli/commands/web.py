"""``sift web``: the operator's dashboard (``sift.web``) under a threaded HTTP server, until SIGTERM or
Ctrl-C.

It binds to 127.0.0.1 by default and refuses any other address without ``--token-file``: the actions change
the store. Without a token file on a loopback address it makes a token for this run and prints it, so that
another user of the machine cannot act through the port either; ``--read-only`` needs none (no actions).
"""

from __future__ import annotations

import argparse
import ipaddress
import secrets
import signal
import sys
import threading
from typing import Any

from ..store import CommandError
from ..units import parse_duration, parse_size
from . import Command, StoreUse

__all__ = ["COMMAND"]

DEFAULT_BIND = "127.0.0.1:8765"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's own arguments (``--db`` is the dispatcher's)."""
    parser.add_argument(
        "--bind",
        metavar="HOST:PORT",
        default=DEFAULT_BIND,
        help="the address to listen on (default %(default)s; port 0 picks a free one); an address other "
        "than loopback needs --token-file",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="a file holding the token actions need (its first line); without it, a token is made for this "
        "run and printed",
    )
    parser.add_argument(
        "--read-only", action="store_true", help="open the store read-only: pages only, every action refused"
    )
    parser.add_argument(
        "--budget", metavar="SIZE", help="the byte budget the overview shows stored results against"
    )
    parser.add_argument(
        "--stale-after",
        metavar="DURATION",
        default="60",
        help="a claim silent this long counts as stale (default %(default)s seconds)",
    )


def _address(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise CommandError(f"--bind: must be HOST:PORT, got {bind!r}")
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def prepare(args: argparse.Namespace) -> None:
    """Check the address and read the token before the store opens."""
    args.host, args.port = _address(args.bind)
    args.token = None
    if args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as file:
                args.token = file.readline().strip()
        except OSError as exc:
            raise CommandError(f"--token-file: cannot read {args.token_file!r}: {exc.strerror}") from None
        if not args.token:
            raise CommandError(f"--token-file: {args.token_file!r} holds no token on its first line")
    elif not _loopback(args.host):
        raise CommandError(f"--bind: {args.host} is not a loopback address: give --token-file")


def reads_only(args: argparse.Namespace) -> bool:
    return bool(args.read_only)


def run(args: argparse.Namespace) -> int:
    """Serve the dashboard until SIGTERM or Ctrl-C; exit 0."""
    try:
        from werkzeug.serving import make_server

        from sift.web import create_app
    except ImportError as exc:
        raise CommandError(f"sift web needs the web extra (pip install 'sift[web]'): {exc}") from None

    token = args.token
    if token is None and not args.read_only:
        token = secrets.token_urlsafe(24)
        print(f"sift web: actions need this run's token: {token}", file=sys.stderr, flush=True)
    app = create_app(
        None, token=token, read_only=args.read_only, budget=args.budget, stale_after=args.stale_after
    )
    server = make_server(args.host, args.port, app, threaded=True)
    host = f"[{args.host}]" if ":" in args.host else args.host

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()  # serve_forever's own thread would wait

    signal.signal(signal.SIGTERM, stop)
    print(f"sift web: serving {args.db} on http://{host}:{server.server_port}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


COMMAND = Command(
    name="web",
    help="Serve the operator's dashboard (the web extra): live pages of jobs, callers, hosts and runners, "
    "and token-guarded actions (cancel a job, requeue stale claims).",
    run=run,
    store=StoreUse.WRITE,
    add_arguments=add_arguments,
    json=False,
    values={"budget": parse_size, "stale_after": parse_duration},
    prepare=prepare,
    readonly=reads_only,
)
