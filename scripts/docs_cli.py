"""Write docs/reference/cli.md from the ``sift`` command's own parser, so the page cannot drift from it.

    python scripts/docs_cli.py           # rewrite the page
    python scripts/docs_cli.py --check   # exit 1 if the page is not what the parser says (tests run this)

The help is formatted at a fixed width of 100 columns, whatever the terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"
WIDTH = "100"

HEAD = """\
# The `sift` command

Every command and option of `sift`, as `sift COMMAND --help` prints it. This page is written by
`python scripts/docs_cli.py` from the command's parser, and a test fails when it is not current.
`python -m sift` is the same command. Errors and exit statuses: see [Errors](errors.md).
"""


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-parsers of ``parser``, in the order ``sift --help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise LookupError("the sift parser has no sub-commands")


def page() -> str:
    """The reference page: the top-level help, then one section per command."""
    os.environ["COLUMNS"] = WIDTH
    from sift.cli import build_parser

    parser = build_parser()
    parts = [HEAD, "## `sift`\n", "<!-- generated: scripts/docs_cli.py -->", fence(parser.format_help())]
    for name, sub in subcommands(parser).items():
        parts += [f"## `sift {name}`\n", "<!-- generated: scripts/docs_cli.py -->", fence(sub.format_help())]
    return "\n".join(parts)


def fence(text: str) -> str:
    return f"```text\n{text.rstrip()}\n```\n"


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    args.add_argument("--check", action="store_true", help="exit 1 if the page is not current")
    check = args.parse_args(argv).check
    text = page()
    if check:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE} is not current: run python scripts/docs_cli.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
