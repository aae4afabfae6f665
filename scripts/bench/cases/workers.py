"""Processes that write or claim at once, started together, for the multi-process cases."""

from __future__ import annotations

import os
import time
from typing import Any

from sift import dcache

from ..sizes import RESULT_1K, T0
from .hot_paths import CLAIM_LIMIT


def worker_child(target: str, task: str, job_id: str, warmup: int, pipe: Any) -> None:
    """A process of a multi-process case. It opens the store, runs ``warmup`` operations, then on each
    ``(count, start_at)`` from the pipe waits until ``start_at`` (time.monotonic: one clock for every process
    of the machine), runs ``count`` operations and answers the time it finished; on None it answers how many
    targets it moved in all. An operation is, for task ``write``, update_batch_target to done with 1 KB on
    the next pending target of ``job_id``; for task ``claim``, claim_batch_targets(CLAIM_LIMIT)."""
    dcache.open_db(target)
    idx = moved = 0

    def run(count: int) -> None:
        nonlocal idx, moved
        if task == "write":
            for i in range(idx, idx + count):
                dcache.update_batch_target(job_id, i, "done", result=RESULT_1K, now=T0 + 10)
            idx += count
            moved += count
            return
        for _ in range(count):
            got = len(dcache.claim_batch_targets(CLAIM_LIMIT, now=T0 + 10))
            if not got:
                raise AssertionError("claims: no pending target left; the fixture is too small")
            moved += got

    run(warmup)
    pipe.send(os.getpid())
    while (command := pipe.recv()) is not None:
        count, start_at = command
        time.sleep(max(0.0, start_at - time.monotonic()))
        run(count)
        pipe.send(time.monotonic())
    dcache.close_db()
    pipe.send(moved)


class Workers:
    """Processes spawned (not forked) and warmed up before any timing, each running ``worker_child`` with
    its own (task, job_id); a round starts ``active`` of them at one moment."""

    def __init__(self, target: str, tasks: list[tuple[str, str]], warmup: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Any] = []
        self.children: list[Any] = []
        for task, job_id in tasks:
            mine, theirs = ctx.Pipe()
            child = ctx.Process(target=worker_child, args=(target, task, job_id, warmup, theirs), daemon=True)
            child.start()
            self.pipes.append(mine)
            self.children.append(child)
        for pipe in self.pipes:
            pipe.recv()  # warmed up
        self.moved: list[int] = []

    def round(self, active: int, ops: int) -> float:
        """µs per operation over a round of ``ops`` operations by each of ``active`` processes, from the
        common start to the last process's end."""
        start_at = time.monotonic() + 0.1
        for pipe in self.pipes[:active]:
            pipe.send((ops, start_at))
        ends: list[float] = [pipe.recv() for pipe in self.pipes[:active]]
        return (max(ends) - start_at) * 1e6 / (active * ops)

    def rounds(self, rounds: int, sides: tuple[int, ...], ops: int) -> dict[int, list[float]]:
        """``rounds`` rounds of each side (a number of processes), the order rotating each round."""
        samples: dict[int, list[float]] = {side: [] for side in sides}
        for rnd in range(rounds):
            shift = rnd % len(sides)
            for active in sides[shift:] + sides[:shift]:
                samples[active].append(self.round(active, ops))
        return samples

    def close(self) -> list[int]:
        """Stop the processes; how many targets each moved (written, or claimed)."""
        for pipe in self.pipes:
            pipe.send(None)
        self.moved = [pipe.recv() for pipe in self.pipes]
        for child in self.children:
            child.join(timeout=30)
        return self.moved
