"""The README and the pages of docs/, and their fenced code blocks.

A block is run by the tests in one of three ways, said by the HTML comment on the line before it:
``<!-- block: NAME -->`` (a test reads it with ``block("NAME")`` and runs it its own way),
``<!-- generated: SCRIPT -->`` (SCRIPT writes it and a test checks it is current), or
``<!-- no-run: REASON -->`` (not run, for REASON). An unmarked ``python`` block runs as it stands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

MARKER = re.compile(r"<!-- (block|generated|no-run): (.+?) -->")
FENCE = re.compile(r"^(`{3,})(\S*)")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its marker (kind and text) and its code."""

    path: Path
    line: int
    language: str
    kind: str | None
    marker: str | None
    code: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """The README and every page of docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def page_blocks(path: Path) -> list[Block]:
    """The fenced blocks of one page, in order."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        ticks, language = opening.groups()
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marked = MARKER.fullmatch(before.strip())
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == ticks)
        found.append(
            Block(
                path,
                i + 1,
                language,
                marked.group(1) if marked else None,
                marked.group(2) if marked else None,
                "\n".join(lines[i + 1 : end]) + "\n",
            )
        )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for path in pages() for b in page_blocks(path)]


def block(name: str) -> str:
    """The code of the block marked ``<!-- block: name -->``: a name used on several pages (the README and
    the tutorial) marks the same text on each."""
    texts = {b.code for b in all_blocks() if b.kind == "block" and b.marker == name}
    assert len(texts) == 1, f"{len(texts)} different blocks named {name!r}"
    return texts.pop()


def block_path(name: str) -> str:
    """Where the block named ``name`` is, for compile()'s file name."""
    return next(b.where() for b in all_blocks() if b.kind == "block" and b.marker == name)
