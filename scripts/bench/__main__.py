"""``python scripts/bench``: run the bench (see the package's docstring)."""

import sys
from pathlib import Path

# Run as a directory, Python puts scripts/bench itself first on sys.path; the package's modules import
# each other as ``bench.*``, so its parent goes there instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.cli import main  # noqa: E402 (after the path it needs)

if __name__ == "__main__":
    sys.exit(main())
