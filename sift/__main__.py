"""``python -m sift``: the same as the ``sift`` command."""

from sift.cli import main

raise SystemExit(main())
