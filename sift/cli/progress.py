"""Progress bars (tqdm) on a terminal only: nothing is drawn when standard error is not a TTY."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tqdm import tqdm

__all__ = ["bars_enabled", "make_bar", "run_with_progress", "step_bar"]

R = TypeVar("R")

#: How often a bar polls the store while a long call runs in the background (seconds).
POLL_S = 0.1


def bars_enabled() -> bool:
    """Whether standard error is a terminal (bars are drawn there only)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def make_bar(total: int | None, desc: str, unit: str = "it", **options: Any) -> Any:
    """A tqdm bar on standard error, disabled (drawing nothing) when that is not a terminal."""
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        disable=not bars_enabled(),
        dynamic_ncols=True,
        leave=False,
        **options,
    )


@contextmanager
def step_bar(
    desc: str, *, total: int | None = None, scale: int = 1, **options: Any
) -> Iterator[Callable[[int, int], None]]:
    """A bar for a call that reports ``progress(done, total)`` in steps of ``scale`` units each (a page's
    bytes, say); the total is taken from each report, since the work may grow while it runs."""
    with make_bar(total, desc, **options) as bar:

        def progress(done: int, steps: int) -> None:
            bar.total = steps * scale
            bar.update(done * scale - bar.n)

        yield progress
        bar.refresh()  # draw the finished bar once, even inside tqdm's minimum interval


def run_with_progress(
    work: Callable[[], R], *, total: int, done: Callable[[], int], desc: str, unit: str, **options: Any
) -> R:
    """Run ``work()``; on a terminal, run it in a thread and show ``done()`` out of ``total`` meanwhile.

    ``done`` reads the store; the store's lock is released between the chunks of a sweep or an eviction,
    so it gets its turn while the work goes on.
    """
    if not bars_enabled() or total <= 0:
        return work()
    outcome: list[R] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"sift-{desc}", daemon=True)
    with make_bar(total, desc, unit, **options) as bar:
        thread.start()
        while thread.is_alive():
            thread.join(POLL_S)
            bar.update(max(0, min(total, done())) - bar.n)
        if not failure:
            bar.update(total - bar.n)
            bar.refresh()  # draw the finished bar once, even inside tqdm's minimum interval
    if failure:
        raise failure[0]
    return outcome[0]
