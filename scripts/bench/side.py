"""One side of a comparison: ``python -m bench.side TARGET TREE``, with ``PYTHONPATH`` naming TREE (whose
``sift`` it measures) and the directory holding this ``bench``.

It creates the store at TARGET and prints ``created``; on the line ``open`` (once the bench has filled the
store) it opens it, warms each compared hot path up and prints ``ready``; then it answers each line
``CASE COUNT`` with the µs per call of the next COUNT calls of CASE, and closes the store at the end of its
input. It imports ``sift.dcache``'s public API only: TREE may be any commit's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import sift
from sift import dcache

from .cases.hot_paths import COMPARED_CASES, compared_paths
from .harness import time_batch
from .sizes import T0

#: The comparison's clock: after every lease of its fixture.
NOW = T0 + 10**6


def main(target: str, tree: Path, warmup: int) -> None:
    """Serve the comparison (see the module's docstring); refuse a ``sift`` from outside ``tree``."""
    here = Path(sift.__file__).resolve()
    if not here.is_relative_to(tree.resolve()):
        raise SystemExit(f"bench.side: sift comes from {here}, not from {tree}")
    dcache.open_db(target)
    dcache.close_db()
    print("created", flush=True)
    if sys.stdin.readline().strip() != "open":
        return
    dcache.open_db(target)
    ops = compared_paths(NOW)
    calls = dict.fromkeys(COMPARED_CASES, 0)  # each case's next call: the runner step's next target
    for case in COMPARED_CASES:
        time_batch(ops[case], 0, warmup)
        calls[case] += warmup
    print("ready", flush=True)
    for line in sys.stdin:
        case, count = line.split()
        print(time_batch(ops[case], calls[case], int(count)), flush=True)
        calls[case] += int(count)
    dcache.close_db()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
