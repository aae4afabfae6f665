"""A host's journal: JSON lines it alone appends to, each record one unbuffered ``write(2)``, so a SIGKILL
of the host loses no record whose call returned."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["Journal", "JournalReader", "read_journal"]


class Journal:
    """A host's record of what it did: JSON lines, each one unbuffered ``write(2)`` in append mode."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.lock = threading.Lock()

    def write(self, **record: Any) -> None:
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
        with self.lock:
            os.write(self.fd, line)

    def close(self) -> None:
        os.close(self.fd)


class JournalReader:
    """Reads the records appended to a journal since the last call (a line still being written waits)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.records: list[dict[str, Any]] = []

    def new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        fresh = [json.loads(line) for line in data[:end].splitlines()]
        self.records += fresh
        return fresh


def read_journal(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a journal."""
    reader = JournalReader(str(path))
    reader.new()
    return reader.records
