"""Write the tables of docs/explanation/performance.md's "The latest run" from the bench's JSON output.

    python scripts/bench --json docs/explanation/bench.json   # a full run, minutes
    python scripts/docs_bench.py                              # rewrite the tables from that file
    python scripts/docs_bench.py --check                      # exit 1 if the page is not current (tests)

The tables go between the page's ``<!-- bench-tables: ... -->`` comments; the text around them is kept.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent / "docs" / "explanation"
PAGE = DOCS / "performance.md"
RUN = DOCS / "bench.json"
BEGIN = "<!-- bench-tables: written by python scripts/docs_bench.py from docs/explanation/bench.json -->"
END = "<!-- bench-tables: end -->"


def tables(run: dict[str, Any]) -> str:
    """The run's head (command, date, machine), its cases and its goals, as Markdown."""
    machine = run["machine"]
    server = f", PostgreSQL {machine['postgresql']}" if "postgresql" in machine else ""
    load = run.get("load_average")
    head = [
        f"`{run['command']}`, run on {run['date']} in {run['elapsed_s']:.0f} s"
        + (f" (1-minute load average {load:.1f} when it ended)" if load is not None else "")
        + f": {machine['nproc']} CPUs, {machine['cpu']}; Python {machine['python']}, SQLite "
        + f"{machine['sqlite']}{server}, peewee {machine['peewee']}."
        + (
            " Small sizes (`--quick`): the figures show the script works, not the store's speed."
            if run["quick"]
            else ""
        ),
        "",
        "| case | N | median µs/op | ratio |",
        "|---|--:|--:|--:|",
    ]
    for case in run["cases"]:
        ratio = "" if case["ratio"] is None else f"{case['ratio']:.2f}"
        head.append(f"| `{case['name']}` | {case['n']} | {case['median_us']:.1f} | {ratio} |")
    head += ["", "| goal | value | limit | verdict |", "|---|--:|--:|---|"]
    for goal in run["goals"]:
        limit = "" if goal["limit"] is None else f"≤ {goal['limit']:g} {goal['unit']}"
        head.append(f"| {goal['name']} | {goal['value']:.2f} {goal['unit']} | {limit} | {goal['verdict']} |")
    verdicts = [goal["verdict"] for goal in run["goals"]]
    head += ["", f"{verdicts.count('PASS')} goals passed and {verdicts.count('FAIL')} failed in this run."]
    return "\n".join(head)


def page(text: str, run: dict[str, Any]) -> str:
    """``text`` with the tables between its two markers replaced by the run's."""
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    return f"{before}{BEGIN}\n\n{tables(run)}\n\n{END}{after}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not current")
    check = parser.parse_args(argv).check
    text = PAGE.read_text(encoding="utf-8")
    wanted = page(text, json.loads(RUN.read_text(encoding="utf-8")))
    if check:
        if text != wanted:
            print(
                f"{PAGE}: the bench tables are not current: run python scripts/docs_bench.py", file=sys.stderr
            )
            return 1
        return 0
    PAGE.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
