"""What counts as one host: the site a target's URL names, one name for all its spellings, as politeness
limits count it."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["backfill_hosts", "site_name", "url_host"]


def url_host(url: str) -> str:
    """The host of ``url``: the :func:`site_name` of its authority's host, without userinfo, port or IPv6
    brackets (``https://User@Example.COM.:8443/x`` is ``example.com``). A URL without an authority (no
    ``//``), or one Python cannot split, has the host ``""``: all such URLs count as one host."""
    if url.isascii() and url[:1] > " " and not ("\t" in url or "\r" in url or "\n" in url):
        # nothing urlsplit strips or removes: its authority is what _PLAIN_AUTHORITY reads, each name once
        plain = _PLAIN_AUTHORITY.match(url)
        if plain is not None:
            netloc = plain.group(1)
            return (
                _cached_authority_host(netloc) if len(netloc) <= _CACHED_LENGTH else _authority_host(netloc)
            )
    try:
        netloc = urlsplit(url).netloc
    except ValueError:  # an unbalanced IPv6 bracket, or a netloc NFKC would change into another one
        return ""
    return _authority_host(netloc)


#: A URL's scheme and its authority (up to the first ``/``, ``?`` or ``#``) as urlsplit reads them from an
#: ASCII URL it strips nothing from, where the authority has no IPv6 bracket (those take urlsplit's checks).
_PLAIN_AUTHORITY = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://([^/?#\[\]]*)(?![^/?#])")


def _authority_host(netloc: str) -> str:
    """The site name of an authority's host: without userinfo, port or IPv6 brackets."""
    hostinfo = netloc.rpartition("@")[2]
    if hostinfo[:1] == "[":
        return _ipv6_name(hostinfo[1:].partition("]")[0])
    return site_name(hostinfo.partition(":")[0])


def site_name(host: str) -> str:
    """One name per site: an IPv4 address in any spelling WHATWG URLs accept as its dotted quad, any other
    name as its lower-case IDNA A-labels (UTS #46, non-transitional), without a trailing dot. A name IDNA
    refuses stays as written, lower-cased: never an error, since every insert computes it."""
    if "%" in host:  # a URL's host may be percent-encoded (UTF-8), as WHATWG URLs decode it
        host = unquote(host, errors="replace")
    # IDNA maps no ASCII character but the upper-case letters: lower-cased, an ASCII name is its A-labels, or
    # a name IDNA refuses (and then stays as written, lower-cased): either way, the idna package is not needed
    if host.isascii():
        name = host.lower().rstrip(".")
    else:  # cached: the idna package takes tens of µs a name; a long name is not kept (memory)
        name = _cached_idna_name(host) if len(host) <= _CACHED_LENGTH else _idna_name(host)
    last = name.rpartition(".")[2]
    if last.isdigit() or last[:2] == "0x":  # WHATWG's "ends in a number": an IPv4 address or no host
        return _ipv4_name(name)
    return name


#: The longest non-ASCII host whose IDNA name is cached (a DNS name has at most 253 characters).
_CACHED_LENGTH = 256


def _idna_name(host: str) -> str:
    """``host`` (not all ASCII) as IDNA A-labels, or as written, lower-cased, where IDNA refuses it."""
    try:
        import idna  # only a non-ASCII name needs it: importing the package stays light

        return idna.encode(host, uts46=True, transitional=False).decode("ascii").rstrip(".")
    except ValueError:  # idna.IDNAError, or anything else the package raises for a name it cannot encode
        return host.lower().rstrip(".")


_cached_idna_name = lru_cache(maxsize=4096)(_idna_name)
# a job's targets mostly share a few hosts: each authority's name is worked out once
_cached_authority_host = lru_cache(maxsize=4096)(_authority_host)

_DIGITS = "0123456789abcdef"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#: A dotted quad already in its one spelling.
_QUAD = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}")


def _ipv4_name(name: str) -> str:
    """The dotted quad of ``name`` read as WHATWG's IPv4 parser reads it (``2130706433``, ``0x7f000001``,
    ``0177.0.0.1``, ``127.1``), or ``name`` itself where that parser refuses it."""
    if _QUAD.fullmatch(name):
        return name
    parts = name.split(".")
    if len(parts) > 4:
        return name
    numbers = []
    for part in parts:
        base = 10
        if part[:2] == "0x":
            part, base = part[2:], 16
        elif len(part) > 1 and part[0] == "0":
            part, base = part[1:], 8
        if part.strip(_DIGITS[:base]) or not (part or base != 10):  # int() alone takes "_", "+", "٣"
            return name
        numbers.append(int(part, base) if part else 0)
    last = numbers.pop()
    if any(not 0 <= n <= 255 for n in numbers) or last >= 256 ** (4 - len(numbers)):
        return name
    for i, n in enumerate(numbers):
        last += n << (8 * (3 - i))
    return f"{last >> 24}.{last >> 16 & 255}.{last >> 8 & 255}.{last & 255}"


def _ipv6_name(host: str) -> str:
    """An IPv6 address compressed, or its IPv4 address where it maps one (``::ffff:127.0.0.1``); a
    bracketed host that is no IPv6 address, as written, lower-cased."""
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return host.lower()
    return str(address.ipv4_mapped or address)


#: How many targets one step of :func:`backfill_hosts` reads.
BACKFILL_CHUNK = 5000

Fetch = Callable[[str, Sequence[Any]], list[Any]]
RunMany = Callable[[str, list[tuple[Any, ...]]], Any]


def backfill_hosts(fetch: Fetch, run_many: RunMany, param: str) -> int:
    """Inside the upgrade's transaction: set every target's ``host`` to ``url_host(url)``, reading the
    targets in key order, :data:`BACKFILL_CHUNK` at a time. Returns how many targets changed."""
    select = (
        f"SELECT job_id, idx, url, host FROM batch_target WHERE job_id > {param} "
        f"OR (job_id = {param} AND idx > {param}) ORDER BY job_id, idx LIMIT {BACKFILL_CHUNK}"
    )
    first = f"SELECT job_id, idx, url, host FROM batch_target ORDER BY job_id, idx LIMIT {BACKFILL_CHUNK}"
    update = f"UPDATE batch_target SET host = {param} WHERE job_id = {param} AND idx = {param}"
    changed = 0
    rows = fetch(first, ())
    while rows:
        moved = [(host, job_id, idx) for job_id, idx, url, old in rows if (host := url_host(url)) != old]
        if moved:
            run_many(update, moved)
            changed += len(moved)
        if len(rows) < BACKFILL_CHUNK:
            break
        job_id, idx = rows[-1][0], rows[-1][1]
        rows = fetch(select, (job_id, job_id, idx))
    return changed
