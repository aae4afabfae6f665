"""Run the shell transcripts of the docs again and write their output into the pages, so no transcript is
written by hand.

    python scripts/docs_transcripts.py           # rewrite every transcript
    python scripts/docs_transcripts.py --check   # exit 1 if one is not current (the tests run this)

A transcript is a ``console`` block of docs/ after the comment
``<!-- generated: scripts/docs_transcripts.py -->``. Its ``$ `` lines are run one after another by bash,
in a new empty directory holding a new empty store ``sim.db`` (``$SIFT_DB``) and a copy of the README,
with the ``sift`` of this Python; each command's standard output and error follow it, and a blank line
ends it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARKER = "<!-- generated: scripts/docs_transcripts.py -->"
BLOCK = re.compile(re.escape(MARKER) + r"\n```console\n(.*?)```\n", re.S)


def commands(transcript: str) -> list[str]:
    return [line[2:] for line in transcript.splitlines() if line.startswith("$ ")]


def run(lines: list[str]) -> str:
    """The transcript of ``lines`` run in a new directory with a new store."""
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "SIFT_DB": "sim.db",
        "COLUMNS": "100",
        "LC_ALL": "C.UTF-8",
    }
    with tempfile.TemporaryDirectory(prefix="sift-docs-") as where:
        shutil.copy(ROOT / "README.md", where)
        subprocess.run(["sift", "init"], cwd=where, env=env, check=True, capture_output=True)
        out: list[str] = []
        for line in lines:
            done = subprocess.run(
                ["bash", "-c", line],
                cwd=where,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            out.append(f"$ {line}\n{done.stdout}")
    return "\n".join(out)


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: f"{MARKER}\n```console\n{run(commands(m.group(1)))}```\n", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a transcript is not current")
    check = parser.parse_args(argv).check
    stale = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        new = regenerate(text)
        if new != text:
            stale.append(page)
            if not check:
                page.write_text(new, encoding="utf-8")
    if check and stale:
        for page in stale:
            print(
                f"{page}: a transcript is not current: run python scripts/docs_transcripts.py",
                file=sys.stderr,
            )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
