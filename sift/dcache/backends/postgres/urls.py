"""PostgreSQL targets: ``postgresql://`` URLs, the schema a store lives in, and what is shown of them
(never a password)."""

from __future__ import annotations

import re
import urllib.parse

from ...errors import StoreUnavailable

__all__ = [
    "SECRET_PARAMETERS",
    "SYSTEM_SCHEMAS",
    "URL_PARAMETERS",
    "parse_target",
    "shown_target",
    "shown_url",
    "url_secrets",
]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


#: Query parameters of a libpq URL that hold a secret: never shown.
SECRET_PARAMETERS = frozenset({"password", "sslpassword"})

#: The query parameters a target may carry: sift's ``schema`` and libpq's connection parameters, but for
#: the ones sift sets itself (``options``: the search path, lock timeout and read-only mode;
#: ``connect_timeout``: from ``open_db``'s timeout) and ``replication`` (a store is no replication link).
URL_PARAMETERS = frozenset(
    {
        "schema",
        *("host", "hostaddr", "port", "dbname", "user", "password", "passfile", "require_auth"),
        *("channel_binding", "client_encoding", "application_name", "fallback_application_name"),
        *("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout"),
        *("gssencmode", "sslmode", "requiressl", "sslcompression", "sslcert", "sslkey", "sslpassword"),
        *("sslcertmode", "sslrootcert", "sslcrl", "sslcrldir", "sslsni", "requirepeer"),
        *("ssl_min_protocol_version", "ssl_max_protocol_version", "krbsrvname", "gsslib", "gssdelegation"),
        *("service", "target_session_attrs", "load_balance_hosts"),
    }
)

#: PostgreSQL's own schemas (and every name starting with ``pg_``): never a store's.
SYSTEM_SCHEMAS = frozenset({"information_schema", "pg_catalog", "pg_toast"})


def parse_target(target: str) -> tuple[str, str]:
    """The connection URL (``postgresql://``, without sift's own ``schema`` parameter) and the schema
    named by ``?schema=NAME`` of a ``postgresql://`` or ``postgres://`` target. ``public`` only when it is
    named, or when the URL has no ``schema`` parameter at all; a ``schema`` given twice, a system schema
    (``information_schema``, ``pg_*``) and a parameter outside :data:`URL_PARAMETERS` are refused."""
    try:
        parts = urllib.parse.urlsplit(target)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 host; the text may hold a password
        raise StoreUnavailable.of_target(f"not a valid postgresql:// URL ({exc})") from None
    unknown = sorted({key for key, _ in query} - URL_PARAMETERS)
    if unknown:
        raise StoreUnavailable(
            f"url: unknown or sift-set parameter {', '.join(map(repr, unknown))}: a target takes ?schema= "
            "and libpq's connection parameters, but not options, connect_timeout or replication"
        )
    schemas = [value for key, value in query if key == "schema"]
    if len(schemas) > 1:
        raise StoreUnavailable(
            f"schema: named {len(schemas)} times ({', '.join(map(repr, schemas))}); name one"
        )
    schema = schemas[0] if schemas else "public"
    if schema in SYSTEM_SCHEMAS or schema.startswith("pg_"):
        raise StoreUnavailable(
            f"schema: {schema!r} is PostgreSQL's own schema; a store lives in a schema of its own"
        )
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
