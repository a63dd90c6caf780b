"""The run's results and the numbers derived from them (shared by the report and the targets)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from bench.api_failover import ApiFailoverRun
from bench.handover import HandoverRun
from bench.harness import JobTiming
from bench.heartbeats import HeartbeatRun
from bench.scarcity import PolicyRun
from bench.scenarios import FailoverRun, ObserveRun, OverheadRun, ThroughputRun


@dataclass
class BenchResults:
    command: str
    machine: str
    quick: bool
    throughput: ThroughputRun | None = None
    floor: ThroughputRun | None = None  # the same jobs through a no-work skeleton
    overhead: list[OverheadRun] = field(default_factory=list)
    failover: list[FailoverRun] = field(default_factory=list)
    observe: list[ObserveRun] = field(default_factory=list)
    heartbeats: HeartbeatRun | None = None
    api_failover: ApiFailoverRun | None = None  # two API processes, one killed
    handover: list[HandoverRun] = field(default_factory=list)  # with long polls, then without
    scarcity: list[PolicyRun] = field(default_factory=list)  # one run per placement policy
    duration: float = 0.0
    peak_rss_mb: float = 0.0
    load: tuple[float, float] | None = None  # 1-minute load average at start and end


def percentile(values: Iterable[float], p: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def ready_overhead(run: OverheadRun, timings: list[JobTiming]) -> list[float]:
    return [t.to_ready - run.floor.ready for t in timings if t.ok]


def gone_overhead(run: OverheadRun, timings: list[JobTiming]) -> list[float]:
    return [t.to_gone - run.floor.gone for t in timings if t.ok]


def end_to_end(timings: list[JobTiming]) -> list[float]:
    """submit -> ready plus release -> gone: the job's own time, without its ready period."""
    return [t.to_ready + t.to_gone for t in timings if t.ok]


def total_overhead(run: OverheadRun) -> list[float]:
    return [
        ready + gone
        for ready, gone in zip(
            ready_overhead(run, run.gpuprov), gone_overhead(run, run.gpuprov), strict=True
        )
    ]


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
