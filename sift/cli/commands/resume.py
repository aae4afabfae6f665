"""``sift resume``: claims take a paused job's (``--job``) or caller's (``--caller``) pending targets
again, where it stood."""

from __future__ import annotations

import argparse

from ..pausing import add_target_arguments, pause_or_resume
from . import Command

__all__ = ["COMMAND"]


def run(args: argparse.Namespace) -> int:
    return pause_or_resume(args, pause=False)


COMMAND = Command(
    name="resume",
    help="Resume a paused job (--job ID, resume_batch_job) or caller (--caller NAME, resume_caller): claims "
    "take its pending targets again.",
    run=run,
    add_arguments=add_target_arguments,
)
