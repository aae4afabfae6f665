"""The client's waits for asyncio servers (FastAPI, Starlette, aiohttp): the same rule as
:func:`sift.dcache.wait_for_batch_job`, waiting on the event loop without holding a thread; each read of the
job runs in the loop's default executor."""

from __future__ import annotations

import asyncio
import contextlib

from .database import db
from .manager import batch_job
from .models import BatchJob
from .waiting import checked_wait, job_changed

__all__ = ["wait_for_batch_job"]


class _LoopWaker:
    """Sets an asyncio event from the feed's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        self._loop = loop
        self._event = event

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while the wait was being given up
            self._loop.call_soon_threadsafe(self._event.set)


async def wait_for_batch_job(
    job_id: str, *, timeout: float, since: BatchJob | None = None
) -> BatchJob | None:
    """The job as soon as it is final, or, given ``since``, as soon as its status or ``targets_done``
    differs from it; the job as it is after ``timeout`` seconds; None for an unknown job. Many waits share
    one event loop and the process's one change feed."""
    job_id, timeout, mark = checked_wait(job_id, timeout, since)
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    waker = _LoopWaker(loop, event)
    waiters = db.backend.job_waiters()
    try:
        await asyncio.to_thread(waiters.add, job_id, waker)  # the first wait of the process starts the feed
        deadline = loop.time() + timeout
        while True:
            event.clear()
            job = await asyncio.to_thread(batch_job, job_id)
            if job_changed(job, mark):
                return job
            remaining = deadline - loop.time()
            if remaining <= 0:
                return job
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                return await asyncio.to_thread(batch_job, job_id)  # the job as it is at the timeout
    finally:
        waiters.remove(job_id, waker)
