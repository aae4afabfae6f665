"""What counts as one host: the host a target's URL names, as politeness limits count it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

__all__ = ["backfill_hosts", "url_host"]


def url_host(url: str) -> str:
    """The host of ``url``: its authority's host name, lower-cased, without userinfo, port, IPv6 brackets
    or a trailing dot (``https://User@Example.COM.:8443/x`` is ``example.com``). A URL without an authority
    (no ``//``), or one Python cannot split, has the host ``""``: all such URLs count as one host."""
    try:
        host = urlsplit(url).hostname
    except ValueError:  # an unbalanced IPv6 bracket
        return ""
    return (host or "").rstrip(".")


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
