"""What ``sift pause`` and ``sift resume`` share: one job (``--job``) or one caller (``--caller``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from sift import dcache

from .report import emit_json

__all__ = ["add_target_arguments", "pause_or_resume"]


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """``--job ID`` or ``--caller NAME``, exactly one."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--job", metavar="ID", help="one job, by its id")
    which.add_argument("--caller", metavar="NAME", help="every job of one caller, those sent later too")


def pause_or_resume(args: argparse.Namespace, pause: bool) -> int:
    """Pause (or resume) the job or the caller; say whether that changed anything (exit 0 either way)."""
    call: Callable[[str], bool]
    if args.job is not None:
        call = dcache.pause_batch_job if pause else dcache.resume_batch_job
        kind, name = "job", args.job
    else:
        call = dcache.pause_caller if pause else dcache.resume_caller
        kind, name = "caller", args.caller
    changed = call(name)
    state = "paused" if pause else "resumed"
    if args.json:
        emit_json({kind: name, "action": "pause" if pause else "resume", "changed": changed})
    elif changed:
        print(f"{kind} {name} {state}")
    elif pause and kind == "job" and name not in dcache.paused_jobs():
        print(f"job {name} is finished: nothing to pause")
    else:
        print(f"{kind} {name} was {'already' if pause else 'not'} paused; left unchanged")
    return 0
