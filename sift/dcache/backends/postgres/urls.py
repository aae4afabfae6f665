"""PostgreSQL targets: ``postgresql://`` URLs, the schema a store lives in, and what is shown of them
(never a password)."""

from __future__ import annotations

import re
import urllib.parse

from ...errors import StoreUnavailable

__all__ = ["SECRET_PARAMETERS", "parse_target", "shown_target", "shown_url", "url_secrets"]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


#: Query parameters of a libpq URL that hold a secret: never shown.
SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


def parse_target(target: str) -> tuple[str, str]:
    """The connection URL (``postgresql://``, without sift's own ``schema`` parameter) and the schema
    named by ``?schema=NAME`` (``public`` when absent) of a ``postgresql://`` or ``postgres://`` target."""
    try:
        parts = urllib.parse.urlsplit(target)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 host; the text may hold a password
        raise StoreUnavailable.of_target(f"not a valid postgresql:// URL ({exc})") from None
    schemas = [value for key, value in query if key == "schema"]
    schema = schemas[-1] if schemas else "public"
    if not _SCHEMA_NAME.fullmatch(schema):
        raise StoreUnavailable(
            f"schema: {schema!r} is not a schema name sift uses: lower-case letters, digits and _, "
            "starting with a letter or _, at most 63 characters"
        )
    rest = urllib.parse.urlencode([(key, value) for key, value in query if key != "schema"])
    url = urllib.parse.urlunsplit(("postgresql", parts.netloc, parts.path, rest, parts.fragment))
    return url, schema


def shown_url(url: str) -> str:
    """``url`` as shown in messages: without the password of its user part or of its query."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}@{host}"
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)]
    shown = [(k, "***" if k in SECRET_PARAMETERS else v) for k, v in query]
    return urllib.parse.urlunsplit(
        (parts.scheme, netloc, parts.path, urllib.parse.urlencode(shown, safe="*"), "")
    )


def url_secrets(url: str) -> tuple[str, ...]:
    """The passwords ``url`` holds, as written and decoded: a driver's message may quote either."""
    parts = urllib.parse.urlsplit(url)
    found = [parts.netloc.rpartition("@")[0].partition(":")[2]] if "@" in parts.netloc else []
    found += [
        v for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k in SECRET_PARAMETERS
    ]
    decoded = [urllib.parse.unquote(secret) for secret in found]
    return tuple(sorted({secret for secret in found + decoded if secret}, key=len, reverse=True))


def shown_target(url: str, schema: str) -> str:
    """The target as shown in messages: without a password."""
    shown = shown_url(url)
    return f"{shown}{'&' if '?' in shown else '?'}schema={schema}"
