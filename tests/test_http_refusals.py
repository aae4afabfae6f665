"""The fetcher's safety rules: only http and https, and only hosts whose every address is public, checked
before any connection, at each redirect too, and the connection made to the address checked (no second
lookup). Connections are seen twice over: every ``socket.connect`` of the process is recorded, and a
listening socket nobody accepts on shows whether anything reached it."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fetch_server import FetchServer, fetch_server, silent_listener, was_connected

from sift.dcache import BatchTarget, InvalidBatchInput
from sift.runner import Fail, Retry
from sift.runner.http import fetch

#: The test server's own address: allowed by name (``allow_private=[ALLOWED]``), unlike the rest of 127/8.
SERVER_HOST = "127.0.0.2"
ALLOWED = "127.0.0.2/32"


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The address of every connection this process starts while the test runs."""
    seen: list[Any] = []
    connect = socket.socket.connect

    def recorded(sock: socket.socket, address: Any) -> None:
        seen.append(address[:2])
        connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", recorded)
    return seen


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with silent_listener("127.0.0.1") as sock:
        yield sock


@pytest.fixture(scope="module")
def server() -> Iterator[FetchServer]:
    with fetch_server(SERVER_HOST) as running:
        yield running


@pytest.fixture(autouse=True)
def fresh(server: FetchServer) -> None:
    server.requests.clear()


def refused_urls(port: int) -> list[str]:
    """The URLs every fetch must refuse: ``port`` is the silent listener's, on 127.0.0.1."""
    return [
        "file:///etc/passwd",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        f"http://localhost:{port}/",
        f"http://[::ffff:127.0.0.1]:{port}/",
        f"http://2130706433:{port}/",
    ]


CASES = range(len(refused_urls(0)))


def get(url: str, **kwargs: Any) -> str:
    return fetch(BatchTarget(url=url, options='{"timeout": 5}'), **kwargs)


@pytest.mark.parametrize("case", CASES)
def test_refused_without_connecting(case: int, connects: list[Any], listener: socket.socket) -> None:
    url = refused_urls(listener.getsockname()[1])[case]
    with pytest.raises(Fail) as failed:
        get(url)
    assert failed.value.error.startswith(f"refused {url}: ")
    assert connects == []
    assert not was_connected(listener)


@pytest.mark.parametrize("case", CASES)
def test_a_redirect_to_a_refused_url_is_refused_without_connecting(
    case: int, server: FetchServer, connects: list[Any], listener: socket.socket
) -> None:
    url = refused_urls(listener.getsockname()[1])[case]
    with pytest.raises(Fail) as failed:
        get(server.url(f"/to?url={quote(url, safe='')}"), allow_private=[ALLOWED])
    assert failed.value.error.startswith(f"refused {url}: ")
    assert server.paths() == [f"/to?url={quote(url, safe='')}"]
    assert connects == [(SERVER_HOST, server.port)]
    assert not was_connected(listener)


@pytest.mark.parametrize(
    "url",
    [  # the fast lane takes an address of each kind, the full lane the other spellings too (slow)
        "http://127.1/",
        pytest.param("http://0x7f000001/", marks=pytest.mark.slow),
        "http://0.0.0.0/",
        pytest.param("http://[::]/", marks=pytest.mark.slow),
        "http://[::1]/",
        "http://100.64.0.1/",  # shared address space (carrier-grade NAT)
        "http://192.168.1.1/",
        "http://172.16.0.1/",
        "http://[fc00::1]/",  # unique local
        pytest.param("http://[fd12:3456::1]/", marks=pytest.mark.slow),
        "http://[fe80::1]/",  # link-local
        "http://[fec0::1]/",  # site-local, deprecated: Python 3.11 counts it global
        "http://224.0.0.1/",  # multicast
        pytest.param("http://[ff02::1]/", marks=pytest.mark.slow),
        "http://240.0.0.1/",  # reserved
        pytest.param("http://255.255.255.255/", marks=pytest.mark.slow),
        "http://[64:ff9b::a00:1]/",  # 10.0.0.1 through NAT64
        "http://[2002:a00:1::1]/",  # 10.0.0.1 through 6to4
        pytest.param("http://[::ffff:10.0.0.1]/", marks=pytest.mark.slow),
    ],
)
def test_every_kind_of_non_public_address_is_refused(url: str, connects: list[Any]) -> None:
    with pytest.raises(Fail) as failed:
        get(url)
    assert "is not a public address" in failed.value.error
    assert connects == []


@pytest.mark.parametrize(
    "url",
    ["ftp://example.com/", "gopher://example.com/", "data:text/plain,hi", "javascript:alert(1)", "//x/"],
)
def test_other_schemes_are_refused_even_with_private_addresses_allowed(url: str, connects: list[Any]) -> None:
    with pytest.raises(Fail) as failed:
        get(url, allow_private=True)
    assert failed.value.error == f"refused {url}: only http and https URLs are fetched"
    assert connects == []


def test_credentials_in_the_url_are_refused(connects: list[Any]) -> None:
    with pytest.raises(Fail) as failed:
        get("http://user:secret@example.com/")
    assert "credentials in a URL are not sent" in failed.value.error
    assert connects == []


def test_allow_private_lets_loopback_through(connects: list[Any]) -> None:
    with fetch_server("127.0.0.1") as loopback:
        assert json.loads(get(f"http://localhost:{loopback.port}/headers", allow_private=True))["Host"] == (
            f"localhost:{loopback.port}"
        )
        assert connects == [("127.0.0.1", loopback.port)]
        with pytest.raises(Fail):
            get(loopback.url("/headers"), allow_private=[ALLOWED])  # 127.0.0.1 is not in 127.0.0.2/32
        assert loopback.paths() == ["/headers"]


@pytest.mark.parametrize("bad", ["10.0.0.0/8", ["not a network"], [10], 1])
def test_a_bad_allow_private_is_invalid_input(bad: Any, connects: list[Any]) -> None:
    with pytest.raises(InvalidBatchInput) as invalid:
        get("http://10.0.0.1/", allow_private=bad)
    assert invalid.value.field == "allow_private"
    assert connects == []


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[list[str]], list[str]]]:
    """``site.test`` resolving to each answer of the list in turn (a DNS answer that changes between two
    lookups, as in DNS rebinding), ``xn--bcher-kva.example`` to 10.1.2.3, and the names looked up."""
    answers: list[list[str]] = []
    asked: list[str] = []
    getaddrinfo = socket.getaddrinfo

    def resolve(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(host)
        if host == "xn--bcher-kva.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", port))]
        if host != "site.test":
            return getaddrinfo(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in answers.pop(0)]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    yield answers, asked


def test_the_connection_goes_to_the_address_checked(
    server: FetchServer, connects: list[Any], lookups: tuple[list[list[str]], list[str]]
) -> None:
    answers, asked = lookups
    answers.extend([[SERVER_HOST], ["10.0.0.1"]])  # a second lookup would get an address never checked
    sent = json.loads(get(f"http://site.test:{server.port}/headers", allow_private=[ALLOWED]))
    assert sent["Host"] == f"site.test:{server.port}"
    assert asked.count("site.test") == 1
    assert connects == [(SERVER_HOST, server.port)]


def test_a_public_address_passes_the_check_and_is_the_one_connected(
    monkeypatch: pytest.MonkeyPatch, lookups: tuple[list[list[str]], list[str]]
) -> None:
    answers, asked = lookups
    answers.append(["93.184.215.14"])
    tried: list[Any] = []

    def unreachable(sock: socket.socket, address: Any) -> None:
        tried.append(address[:2])
        raise ConnectionRefusedError("no network in the test")

    monkeypatch.setattr(socket.socket, "connect", unreachable)
    with pytest.raises(Retry) as retried:
        get("http://site.test/")
    assert "cannot fetch http://site.test/" in retried.value.error
    assert tried == [("93.184.215.14", 80)]
    assert asked.count("site.test") == 1


def test_one_private_address_among_public_ones_refuses_the_host(
    monkeypatch: pytest.MonkeyPatch, connects: list[Any]
) -> None:
    def resolve(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with pytest.raises(Fail) as failed:
        get("http://mixed.test/")
    assert "10.0.0.1" in failed.value.error
    assert connects == []


def test_a_name_resolving_to_a_site_local_address_is_refused_without_connecting(
    connects: list[Any], lookups: tuple[list[list[str]], list[str]]
) -> None:
    answers, _ = lookups
    answers.append(["fec0::1"])
    with pytest.raises(Fail) as failed:
        get("http://site.test/")
    assert (
        failed.value.error
        == "refused http://site.test/: fec0::1 is not a public address (site.test resolves to it)"
    )
    assert connects == []


def test_an_address_that_does_not_answer_gives_way_to_the_next_checked_one(
    server: FetchServer, connects: list[Any], lookups: tuple[list[list[str]], list[str]]
) -> None:
    answers, asked = lookups
    answers.append(["127.0.0.3", SERVER_HOST])  # nothing listens on 127.0.0.3
    text = get(f"http://site.test:{server.port}/text", allow_private=["127.0.0.2/31"])
    assert text == "héllo wörld"
    assert connects == [("127.0.0.3", server.port), (SERVER_HOST, server.port)]
    assert asked.count("site.test") == 1


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for ``site.test`` and its key, made by the openssl command."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    command = [
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=site.test",
    ]
    command += ["-addext", "subjectAltName=DNS:site.test", "-keyout", str(key), "-out", str(cert)]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return cert, key


@pytest.fixture(scope="module")
def tls_server(certificate: tuple[Path, Path]) -> Iterator[tuple[FetchServer, list[str | None]]]:
    """A TLS server on 127.0.0.2 with the ``site.test`` certificate, and the SNI name of each handshake."""
    names: list[str | None] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    with fetch_server(SERVER_HOST, tls=context) as running:
        yield running, names


@pytest.fixture(autouse=True)
def fresh_tls(request: pytest.FixtureRequest) -> None:
    if "tls_server" in request.fixturenames:
        request.getfixturevalue("tls_server")[0].requests.clear()


def test_https_names_the_site_to_the_address_checked(
    tls_server: tuple[FetchServer, list[str | None]],
    certificate: tuple[Path, Path],
    connects: list[Any],
    lookups: tuple[list[list[str]], list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, names = tls_server
    answers, asked = lookups
    answers.append([SERVER_HOST])
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))  # OpenSSL's default trust store, for this test
    sent = json.loads(get(f"https://site.test:{server.port}/headers", allow_private=[ALLOWED]))
    assert sent["Host"] == f"site.test:{server.port}"
    assert names[-1] == "site.test"
    assert connects == [(SERVER_HOST, server.port)]
    assert asked.count("site.test") == 1


def test_https_refuses_a_certificate_for_another_name(
    tls_server: tuple[FetchServer, list[str | None]],
    certificate: tuple[Path, Path],
    lookups: tuple[list[list[str]], list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, _ = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    with pytest.raises(Retry) as retried:  # the certificate is trusted, but names site.test only
        get(f"https://127.0.0.2:{server.port}/headers", allow_private=[ALLOWED])
    assert "hostname '127.0.0.2' doesn't match 'site.test'" in retried.value.error
    assert server.requests == []


def test_https_refuses_an_untrusted_certificate(
    tls_server: tuple[FetchServer, list[str | None]], lookups: tuple[list[list[str]], list[str]]
) -> None:
    server, _ = tls_server
    answers, _ = lookups
    answers.append([SERVER_HOST])
    with pytest.raises(Retry) as retried:
        get(f"https://site.test:{server.port}/headers", allow_private=[ALLOWED])
    assert "certificate verify failed" in retried.value.error
    assert server.requests == []


@pytest.mark.slow  # it waits out its 1 s timeout
def test_https_headers_still_arriving_at_the_timeout_are_a_retry(
    tls_server: tuple[FetchServer, list[str | None]],
    certificate: tuple[Path, Path],
    lookups: tuple[list[list[str]], list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, _ = tls_server
    answers, _ = lookups
    answers.append([SERVER_HOST])
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    started = time.monotonic()
    with pytest.raises(Retry) as retried:  # each byte of the head is a TLS record of its own, 50 ms apart
        fetch(
            BatchTarget(url=f"https://site.test:{server.port}/drip_head", options='{"timeout": 1}'),
            allow_private=[ALLOWED],
        )
    assert "timed out" in retried.value.error
    assert time.monotonic() - started < 5  # a bound on a hang (the drip lasts 30 s), not a speed
    assert server.paths() == ["/drip_head"]


@pytest.mark.parametrize("host", ["a..b", "a" * 64 + ".com", ("a" * 60 + ".") * 5 + "com", "-ä.com"])
def test_a_host_dns_cannot_hold_fails_without_a_lookup(
    host: str, connects: list[Any], lookups: tuple[list[list[str]], list[str]]
) -> None:
    _, asked = lookups
    with pytest.raises(Fail) as failed:
        get(f"http://{host}/", allow_private=True)
    assert failed.value.error.startswith("refused http://")  # the URL, cut short past 300 characters
    assert failed.value.error.endswith(": the host is not a valid name")
    assert (asked, connects) == ([], [])


def test_a_non_ascii_name_is_looked_up_as_its_a_labels(lookups: tuple[list[list[str]], list[str]]) -> None:
    _, asked = lookups
    with pytest.raises(Fail):
        get("http://Bücher.example/")  # site.test is the only name the test's resolver answers
    assert asked == ["xn--bcher-kva.example"]
