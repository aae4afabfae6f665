"""Round trips and time of ``claim_batch_targets`` on PostgreSQL (docs/explanation/performance.md).

For each shape of claim, a schema of its own on the server (made, then dropped) gets the shape's jobs,
one per caller, and the store's own functions claim from it: the statements one claim sends to the
server, counted by wrapping psycopg's ``Cursor.execute`` (each one a round trip), and the mean time of
``--claims`` claims of 20 from 20 callers' jobs of 500 targets on 50 hosts. It uses only the public API,
so it runs against any checkout of sift (``PYTHONPATH=that/tree``).

    python scripts/claim_round_trips.py                  # $SIFT_TEST_POSTGRES, or the local server
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from sift import dcache
from sift.testing import make_job

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
#: The counted claims: (label, callers, targets a job, hosts, claim size, keywords).
COUNTED: list[tuple[str, int, int, int, int, dict[str, Any]]] = [
    ("10 from 3 callers' jobs (fair)", 3, 5, 4, 10, {}),
    ("50 from 50 callers' jobs (fair)", 50, 5, 4, 50, {}),
    ("10 from 3 callers' jobs, per_host=2", 3, 5, 4, 10, {"per_host": 2}),
    ("10 from 3 callers' jobs, fair=False", 3, 5, 4, 10, {"fair": False}),
]
#: The timed claims: the keywords of each.
TIMED: list[tuple[str, dict[str, Any]]] = [
    ("fair", {}),
    ("fair=False", {"fair": False}),
    ("per_host=2", {"per_host": 2}),
]


@contextmanager
def store(server: str, prefix: str, callers: int, targets: int, hosts: int) -> Iterator[None]:
    """An open store in a schema of its own (``prefix`` and a random part) with one job a caller, dropped
    afterwards."""
    schema = f"{prefix}_{secrets.token_hex(4)}"
    dcache.open_db(f"{server}{'&' if '?' in server else '?'}schema={schema}")
    try:
        for c in range(callers):
            job = make_job(
                id=f"job-{c}", caller=f"caller-{c:02}", targets_total=targets, created_at=100, lease=100
            )
            dcache.create_batch_job(
                job,
                [
                    dcache.BatchTarget(idx=i, url=f"https://h{i % hosts}.example/{i}", options="{}")
                    for i in range(targets)
                ],
            )
        yield
    finally:
        dcache.close_db()
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def round_trips(**claim: Any) -> tuple[int, int]:
    """(targets claimed, statements sent) of one claim."""
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    psycopg.Cursor.execute = counted  # type: ignore[method-assign]
    try:
        claimed = dcache.claim_batch_targets(runner="counted", now=100, **claim)
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    return len(claimed), len(sent)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=os.environ.get("SIFT_TEST_POSTGRES", DEFAULT_SERVER))
    parser.add_argument("--claims", type=int, default=100, help="timed claims a shape (100)")
    parser.add_argument("--schema-prefix", default="sift_claims", help="the schemas' names start so")
    args = parser.parse_args(argv)
    print("| claim | targets | round trips |\n|---|--:|--:|")
    for label, callers, targets, hosts, limit, keywords in COUNTED:
        with store(args.server, args.schema_prefix, callers, targets, hosts):
            claimed, sent = round_trips(limit=limit, **keywords)
        print(f"| {label} | {claimed} | {sent} |")
    print("\n| 20 from 20 callers' jobs of 500 targets on 50 hosts | ms a claim |\n|---|--:|")
    for label, keywords in TIMED:
        with store(args.server, args.schema_prefix, 20, 500, 50):
            dcache.claim_batch_targets(10, runner="warm", now=100, **keywords)
            start = time.perf_counter()
            for _ in range(args.claims):
                dcache.claim_batch_targets(20, runner="timed", now=100, **keywords)
            print(f"| {label} | {(time.perf_counter() - start) * 1000 / args.claims:.1f} |")


if __name__ == "__main__":
    main()
