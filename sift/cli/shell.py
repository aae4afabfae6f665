"""``sift shell``: an interactive Python console on the open store, like ``flask shell``."""

from __future__ import annotations

import argparse
import code
import importlib
import importlib.util
import sys
import textwrap
from typing import Any

from sift import dcache

__all__ = ["banner", "cmd_shell", "namespace"]

MODELS = ("BatchJob", "BatchTarget", "JobStatus", "TargetStatus", "CallerClass")


def namespace() -> dict[str, Any]:
    """What the console starts with: every public name of ``sift.dcache`` (``db``, the models, the status
    enums, the functions, the errors), and the package itself as ``dcache``."""
    names: dict[str, Any] = {name: getattr(dcache, name) for name in dcache.__all__}
    names["dcache"] = dcache
    return names


def banner(path: str) -> str:
    functions = sorted(
        name for name in dcache.__all__ if name[0].islower() and name not in ("db", "open_db", "close_db")
    )
    text = (
        f"sift shell on {path}: {dcache.BatchJob.select().count():,} jobs, "
        f"{dcache.batch_nbytes():,} bytes of results. In scope: db (open, shared by every thread), "
        f"the models {', '.join(MODELS)}, the functions {', '.join(functions)}, the errors "
        "(BatchError and its subclasses) and the package as dcache. Try "
        "BatchJob.select().where(BatchJob.status == 'done').count() or batch_targets('<job id>'). "
        "Leave with exit() or Ctrl-D."
    )
    return textwrap.fill(text, width=100)


def cmd_shell(args: argparse.Namespace) -> int:
    names = namespace()
    intro = banner(args.db)
    try:
        if importlib.util.find_spec("IPython") is not None:
            print(intro, file=sys.stderr)
            importlib.import_module("IPython").start_ipython(argv=["--no-banner"], user_ns=names)
        else:
            _plain_console(names, intro)
    except SystemExit as exc:  # exit() or quit() typed in the console
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    return 0


def _plain_console(names: dict[str, Any], intro: str) -> None:
    """``code.interact``; with piped input there are no prompts, so the output is only what the
    commands print."""
    piped = not (hasattr(sys.stdin, "isatty") and sys.stdin.isatty())
    saved = {name: getattr(sys, name) for name in ("ps1", "ps2") if hasattr(sys, name)}
    if piped:
        sys.ps1 = sys.ps2 = ""
    try:
        code.InteractiveConsole(locals=names, filename="<sift shell>").interact(banner=intro, exitmsg="")
    finally:
        for name in ("ps1", "ps2"):
            if name in saved:
                setattr(sys, name, saved[name])
            elif hasattr(sys, name):
                delattr(sys, name)
