"""SQL kept in files beside the code that runs it (procrastinate's way): named sections of statements.

A file holds sections, each headed by a line ``-- name: NAME``. In a section, each statement ends with
``;`` at the end of a line, followed by a blank line or the section's end; comment lines (``--``) before
a statement say why, and are not part of it.
"""

from __future__ import annotations

import importlib.resources

__all__ = ["load_sql"]

_HEADER = "-- name: "


def load_sql(package: str, filename: str) -> dict[str, tuple[str, ...]]:
    """The statements of each section of ``filename`` (package data of ``package``), in order."""
    text = importlib.resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    lines: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith(_HEADER):
            current = sections.setdefault(line[len(_HEADER) :].strip(), [])
        elif not line.strip():
            if lines:
                if current is None:
                    raise ValueError(f"{filename}: a statement before the first section")
                current.append("\n".join(lines).removesuffix(";"))
                lines = []
        elif lines or not line.startswith("--"):
            lines.append(line)
    return {name: tuple(statements) for name, statements in sections.items()}
