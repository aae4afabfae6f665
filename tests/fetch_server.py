"""A real HTTP server on a loopback address, in a thread, for the fetcher's tests: each path answers one way
(a status, a charset, a size, a slow or dripping body, redirects), and every request it gets is recorded."""

from __future__ import annotations

import gzip
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

#: Bytes no text encoding reads as they are: a NUL, 0xff, and a PNG's signature.
BINARY = b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary \x00"


@dataclass
class Seen:
    """One request the server got: its path with the query, and its headers."""

    path: str
    headers: dict[str, str]


@dataclass
class FetchServer:
    host: str
    port: int
    scheme: str = "http"
    requests: list[Seen] = field(default_factory=list)
    # Set at the end: what a slow path waits for, so that no handler outlives its test for long.
    release: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{path}"

    def paths(self) -> list[str]:
        return [seen.path for seen in self.requests]


def _handler(server: FetchServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            server.requests.append(Seen(self.path, dict(self.headers.items())))
            parts = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            route = getattr(self, "route_" + parts.path.strip("/"), None)
            if route is None:
                self.answer(404, b"no such page")
            else:
                route(query)

        def route_text(self, query: dict[str, str]) -> None:
            self.answer(200, "héllo wörld".encode(), {"Content-Type": "text/plain; charset=utf-8"})

        def route_latin1(self, query: dict[str, str]) -> None:
            self.answer(200, "café".encode("latin-1"), {"Content-Type": "text/plain; charset=ISO-8859-1"})

        def route_charset(self, query: dict[str, str]) -> None:
            body = "naïve".encode()
            self.answer(200, body, {"Content-Type": f"text/html; charset={query['name']}"})

        def route_surrogate(self, query: dict[str, str]) -> None:
            # bytes the charset decodes to a lone surrogate (U+D800), then "a" * pad
            name = query["name"]
            if "pair" in query:  # a surrogate pair: one character (U+1F600)
                body = b"+2D3eAA-" if name == "utf-7" else b"\\ud83d\\ude00"
            else:
                body = b"+2AA-" if name == "utf-7" else b"\\ud800"
            body += b" and" + b"a" * int(query.get("pad", "0"))
            self.answer(200, body, {"Content-Type": f"text/plain; charset={name}"})

        def route_binary(self, query: dict[str, str]) -> None:
            self.answer(200, BINARY, {"Content-Type": "application/octet-stream"})

        def route_status(self, query: dict[str, str]) -> None:
            headers = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
            self.answer(int(query["code"]), b"status page", headers)

        def route_headers(self, query: dict[str, str]) -> None:
            self.answer(
                200, json.dumps(dict(self.headers.items())).encode(), {"Content-Type": "application/json"}
            )

        def route_size(self, query: dict[str, str]) -> None:
            body = b"a" * int(query["n"])
            length = query.get("length", "yes")
            if length == "yes":
                self.answer(200, body)
                return
            self.send_response(200)
            if length != "no":  # a Content-Length no reader can take: the body ends with the connection
                self.send_header("Content-Length", length)
            self.end_headers()  # "no", HTTP/1.0: the body ends where the connection does
            self.wfile.write(body)
            self.close_connection = True

        def route_gzip(self, query: dict[str, str]) -> None:
            self.answer(200, gzip.compress(b"\0" * int(query["n"])), {"Content-Encoding": "gzip"})

        def route_slow(self, query: dict[str, str]) -> None:
            server.release.wait(60)
            self.answer(200, b"late")

        def route_drip(self, query: dict[str, str]) -> None:
            self.send_response(200)
            self.end_headers()
            # a byte every 50 ms for at most a minute: then the body ends, and a fetch without a deadline
            # for the whole body returns it instead of hanging
            for _ in range(1200):
                if server.release.wait(0.05):
                    break
                self.wfile.write(b"x")
                self.wfile.flush()

        def route_drip_head(self, query: dict[str, str]) -> None:
            # the status line and headers (or, with part=chunk, a chunked body's first size line) a byte
            # every 50 ms, for 30 s: each byte well within any read timeout, the whole far past one
            pad = b"a" * 600
            head = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Pad: " + pad + b"\r\n\r\nlate"
            if query.get("part") == "chunk":
                self.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                head = b"4;pad=" + pad + b"\r\nlate\r\n0\r\n\r\n"
            for byte in head:
                if server.release.wait(0.05):
                    break
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            self.close_connection = True

        def route_hops(self, query: dict[str, str]) -> None:
            left = int(query["n"])
            if left:
                self.answer(302, headers={"Location": f"/hops?n={left - 1}"})
            else:
                self.answer(200, b"arrived")

        def route_to(self, query: dict[str, str]) -> None:
            self.answer(int(query.get("code", "302")), headers={"Location": query["url"]})

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (a timeout test) leaves its handler writing to a closed socket


@contextmanager
def fetch_server(host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> Iterator[FetchServer]:
    """A :class:`FetchServer` answering on ``host`` (a free port) until the block ends; over TLS with
    ``tls``, a server-side context."""
    server = FetchServer(host, 0, "https" if tls else "http")
    httpd = _Server((host, 0), _handler(server))
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(30)


@contextmanager
def silent_listener(host: str = "127.0.0.1") -> Iterator[socket.socket]:
    """A listening socket no one accepts on: :func:`was_connected` tells whether anything connected."""
    listener = socket.create_server((host, 0))
    try:
        yield listener
    finally:
        listener.close()


def was_connected(listener: socket.socket) -> bool:
    """Whether a connection reached ``listener``: the kernel completes one into the backlog on its own."""
    listener.setblocking(False)
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True
