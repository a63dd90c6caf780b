"""The scenarios: each builds its fake cloud, runs jobs on a fresh worker and returns a result
that bench/report.py renders. Nothing here asserts; tests/test_bench.py runs the smallest sizes.

Clouds (all single-node 8x H100 offers, no node agent):
- OVERHEAD: boot 1 s, delete 0.5 s, 50 ms per API call, poll every 0.25 s (one region);
- ZERO: no boot, delete or call latency, poll every 0.05 s (throughput);
- WAITING: boot never finishes within the run, poll every 0.5 s (observe call rate);
- the failover cloud: OVERHEAD's timings over four one-offer regions priced 10 < 11 < 12 < 13,
  with Capacity on create for the cheapest one (or three).
"""

from __future__ import annotations

import asyncio
import resource
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import Client

from bench.baseline import run_baseline
from bench.billed_idle import NodeIdle, calls_of, lease_idle
from bench.cloud import CallRecord
from bench.cpu import CpuTimes
from bench.driver import bench_job
from bench.floor import floor_worker
from bench.harness import (
    BenchTimeout,
    BenchWorker,
    JobTiming,
    bench_worker,
    job_names,
    run_jobs,
    run_jobs_on,
    terminate_all,
    worker_options,
)
from gpuprov.config import FakeInstanceType, FakeProviderConfig, FakeRegion, FaultRule
from providers.errors import ErrorKind

OVERHEAD = dict(
    boot_delay_seconds=1.0,
    delete_delay_seconds=0.5,
    call_latency_seconds=0.05,
    poll_interval=0.25,
)
ZERO = dict(
    boot_delay_seconds=0.0, delete_delay_seconds=0.0, call_latency_seconds=0.0, poll_interval=0.05
)
WAITING = dict(
    boot_delay_seconds=3600.0,
    delete_delay_seconds=0.0,
    call_latency_seconds=0.0,
    poll_interval=0.5,
    boot_timeout=7200.0,
)
REGION = "r1"
WAVE = 100  # jobs submitted at once while the observe-rate scenario fills its region
# Calls on a single-node job's critical path that the cloud itself makes slow:
# to ready: plan, prepare, create, and the observe that sees Running;
# to gone: delete, the observe that sees nothing, cleanup.
READY_CALLS = 4
GONE_CALLS = 3


def fake_cloud(
    regions: int = 1, faults: list[FaultRule] | None = None, **timing: Any
) -> FakeProviderConfig:
    """`regions` one-offer regions r1..rN priced 10, 11, ...; generous boot/delete timeouts so a
    loaded machine never turns a slow wait into a failover."""
    settings: dict[str, Any] = dict(boot_timeout=600.0, delete_timeout=600.0)
    settings.update(timing)
    return FakeProviderConfig(
        regions=[FakeRegion(name=f"r{index + 1}") for index in range(regions)],
        instance_types=[
            FakeInstanceType(
                name=f"gpu8-{index + 1}",
                gpu="H100",
                gpu_count=8,
                price=10.0 + index,
                regions=[f"r{index + 1}"],
            )
            for index in range(regions)
        ],
        faults=faults or [],
        **settings,
    )


def peak_rss_mb() -> float:
    """This process's peak resident set (Linux reports KiB): the worker runs in-process."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(frozen=True)
class Floor:
    """The cloud's own configured latency on a job's critical path (seconds)."""

    ready: float
    gone: float

    @classmethod
    def of(cls, config: FakeProviderConfig) -> Floor:
        latency = config.call_latency_seconds
        return cls(
            ready=config.boot_delay_seconds + READY_CALLS * latency,
            gone=config.delete_delay_seconds + GONE_CALLS * latency,
        )


def calls_by_primitive(counts: dict[tuple[str, str], int]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for (primitive, _region), count in counts.items():
        totals[primitive] += count
    return dict(totals)


def batch_wall(timings: list[JobTiming]) -> float | None:
    """First submit to last completion."""
    ends = [t.completed for t in timings if t.completed is not None]
    if not ends:
        return None
    return max(ends) - min(t.submitted for t in timings)


# ---------------------------------------------------------------- overhead and the baseline


@dataclass
class OverheadRun:
    jobs: int
    floor: Floor
    gpuprov: list[JobTiming] = field(default_factory=list)
    baseline: list[JobTiming] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)  # gpuprov, per primitive
    baseline_calls: dict[str, int] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    cpu: CpuTimes | None = None  # during the gpuprov batch
    error: str | None = None  # "timed out after Xs"
    idle: list[NodeIdle] = field(default_factory=list)  # billed idle, gpuprov's nodes
    baseline_idle: list[NodeIdle] = field(default_factory=list)


def billed_idle_of(
    timings: list[JobTiming], calls: list[CallRecord], config: FakeProviderConfig
) -> list[NodeIdle]:
    """Each single-node job's billed idle (bench/billed_idle.py): its VM is the one whose name
    starts with the job's."""
    by_vm = calls_of(calls)
    idle = []
    for timing in timings:
        vm = next((vm for vm in by_vm if vm.startswith(f"{timing.name}-")), None)
        if vm is None:
            continue
        node = lease_idle(
            timing.ready, timing.released, by_vm[vm],
            config.boot_delay_seconds, config.delete_delay_seconds, vm,
        )  # fmt: skip
        if node is not None:
            idle.append(node)
    return idle


async def overhead(client: Client, jobs: int, timeout: float) -> OverheadRun:
    """N single-node jobs at once through gpuprov, then N through the plain loop."""
    config = fake_cloud(**OVERHEAD)
    result = OverheadRun(jobs=jobs, floor=Floor.of(config))
    async with bench_worker(client, config, max_jobs=jobs, trace=True) as bench:
        try:
            batch = await run_jobs(bench, job_names("ovh", jobs), timeout)
            result.gpuprov, result.cpu = batch.timings, batch.cpu
        except BenchTimeout as error:
            result.error = str(error)
            await terminate_all(client, bench.task_queue)
        result.calls = calls_by_primitive(bench.cloud.state.call_counts())
        result.idle = billed_idle_of(result.gpuprov, bench.cloud.calls, config)
    result.peak_rss_mb = peak_rss_mb()
    result.baseline, baseline_counts, baseline_trace = await run_baseline(config, jobs)
    result.baseline_calls = calls_by_primitive(baseline_counts)
    result.baseline_idle = billed_idle_of(result.baseline, baseline_trace, config)
    return result


# ---------------------------------------------------------------- throughput


@dataclass
class ThroughputRun:
    jobs: int
    timings: list[JobTiming] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    cpu: CpuTimes | None = None
    error: str | None = None

    @property
    def wall(self) -> float | None:
        return batch_wall(self.timings)

    @property
    def jobs_per_second(self) -> float | None:
        wall, done = self.wall, sum(t.ok for t in self.timings)
        return done / wall if wall else None


async def throughput(client: Client, jobs: int, timeout: float) -> ThroughputRun:
    """N jobs at once on a zero-latency cloud: how fast one worker provisions and releases."""
    result = ThroughputRun(jobs=jobs)
    async with bench_worker(client, fake_cloud(**ZERO), max_jobs=jobs) as bench:
        try:
            batch = await run_jobs(bench, job_names("tput", jobs), timeout)
            result.timings, result.cpu = batch.timings, batch.cpu
        except BenchTimeout as error:
            result.error = str(error)
            await terminate_all(client, bench.task_queue)
    result.peak_rss_mb = peak_rss_mb()
    return result


async def floor(client: Client, jobs: int, timeout: float) -> ThroughputRun:
    """The same N jobs through a workflow of gpuprov's shape that does no work (bench/floor.py):
    what Temporal itself costs per job on this machine."""
    result = ThroughputRun(jobs=jobs)
    task_queue = f"floor-{uuid.uuid4().hex[:10]}"
    async with floor_worker(client, task_queue, **worker_options(jobs)):
        try:
            batch = await run_jobs_on(client, task_queue, job_names("floor", jobs), timeout)
            result.timings, result.cpu = batch.timings, batch.cpu
        except BenchTimeout as error:
            result.error = str(error)
            await terminate_all(client, task_queue)
    result.peak_rss_mb = peak_rss_mb()
    return result


# ---------------------------------------------------------------- failover


@dataclass(frozen=True)
class FailoverSample:
    """One stockout -> next offer's create, split at the end of the failed attempt's teardown."""

    total: float  # stockout error -> next create call starts
    teardown: float  # stockout -> the failed attempt's last teardown call ends
    teardown_cloud: float  # time spent inside those teardown calls (the cloud's share)

    @property
    def after_teardown(self) -> float:
        return self.total - self.teardown


@dataclass
class FailoverRun:
    failovers: int  # stockouts per job (1 or 3)
    samples: list[FailoverSample] = field(default_factory=list)
    timings: list[JobTiming] = field(default_factory=list)
    error: str | None = None


def failover_cloud(stockouts: int) -> FakeProviderConfig:
    faults = [
        FaultRule(
            primitive="create",
            kind=ErrorKind.CAPACITY,
            message="no capacity (bench)",
            offer=f"fake/r{index + 1}/gpu8-{index + 1}",
        )
        for index in range(stockouts)
    ]
    return fake_cloud(regions=stockouts + 1, faults=faults, **OVERHEAD)


async def failover(client: Client, stockouts: int, repeats: int, timeout: float) -> FailoverRun:
    """`repeats` jobs one after another, each on a fresh worker (blocks are shared and would
    steer the next job past the stockout), each failing over `stockouts` times."""
    result = FailoverRun(failovers=stockouts)
    for _ in range(repeats):
        async with bench_worker(client, failover_cloud(stockouts), max_jobs=1, trace=True) as bench:
            try:
                result.timings += (await run_jobs(bench, job_names("fo", 1), timeout)).timings
            except BenchTimeout as error:
                result.error = str(error)
                await terminate_all(client, bench.task_queue)
                return result
            result.samples += failover_samples(bench.cloud.calls)
    return result


def failover_samples(calls: list[CallRecord]) -> list[FailoverSample]:
    creates = sorted((c for c in calls if c.primitive == "create"), key=lambda c: c.started)
    samples = []
    for stockout in creates:
        if stockout.error != ErrorKind.CAPACITY.value:
            continue
        following = next((c for c in creates if c.started >= stockout.ended), None)
        if following is None:
            continue
        # the failed VM's own calls, and the region's shared list calls (observe coalescing)
        teardown = [
            c
            for c in calls
            if (c.vm == stockout.vm or (c.primitive == "list" and c.region == stockout.region))
            and c.started >= stockout.ended
            and c.ended <= following.started
        ]
        teardown_end = max((c.ended for c in teardown), default=stockout.ended)
        samples.append(
            FailoverSample(
                total=following.started - stockout.ended,
                teardown=teardown_end - stockout.ended,
                teardown_cloud=sum(c.ended - c.started for c in teardown),
            )
        )
    return samples


# ---------------------------------------------------------------- observe calls while waiting


@dataclass
class ObserveRun:
    jobs: int
    poll_interval: float
    window: float = 0.0  # seconds counted
    observe: int = 0
    list: int = 0
    still_waiting: int = 0
    error: str | None = None

    @property
    def per_interval(self) -> float | None:
        if not self.window:
            return None
        return (self.observe + self.list) / (self.window / self.poll_interval)


async def observe_rate(client: Client, jobs: int, intervals: int, timeout: float) -> ObserveRun:
    """N jobs waiting for machines that never boot, in one region: count the observe and list
    calls over `intervals` poll intervals once all of them wait, then terminate them.

    Jobs arrive in waves of WAVE (each wave's creates return before the next is submitted), so
    the worker is not saturated while the region fills up: this scenario measures the call
    rate of waiting jobs; what saturation does to jobs is the overhead scenario's finding."""
    config = fake_cloud(**WAITING)
    result = ObserveRun(jobs=jobs, poll_interval=config.poll_interval)
    async with bench_worker(client, config, max_jobs=jobs) as bench:
        counts = bench.cloud.state.call_counts
        try:
            async with asyncio.timeout(timeout):
                await _fill_region(bench, jobs)
        except TimeoutError:
            result.error = f"timed out after {timeout:.0f}s before all {jobs} jobs waited"
        else:
            # every create has returned; give the workflows time to start their waits
            await asyncio.sleep(max(2 * config.poll_interval, 1.0 + jobs / 200))
            before, started = counts(), time.monotonic()
            await asyncio.sleep(intervals * config.poll_interval)
            after, result.window = counts(), time.monotonic() - started
            for primitive in ("observe", "list"):
                key = (primitive, REGION)
                setattr(result, primitive, after.get(key, 0) - before.get(key, 0))
            running = await client.count_workflows(
                f"TaskQueue = '{bench.task_queue}' AND ExecutionStatus = 'Running'"
            )
            result.still_waiting = running.count
        await terminate_all(client, bench.task_queue)
    return result


async def _fill_region(bench: BenchWorker, jobs: int) -> None:
    counts = bench.cloud.state.call_counts
    names = job_names("obs", jobs)
    for start in range(0, jobs, WAVE):
        wave = names[start : start + WAVE]
        await asyncio.gather(*(bench.client.submit(bench_job(name)) for name in wave))
        while counts().get(("create", REGION), 0) < start + len(wave):
            await asyncio.sleep(0.2)


# ---------------------------------------------------------------- warm-up


async def warm_up(client: Client) -> None:
    """One throwaway job, so the first measured job does not pay for imports and sandbox set-up."""
    async with bench_worker(client, fake_cloud(**ZERO), max_jobs=1) as bench:
        await run_jobs(bench, job_names("warm", 1), 120)
