"""How busy the machine's cores were during a run, from the kernel's CPU time counters (Linux)."""

from __future__ import annotations

__all__ = ["PROC_STAT", "busy_pct", "cores_time"]


#: The kernel's count of CPU time since boot, per state, summed over the cores (Linux).
PROC_STAT = "/proc/stat"


def cores_time() -> tuple[int, int] | None:
    """(all, idle) CPU time so far, in clock ticks summed over the cores; idle counts waiting on I/O too.
    None where PROC_STAT cannot be read."""
    try:
        with open(PROC_STAT) as f:
            ticks = [int(n) for n in f.readline().split()[1:9]]  # user … steal; guest time is in user
    except (OSError, ValueError):
        return None
    if len(ticks) < 5:
        return None
    return sum(ticks), ticks[3] + ticks[4]


def busy_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the cores' time between two :func:`cores_time` readings that was not idle, in %."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    elapsed, idle = after[0] - before[0], after[1] - before[1]
    busy = 100 * (elapsed - idle) / elapsed
    return round(min(100.0, max(0.0, busy)), 1)  # clamped: the kernel's iowait count may step back
