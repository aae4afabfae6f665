"""Which stores a run measures: SQLite files, and PostgreSQL schemas on a server that answers."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoreUnderTest:
    """The kind of store a group runs on: the prefix of its case names and of its goals."""

    name: str
    prefix: str
    goal_prefix: str


SQLITE = StoreUnderTest("sqlite", "", "")
POSTGRES = StoreUnderTest("postgresql", "pg/", "PostgreSQL: ")


#: The server a run without --db also measures, when one answers there: the test suite's.
DEFAULT_POSTGRES = os.environ.get("SIFT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def postgres_missing(url: str) -> str | None:
    """Why no PostgreSQL part can run at ``url`` (no psycopg, no server answering), or None."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed (pip install 'sift[postgres]'): {exc}"
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"no PostgreSQL server answers at {url}: {' '.join(str(exc).split())}"
    return None


class PgServer:
    """The PostgreSQL database the bench works in. Every store lives in a fresh schema of its own, named
    after this run (``sift_bench_<pid>_<random>_<label>``), and is dropped when the group is done, or at the
    end whatever happens; nothing else on the server is touched."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.url = url
        self.tag = f"sift_bench_{os.getpid()}_{secrets.token_hex(3)}"
        self.schemas: list[str] = []
        self.admin = psycopg.connect(url, autocommit=True, connect_timeout=5)
        self.version = str(self.admin.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]

    def new_schema(self, label: str) -> str:
        """A schema name of this run's, dropped at the latest by :meth:`close`."""
        schema = f"{self.tag}_{label}"
        self.schemas.append(schema)
        return schema

    def target(self, schema: str) -> str:
        """What open_db opens: the schema's store; its connections carry the schema's name as their
        application_name, so pg_stat_activity tells them apart from everyone else's."""
        joiner = "&" if "?" in self.url else "?"
        return f"{self.url}{joiner}application_name={schema}&schema={schema}"

    def connect(self, schema: str) -> Any:
        """A plain psycopg connection in autocommit mode, in the schema."""
        import psycopg

        return psycopg.connect(self.url, autocommit=True, options=f"-c search_path={schema}")

    def drop(self, schema: str) -> None:
        """Drop the schema and all it holds."""
        self.admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        self.schemas.remove(schema)

    def close(self) -> None:
        """Drop every schema of this run's still there."""
        for schema in list(self.schemas):
            self.drop(schema)
        self.admin.close()
