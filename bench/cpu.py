"""CPU seconds used by this process (the worker, in-process) and by its child processes (the
Temporal dev server; the driver reports its own), read from /proc on Linux; zeros elsewhere.
And the speed of one core, as a plain Python loop, so that reports from different machines can
be told apart."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuTimes:
    bench: float  # this process: the worker and the fake cloud (+ the baseline loop later)
    server: float  # child processes: the Temporal dev server
    driver: float = 0.0  # the client process (bench/driver.py), start-up included

    def __sub__(self, other: CpuTimes) -> CpuTimes:
        return CpuTimes(
            self.bench - other.bench, self.server - other.server, self.driver - other.driver
        )


def cpu_now() -> CpuTimes:
    return CpuTimes(bench=time.process_time(), server=_children_cpu())


def _children_cpu() -> float:
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for task in tasks.iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in children:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def python_loop_ms_per_million(steps: int = 3_000_000, repeats: int = 3) -> float:
    """Milliseconds per million steps of `total += i` in a plain Python loop, best of
    `repeats`: the single-core speed the worker (pure Python) gets on this machine."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        total = 0
        for i in range(steps):
            total += i
        best = min(best, time.perf_counter() - started)
    return best * 1e6 / steps * 1e3
