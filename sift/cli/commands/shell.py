"""``sift shell``: an interactive Python console on the open store, like ``flask shell``.

On a terminal it is IPython when installed, else the standard console with what ``python -i`` has: line
editing, the history of ``~/.python_history`` and Tab completion, here of the shell's own names. Piped
input, with or without IPython, runs as a script: no prompts, and the first uncaught exception (or syntax
error) prints its traceback and ends the run with exit status 1, as ``python - < script`` does, so a
failed step stops the steps after it.
"""

from __future__ import annotations

import argparse
import code
import importlib
import importlib.util
import sys
import textwrap
from typing import Any

import peewee

from sift import dcache

from ..store import is_postgres
from . import Command

__all__ = ["COMMAND"]

MODELS = ("BatchJob", "BatchTarget", "JobStatus", "TargetStatus", "CallerClass")
#: Peewee's query helpers, as ``from peewee import fn, JOIN, SQL, Case`` gives them.
PEEWEE = {"fn": peewee.fn, "JOIN": peewee.JOIN, "SQL": peewee.SQL, "Case": peewee.Case}


def namespace() -> dict[str, Any]:
    """What the console starts with: every public name of ``sift.dcache`` (``db``, the models, the status
    enums, the functions, the errors), Peewee's ``fn``, ``JOIN``, ``SQL`` and ``Case``, and the package
    itself as ``dcache``."""
    names: dict[str, Any] = {name: getattr(dcache, name) for name in dcache.__all__}
    names.update(PEEWEE)
    names["dcache"] = dcache
    return names


def banner(path: str) -> str:
    """What the console says first: the store, its size, how ``db`` connects, and what is in scope."""
    functions = sorted(
        name for name in dcache.__all__ if name[0].islower() and name not in ("db", "open_db", "close_db")
    )
    text = (
        f"sift shell on {path}: {dcache.BatchJob.select().count():,} jobs, "
        f"{dcache.batch_nbytes():,} bytes of results. In scope: db ({connections(path)}), "
        f"the models {', '.join(MODELS)}, the functions {', '.join(functions)}, the errors "
        f"(BatchError and its subclasses), Peewee's {', '.join(PEEWEE)} and the package as dcache. "
        "Writes through the models follow the store's rules (docs/explanation/database.md). Try "
        "BatchJob.select().where(BatchJob.status == 'done').count(), "
        "BatchTarget.select(BatchTarget.status, fn.COUNT(SQL('*'))).group_by(BatchTarget.status).tuples() "
        "or batch_targets('<job id>'). Leave with exit() or Ctrl-D."
    )
    return textwrap.fill(text, width=100)


def connections(path: str) -> str:
    """How ``db`` reaches the store, as its backend connects."""
    if is_postgres(path):
        return "open: PostgreSQL, a pool of connections, one per thread while it uses the store"
    return "open: SQLite, one connection shared by every thread"


def run(args: argparse.Namespace) -> int:
    """IPython on a terminal when installed, else the standard console (a script when input is piped)."""
    names = namespace()
    intro = banner(args.db)
    piped = not (hasattr(sys.stdin, "isatty") and sys.stdin.isatty())
    try:
        if not piped and importlib.util.find_spec("IPython") is not None:
            print(intro, file=sys.stderr)
            importlib.import_module("IPython").start_ipython(argv=["--no-banner"], user_ns=names)
        else:
            return _plain_console(names, intro, piped)
    except SystemExit as exc:  # exit() or quit() typed in the console
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    return 0


class _ScriptFailed(Exception):
    """A line of a piped script raised (its traceback is already printed)."""


class _ScriptConsole(code.InteractiveConsole):
    """The console for piped input: the first uncaught exception or syntax error ends the run."""

    def showtraceback(self) -> None:
        super().showtraceback()
        raise _ScriptFailed

    def showsyntaxerror(self, filename: str | None = None, **kwargs: Any) -> None:
        super().showsyntaxerror(filename, **kwargs)
        raise _ScriptFailed


def _line_editing(names: dict[str, Any]) -> None:
    """What the interpreter sets up for ``python -i``: readline's line editing, and the history of
    ``~/.python_history`` (site's interactive hook), then Tab completion of the shell's names."""
    try:
        import readline
        import rlcompleter
    except ImportError:  # a Python built without readline: the console still works, unedited
        return
    hook = getattr(sys, "__interactivehook__", None)  # absent under python -I or -S: no saved history
    if hook is not None:
        hook()
    readline.set_completer(rlcompleter.Completer(names).complete)
    if "libedit" in (readline.__doc__ or ""):
        readline.parse_and_bind("bind ^I rl_complete")
    else:
        readline.parse_and_bind("tab: complete")


def _plain_console(names: dict[str, Any], intro: str, piped: bool) -> int:
    """``code.InteractiveConsole``. On a terminal, with line editing and completion; with piped input,
    without prompts (the output is only what the commands print), stopping at the first error (status 1)."""
    saved = {name: getattr(sys, name) for name in ("ps1", "ps2") if hasattr(sys, name)}
    if piped:
        sys.ps1 = sys.ps2 = ""
    else:
        _line_editing(names)
    console = (_ScriptConsole if piped else code.InteractiveConsole)(locals=names, filename="<sift shell>")
    try:
        console.interact(banner=intro, exitmsg="")
    except _ScriptFailed:
        return 1
    finally:
        for name in ("ps1", "ps2"):
            if name in saved:
                setattr(sys, name, saved[name])
            elif hasattr(sys, name):
                delattr(sys, name)
    return 0


COMMAND = Command(
    name="shell",
    help="An interactive Python console with the store open.",
    run=run,
    json=False,
)
