"""The built-in fetcher (the ``http`` extra, ``pip install sift[http]``): a GET of the target's URL on
urllib3, made safe to run on URLs given by callers (docs/how-to/runners.md, "The built-in HTTP fetcher").

urllib3 because it lets the fetcher connect to the very address it checked, while the request still names
the site: its connection pool takes the address as the host, and the name as the ``Host`` header, the TLS
SNI (``server_hostname``) and the name the certificate must match (``assert_hostname``). A client that
resolves the name itself would look it up a second time, and a name whose answer changes in between (DNS
rebinding) would reach an address nobody checked. urllib3 reads no proxy settings from the environment
either, so no variable can route the fetches elsewhere."""

from __future__ import annotations

import base64
import codecs
import email.message
import email.utils
import http
import ipaddress
import json
import math
import re
import socket
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urljoin, urlsplit

import idna
import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.util.ssl_ import create_urllib3_context

from ..dcache.clock import monotonic, unix_now, unix_time
from ..dcache.errors import InvalidBatchInput
from ..dcache.models import BatchTarget
from ..dcache.validation import MAX_RESULT_BYTES
from .outcomes import Fail, GiveBack, Retry, storable_message

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_REDIRECTS",
    "DEFAULT_TIMEOUT",
    "MAX_REDIRECTS",
    "RETRY_AFTER_MOST",
    "fetch",
]

#: The most bytes of body a fetch takes (option ``max_bytes``): a page, not a download.
DEFAULT_MAX_BYTES = 4 * 2**20
#: The most seconds one fetch takes, its redirects included (option ``timeout``).
DEFAULT_TIMEOUT = 30.0
#: The most redirects one fetch follows (option ``max_redirects``).
DEFAULT_MAX_REDIRECTS = 5
#: The highest ``max_redirects`` a target may ask for.
MAX_REDIRECTS = 20
#: The longest wait a ``Retry-After`` may ask for, in seconds: a site asking for more waits this long.
RETRY_AFTER_MOST = 3600

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_DIGITS = re.compile(r"[0-9]+")
_SCHEMES = {"http": 80, "https": 443}
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Sent on a redirect to the same origin only: another site is not given the first one's credentials.
_CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
_CHUNK = 64 * 1024
# A name DNS can hold: labels of 1 to 63 characters, at most 253 in all (an underscore is allowed, as sites
# use it); an IPv6 literal, the other kind of host, holds a colon.
_DNS_NAME = re.compile(r"(?=.{1,253}$)[^.\s]{1,63}(?:\.[^.\s]{1,63})*")
# Addresses that carry an IPv4 address in their last 32 bits: the IPv4 address is the one reached.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class _Options:
    headers: dict[str, str]
    timeout: float
    max_bytes: int
    max_redirects: int
    base64: bool


def fetch(target: BatchTarget, *, allow_private: bool | Iterable[str | _Network] = False) -> str:
    """GET ``target.url`` with its options, following redirects, and return the body as text (2xx), or
    raise :class:`~sift.runner.Retry` (429, 5xx, network errors, timeouts) or :class:`~sift.runner.Fail`
    (other statuses, a body over ``max_bytes``, bad options, a refused URL or address), or
    :class:`~sift.runner.GiveBack` for a paced target whose ``send_by`` passed before its request could leave.

    Only http and https URLs are fetched, and only from hosts whose every address is global: loopback,
    private, link-local, site-local (fec0::/10), shared (100.64/10), multicast, reserved and unspecified
    addresses are refused before any connection, at each redirect too. ``allow_private=True`` allows
    every address, and a list of networks (``["10.1.0.0/16"]``) those networks; neither ever allows
    another scheme."""
    allowed = _allowed_networks(allow_private)
    options = _options(target.options)
    deadline = monotonic() + options.timeout
    url = target.url
    headers = options.headers
    for hop in range(options.max_redirects + 1):
        parts = _checked_url(url)
        addresses = _resolve(parts, allowed)
        if hop == 0 and target.send_by is not None and unix_time() > target.send_by:
            raise GiveBack(f"not sent by {target.send_by:.3f}, the end of its host's send window")
        pool, response = _get(parts, addresses, headers, deadline)
        try:
            location = _outcome(response, url)
            if location is None:
                return _body(response, url, options, deadline)
        finally:
            response.close()
            pool.close()
        next_url = urljoin(url, location)
        if _origin(next_url) != _origin(url):
            headers = {k: v for k, v in headers.items() if k.lower() not in _CREDENTIAL_HEADERS}
        url = next_url
    raise Fail(storable_message(f"more than {options.max_redirects} redirects from {_show(target.url)}"))


def _show(url: str) -> str:
    return url if len(url) <= 300 else url[:297] + "..."


def _allowed_networks(allow_private: object) -> tuple[_Network, ...] | None:
    """None: every address allowed; else the networks allowed besides the global addresses."""
    if allow_private is True:
        return None
    if allow_private is False:
        return ()
    if isinstance(allow_private, str | bytes) or not isinstance(allow_private, Iterable):
        problem = f"must be True, False or a list of networks, got {allow_private!r}"
        raise InvalidBatchInput("allow_private", problem)
    networks: list[_Network] = []
    for item in allow_private:
        try:
            if not isinstance(item, str | _Network):
                raise TypeError(f"a network is text or an ip_network, not {type(item).__name__}")
            networks.append(item if isinstance(item, _Network) else ipaddress.ip_network(item))
        except (TypeError, ValueError) as e:
            raise InvalidBatchInput("allow_private", f"{item!r} is not a network: {e}") from None
    return tuple(networks)


def _options(options: object) -> _Options:
    """The target's options the fetcher reads, checked: a bad one fails that target, naming the option.
    Other keys are the app's, and left alone."""
    parsed: Any = options
    if options is None or (isinstance(options, str) and not options.strip()):
        parsed = {}
    elif isinstance(options, str):
        try:
            parsed = json.loads(options)
        except ValueError:
            raise Fail("options: not JSON") from None
    if not isinstance(parsed, Mapping):
        raise Fail(f"options: must be a JSON object for the fetcher, got {type(parsed).__name__}")
    return _Options(
        headers=_headers(parsed.get("headers", {})),
        timeout=_timeout(parsed.get("timeout", DEFAULT_TIMEOUT)),
        max_bytes=_bounded("max_bytes", parsed.get("max_bytes", DEFAULT_MAX_BYTES), 1, MAX_RESULT_BYTES),
        max_redirects=_bounded(
            "max_redirects", parsed.get("max_redirects", DEFAULT_MAX_REDIRECTS), 0, MAX_REDIRECTS
        ),
        base64=_body_mode(parsed.get("body", "text")),
    )


def _headers(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise Fail(f"options.headers: must be an object of names to text, got {type(value).__name__}")
    headers: dict[str, str] = {}
    for name, text in value.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise Fail(f"options.headers: {_show(repr(name))} is not a header name")
        if name.lower() == "host":
            raise Fail("options.headers: Host is the URL's host, and cannot be set")
        if not isinstance(text, str) or any(c in text for c in "\r\n\x00"):
            raise Fail(f"options.headers: the value of {name} must be text on one line")
        headers[name] = text
    return headers


def _timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < math.inf):
        raise Fail(f"options.timeout: must be a number of seconds > 0, got {_show(repr(value))}")
    return float(value)


def _bounded(name: str, value: object, least: int, most: int) -> int:
    if type(value) is not int or not least <= value <= most:
        raise Fail(f"options.{name}: must be an int from {least} to {most}, got {_show(repr(value))}")
    return value


def _body_mode(value: object) -> bool:
    if value not in ("text", "base64"):
        raise Fail(f'options.body: must be "text" or "base64", got {_show(repr(value))}')
    return value == "base64"


def _checked_url(url: str) -> SplitResult:
    """The URL split, if it is one the fetcher may fetch: the scheme rule, never lifted."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- a port Python cannot read raises here, not later
    except ValueError as e:
        raise Fail(storable_message(f"refused {_show(url)}: not a URL the fetcher can read ({e})")) from None
    if parts.scheme.lower() not in _SCHEMES:
        raise Fail(storable_message(f"refused {_show(url)}: only http and https URLs are fetched"))
    if not parts.hostname:
        raise Fail(storable_message(f"refused {_show(url)}: no host"))
    if parts.username is not None or parts.password is not None:
        problem = "credentials in a URL are not sent (use options.headers)"
        raise Fail(storable_message(f"refused {_show(url)}: {problem}"))
    return parts


def _host_name(parts: SplitResult) -> str:
    """The host as DNS and TLS know it: IDNA A-labels (UTS #46, as ``url_host`` reads names) for a name,
    the address for an IP literal. A name DNS cannot hold fails the target: no lookup would find it."""
    host = (parts.hostname or "").rstrip(".")
    if not host.isascii():
        try:
            host = idna.encode(host, uts46=True, transitional=False).decode("ascii")
        except (idna.IDNAError, UnicodeError):
            host = ""
    if ":" not in host and not _DNS_NAME.fullmatch(host):
        raise Fail(storable_message(f"refused {_show(parts.geturl())}: the host is not a valid name"))
    return host


def _resolve(parts: SplitResult, allowed: tuple[_Network, ...] | None) -> list[str]:
    """Every address of the URL's host, each one allowed: one not allowed refuses the URL."""
    host = _host_name(parts)
    port = parts.port or _SCHEMES[parts.scheme.lower()]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise Retry(storable_message(f"cannot resolve {host}: {e}")) from None
    addresses = list(dict.fromkeys(str(info[4][0]).partition("%")[0] for info in infos))
    for text in addresses:
        address = ipaddress.ip_address(text)
        if not _address_allowed(address, allowed):
            named = "" if ipaddress.ip_address(text) == _literal(host) else f" ({host} resolves to it)"
            problem = f"{address} is not a public address{named}"
            raise Fail(storable_message(f"refused {_show(parts.geturl())}: {problem}"))
    if not addresses:
        raise Retry(storable_message(f"cannot resolve {host}: no address"))
    return addresses


def _literal(host: str) -> _Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _address_allowed(address: _Address, allowed: tuple[_Network, ...] | None) -> bool:
    if allowed is None:
        return True
    if any(address.version == n.version and address in n for n in allowed):
        return True
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:  # the IPv4 address is the one reached, and decides
            return _address_allowed(embedded, allowed)
    return address.is_global and not (
        address.is_multicast
        or address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_reserved
        or address.is_unspecified
        # fec0::/10, deprecated (RFC 3879) and never public: Python 3.11 still counts it global
        or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)
    )


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or ""), parts.port or _SCHEMES.get(scheme)


def _remaining(deadline: float, url: str) -> float:
    left = deadline - monotonic()
    if left <= 0:
        raise Retry(storable_message(f"timed out fetching {_show(url)}"))
    return left


def _time_left(deadline: float) -> float:
    left = deadline - monotonic()
    if left <= 0:
        raise TimeoutError("timed out")  # what a socket's own timeout raises
    return left


class _DeadlineSocket(socket.socket):
    """A socket each of whose reads and writes waits at most until ``deadline`` (``monotonic``): a timeout
    set once bounds each wait alone, and a peer sending a byte at a time would reset it at every byte."""

    deadline = math.inf

    @classmethod
    def adopt(cls, sock: socket.socket, deadline: float) -> _DeadlineSocket:
        """``sock``'s connection, now read and written by the new socket (``sock`` is left detached)."""
        adopted = cls(sock.family, sock.type, sock.proto, sock.detach())
        adopted.deadline = deadline
        try:
            adopted.settimeout(_time_left(deadline))
        except BaseException:
            adopted.close()  # past the deadline already: the connection is not handed on
            raise
        return adopted

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self.settimeout(_time_left(self.deadline))
        return super().recv(bufsize, flags)

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        self.settimeout(_time_left(self.deadline))
        return super().recv_into(buffer, nbytes, flags)

    def send(self, data: ReadableBuffer, flags: int = 0) -> int:
        self.settimeout(_time_left(self.deadline))
        return super().send(data, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        self.settimeout(_time_left(self.deadline))
        super().sendall(data, flags)


class _DeadlineSSLSocket(ssl.SSLSocket):
    """:class:`_DeadlineSocket` over TLS, made by the fetcher's SSL context: ``deadline`` is set once the
    handshake is done, which the plain socket's timeout (the time left then) bounds as a whole."""

    deadline = math.inf

    def _wait_left(self) -> None:
        if self.deadline < math.inf:
            self.settimeout(_time_left(self.deadline))

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        self._wait_left()
        return super().recv(buflen, flags)

    def recv_into(self, buffer: WriteableBuffer, nbytes: int | None = None, flags: int = 0) -> int:
        self._wait_left()
        return super().recv_into(buffer, nbytes, flags)

    def send(self, data: ReadableBuffer, flags: int = 0) -> int:  # sendall sends through it
        self._wait_left()
        return super().send(data, flags)


class _Connection(HTTPConnection):
    """urllib3's connection, over a :class:`_DeadlineSocket` that ends at the fetch's deadline."""

    def __init__(self, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline

    def _new_conn(self) -> socket.socket:
        return _DeadlineSocket.adopt(super()._new_conn(), self.deadline)


class _TLSConnection(HTTPSConnection):
    """urllib3's TLS connection, over a :class:`_DeadlineSocket` and, once TLS is up, a
    :class:`_DeadlineSSLSocket`: both end at the fetch's deadline."""

    def __init__(self, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline

    def _new_conn(self) -> socket.socket:
        return _DeadlineSocket.adopt(super()._new_conn(), self.deadline)

    def connect(self) -> None:
        super().connect()
        if isinstance(self.sock, _DeadlineSSLSocket):
            self.sock.deadline = self.deadline


def _tls_context() -> ssl.SSLContext:
    """urllib3's default context, whose sockets are :class:`_DeadlineSSLSocket`: given a context, urllib3
    leaves loading the system's trusted certificates to it."""
    context = create_urllib3_context()
    context.load_default_certs()
    context.sslsocket_class = _DeadlineSSLSocket
    return context


def _get(
    parts: SplitResult, addresses: list[str], headers: dict[str, str], deadline: float
) -> tuple[urllib3.HTTPConnectionPool, urllib3.BaseHTTPResponse]:
    """The response to a GET of ``parts`` from the first of ``addresses`` that answers (no other lookup)."""
    scheme = parts.scheme.lower()
    host = _host_name(parts)
    port = parts.port or _SCHEMES[scheme]
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = f"[{host}]" if ":" in host else host
    if port != _SCHEMES[scheme]:
        host_header = f"{host_header}:{port}"
    url = parts.geturl()
    failure: Exception | None = None
    for address in addresses:
        left = _remaining(deadline, url)
        pool: urllib3.HTTPConnectionPool
        if scheme == "https":
            pool = urllib3.HTTPSConnectionPool(
                address,
                port,
                maxsize=1,
                retries=False,
                server_hostname=host,
                assert_hostname=host,
                ssl_context=_tls_context(),
                deadline=deadline,
            )
            pool.ConnectionCls = _TLSConnection
        else:
            pool = urllib3.HTTPConnectionPool(address, port, maxsize=1, retries=False, deadline=deadline)
            pool.ConnectionCls = _Connection
        try:
            response = pool.urlopen(
                "GET",
                target,
                headers={"Host": host_header, **headers},
                retries=False,
                redirect=False,
                preload_content=False,
                # the connect's bound; every read and write after it ends at the deadline (_DeadlineSocket)
                timeout=urllib3.Timeout(connect=left, read=left),
                release_conn=False,
            )
        except (Urllib3Error, OSError) as e:
            pool.close()
            failure = e
            continue
        return pool, response
    raise Retry(storable_message(f"cannot fetch {_show(url)}: {failure}"))


def _outcome(response: urllib3.BaseHTTPResponse, url: str) -> str | None:
    """None for a 2xx; the ``Location`` of a redirect to follow; else the status's Retry or Fail."""
    status = response.status
    if 200 <= status < 300:
        return None
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    error = storable_message(f"HTTP {status} {phrase}".rstrip() + f" from {_show(url)}")
    if status in _REDIRECTS:
        location = response.headers.get("Location")
        if not location:
            raise Fail(error + ": a redirect without a Location")
        return location
    if status in (429, 503):
        after = _retry_after(response.headers.get("Retry-After"))
        if after is not None:
            raise Retry(error, after, host_wide=True)
        raise Retry(error)
    if status >= 500:
        raise Retry(error)
    raise Fail(error)


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds from now (delay-seconds or an HTTP-date, in any of its three forms), at
    most RETRY_AFTER_MOST; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if _DIGITS.fullmatch(value):  # ASCII digits only: str.isdigit() takes "²", which int() refuses
        digits = value.lstrip("0")
        # a number longer than the most is over it (and int() refuses one of over 4,300 digits)
        if len(digits) > len(str(RETRY_AFTER_MOST)):
            return float(RETRY_AFTER_MOST)
        return float(min(int(digits or "0"), RETRY_AFTER_MOST))
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:  # the asctime form names no zone: every HTTP-date is GMT
            when = when.replace(tzinfo=UTC)
        return float(min(max(0, math.ceil(when.timestamp() - unix_now())), RETRY_AFTER_MOST))
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _body(response: urllib3.BaseHTTPResponse, url: str, options: _Options, deadline: float) -> str:
    """The body, at most ``max_bytes`` of it, as the target's result."""
    length = response.headers.get("Content-Length", "")
    too_big = f"the body of {_show(url)} is over {options.max_bytes} bytes (options.max_bytes)"
    too_big = storable_message(too_big)
    # ASCII digits only, and never int() of more digits than the cap's (it refuses 4,300, zeros included)
    digits = length.lstrip("0") or "0"
    over = _DIGITS.fullmatch(length) is not None and (
        len(digits) > len(str(options.max_bytes)) or int(digits) > options.max_bytes
    )
    if over and "Content-Encoding" not in response.headers:
        raise Fail(too_big)
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            _remaining(deadline, url)  # a clear error past the deadline; the reads themselves end at it
            chunk = response.read1(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > options.max_bytes:
                raise Fail(too_big)
            chunks.append(chunk)
    except (Urllib3Error, OSError) as e:
        raise Retry(storable_message(f"cannot read the body of {_show(url)}: {e}")) from None
    data = b"".join(chunks)
    if options.base64:
        text = base64.b64encode(data).decode("ascii")
    else:
        text = _text(data, response.headers.get("Content-Type")).replace("\x00", "\ufffd")
    if len(text) > MAX_RESULT_BYTES // 4 and len(text.encode("utf-8")) > MAX_RESULT_BYTES:
        raise Fail(storable_message(f"the body of {_show(url)} as text is over {MAX_RESULT_BYTES} bytes"))
    return text


def _text(data: bytes, content_type: str | None) -> str:
    """``data`` decoded with the charset ``Content-Type`` names, else as UTF-8, bytes it cannot read and
    lone surrogates as U+FFFD; as UTF-8 too when Python cannot decode with that charset."""
    charset = _charset(content_type)
    try:
        text = data.decode(charset, "replace")
    except (LookupError, ValueError):
        # LookupError: a name Python does not know, or a bytes-to-bytes codec (base64); ValueError: a
        # codec that raises whatever the error handler (idna, punycode, undefined), or a NUL in the name
        return data.decode("utf-8", "replace")
    if text.isascii() or codecs.lookup(charset).name == "utf-8":
        return text
    # some codecs decode to surrogates whatever the error handler (utf-7, unicode_escape): a pair is joined
    # into its character, a lone one (which no store text may hold) becomes U+FFFD
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _charset(content_type: str | None) -> str:
    """The charset ``Content-Type`` names; UTF-8 when it names none."""
    if not content_type:
        return "utf-8"
    message = email.message.Message()
    message["Content-Type"] = content_type
    charset = message.get_param("charset")
    return charset if isinstance(charset, str) else "utf-8"
