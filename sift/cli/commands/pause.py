"""``sift pause``: no claim takes a pending target of one job (``--job``) or of one caller's jobs
(``--caller``) until ``sift resume``; running targets finish."""

from __future__ import annotations

import argparse

from ..pausing import add_target_arguments, pause_or_resume
from . import Command

__all__ = ["COMMAND"]


def run(args: argparse.Namespace) -> int:
    return pause_or_resume(args, pause=True)


COMMAND = Command(
    name="pause",
    help="Pause one job (--job ID, pause_batch_job) or one caller (--caller NAME, pause_caller): claims "
    "take none of its pending targets until `sift resume`; running targets finish, leases run on.",
    run=run,
    add_arguments=add_target_arguments,
)
