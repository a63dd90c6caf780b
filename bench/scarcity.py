"""The scarcity scenario: the same jobs, arriving over the same modelled hour, against the same
stockouts (bench/scarcity_model.py), once per placement policy, each on a fresh worker, fake
cloud and database:

- **sequential**: cheapest first, each offer tried once, the job fails when every one failed
  (`capacity_wait: false`; what SkyPilot and dstack do without their retry options);
- **capacity wait**: the default: a sold-out job waits for a block to lapse and tries again;
- **hedge 2**: capacity wait plus `hedge: {max_parallel: 2, after_seconds: auto}`;
- **ready_time**: capacity wait plus `order: ready_time`.

Per policy: time to ready (submit -> every node ready, in modelled minutes) p50/p95/p99 over
the jobs that got GPUs, jobs that got them before their deadline, what the hedges' losers cost
as a share of the winners' first hour, creates per offering (tries, sold out or not), and
machines or side resources left once every job ended (must be 0). Nothing here asserts;
tests/test_bench.py runs the smallest size.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import Client

from bench.harness import worker_options
from bench.scarcity_model import (
    MODELLED_MINUTES_PER_HOUR,
    OFFERINGS,
    SECONDS_PER_MODELLED_MINUTE,
    BootTimes,
    Offering,
    Spells,
    by_region,
    spells,
)
from gpuprov import contract
from gpuprov.config import FakeInstanceType, FakeProviderConfig, FakeRegion, JobsSettings
from gpuprov.engine.worker import build_worker, open_records
from gpuprov.models import AttemptOutcome, JobSpec, JobState, JobStatus
from gpuprov.sdk.client import GpuprovClient, JobHandle
from providers.base import InstanceSpec, InstanceStatus, Observed, Offer
from providers.errors import ErrorKind, ProviderError
from providers.fake import FakeCloud
from providers.fake.state import InstanceRow
from workflows.hedge import losers_spend

MINUTE = SECONDS_PER_MODELLED_MINUTE
NODES = 1  # per job
DEADLINE_MINUTES = 60.0  # each job's provisioning_timeout_seconds, modelled (by default)
BOOT_TIMEOUT_MINUTES = 40  # the fake provider's boot timeout (dstack's range: 10 to 55)
POLL_SECONDS = 0.5  # the cloud is looked at every 30 modelled seconds
RELEASE_EVERY = 0.5  # seconds between the driver's looks for ready jobs
# The production [jobs] times, scaled like the rest: a stockout backs off 2 minutes doubling to
# 30, a block lasts 15, a launch window is 1.
SCALED_JOBS = JobsSettings(
    block_ttl_seconds=round(15 * MINUTE),
    capacity_backoff_seconds=round(2 * MINUTE),
    capacity_backoff_max_seconds=round(30 * MINUTE),
    launch_probe_window_seconds=round(1 * MINUTE),
)
# placement.hedge's example bound, 20 USD, is for real hours; the run's hours are 60 times
# shorter, so are its machines' bills.
HEDGE_EXTRA_COST = 20 / 60


@dataclass(frozen=True)
class Policy:
    name: str
    placement: dict[str, Any]


POLICIES: tuple[Policy, ...] = (
    Policy("sequential", {"capacity_wait": False}),
    Policy("capacity wait", {}),
    Policy(
        "hedge 2",
        {"hedge": {"max_parallel": 2, "after_seconds": "auto", "max_extra_cost": HEDGE_EXTRA_COST}},
    ),
    Policy("ready_time", {"order": "ready_time"}),
)


class ScarceCloud(FakeCloud):
    """The fake cloud with the model's stockouts (a create while sold out is Capacity) and a
    boot time per machine drawn at its create."""

    def __init__(
        self, config: FakeProviderConfig, stock: dict[str, Spells], boots: BootTimes
    ) -> None:
        super().__init__(config)
        self.stock, self.boots = stock, boots
        self.offerings = by_region()
        self.started = time.time()
        self.boot_seconds: dict[str, float] = {}  # instance id -> its boot time
        self.creates: Counter[str] = Counter()  # region -> create calls
        self.sold_out: Counter[str] = Counter()  # region -> creates refused for capacity

    def minute(self) -> float:
        return (time.time() - self.started) / MINUTE

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        self.creates[offer.region] += 1
        if self.stock[offer.region].sold_out(self.minute()):
            self.sold_out[offer.region] += 1
            raise ProviderError(ErrorKind.CAPACITY, f"{offer.region} is sold out")
        ids = await super().create(offer, prepared, spec)
        boot = self.boots.draw(self.offerings[offer.region]) * MINUTE
        for instance_id in ids:
            self.boot_seconds[instance_id] = boot
        return ids

    def _observed(self, row: InstanceRow, now: float) -> Observed | None:
        boot = self.boot_seconds.get(row.id, 0.0)
        if row.deleted_at is None and now - row.created_at < boot:
            return Observed(id=row.id, status=InstanceStatus.PENDING)
        return super()._observed(row, now)


def scarce_config(offerings: tuple[Offering, ...] = OFFERINGS) -> FakeProviderConfig:
    return FakeProviderConfig(
        regions=[FakeRegion(name=offering.region) for offering in offerings],
        instance_types=[
            FakeInstanceType(
                name=f"gpu8-{offering.region}",
                gpu="H100",
                gpu_count=8,
                price=offering.price,
                regions=[offering.region],
            )
            for offering in offerings
        ],
        boot_delay_seconds=0.0,  # per machine: ScarceCloud
        delete_delay_seconds=0.5,
        poll_interval=POLL_SECONDS,
        boot_timeout=BOOT_TIMEOUT_MINUTES * MINUTE,
        delete_timeout=600.0,
    )


@dataclass
class JobResult:
    name: str
    submitted: float
    final: JobStatus | None = None

    @property
    def to_ready_minutes(self) -> float | None:
        if self.final is None or self.final.ready_at is None:
            return None
        return (self.final.ready_at.timestamp() - self.submitted) / MINUTE

    def loser_cost(self) -> float:
        return 0.0 if self.final is None else losers_spend(self.final.attempts)

    def winner_first_hour(self) -> float:
        """What the winning machines cost over their first (modelled) hour."""
        if self.final is None or self.final.ready_at is None:
            return 0.0
        won = [a for a in self.final.attempts if a.outcome is AttemptOutcome.SUCCEEDED]
        if not won or won[-1].offer.price is None:
            return 0.0
        hour = MODELLED_MINUTES_PER_HOUR * MINUTE / 3600
        return won[-1].offer.price.amount * NODES * hour


@dataclass
class PolicyRun:
    policy: str
    jobs: list[JobResult]
    creates: dict[str, int]
    sold_out: dict[str, int]
    leaks: int  # machines and side resources live once every job had ended
    hedges: int = 0  # attempts started beside a leading one
    deadline_minutes: float = DEADLINE_MINUTES
    elapsed: float = 0.0
    sold_out_share: dict[str, float] = field(default_factory=dict)  # the model's, over the run

    def times(self) -> list[float]:
        return [t for job in self.jobs if (t := job.to_ready_minutes) is not None]

    def in_time(self) -> int:
        return sum(1 for t in self.times() if t <= self.deadline_minutes)

    def loser_share(self) -> float | None:
        winners = sum(job.winner_first_hour() for job in self.jobs)
        return sum(job.loser_cost() for job in self.jobs) / winners if winners else None


@dataclass(frozen=True)
class ScarcitySize:
    jobs: int
    arrival_minutes: float  # jobs arrive uniformly over this window
    deadline_minutes: float = DEADLINE_MINUTES  # each job's provisioning timeout


def arrivals(seed: int, size: ScarcitySize) -> list[float]:
    """Each job's arrival, in seconds from the run's start: the same for every policy."""
    rng = random.Random(f"{seed}/arrivals")
    return sorted(rng.uniform(0, size.arrival_minutes * MINUTE) for _ in range(size.jobs))


def job_spec(name: str, policy: Policy, size: ScarcitySize) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "nodes": NODES,
            "resources": {"gpu": "H100", "gpus_per_node": 8},
            "provisioning_timeout_seconds": round(size.deadline_minutes * MINUTE),
            "health_check_interval_seconds": None,
            "placement": policy.placement,
        }
    )


async def scarcity(
    client: Client, size: ScarcitySize, seed: int = 1, policies: tuple[Policy, ...] = POLICIES
) -> list[PolicyRun]:
    """Every policy in turn, against the same stockouts and arrivals."""
    return [await run_policy(client, policy, size, seed) for policy in policies]


async def run_policy(client: Client, policy: Policy, size: ScarcitySize, seed: int) -> PolicyRun:
    horizon = size.arrival_minutes + size.deadline_minutes + BOOT_TIMEOUT_MINUTES
    stock = {o.region: spells(o, seed, horizon) for o in OFFERINGS}
    config = scarce_config()
    task_queue = f"scarcity-{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory(prefix="gpuprov-bench-") as data_dir:
        records = open_records(f"sqlite:///{data_dir}/gpuprov.db")
        cloud = ScarceCloud(config, stock, BootTimes(seed))
        worker = build_worker(
            client,
            task_queue,
            {"fake": cloud},
            records,
            api_url="http://127.0.0.1:9",  # no node agent: a machine is ready once Running
            jobs=SCALED_JOBS,
            sandboxed=False,
            **worker_options(size.jobs),
        )
        try:
            async with worker:
                started = time.monotonic()
                cloud.started = time.time()
                jobs = await _drive(GpuprovClient(client, task_queue), policy, size, seed)
                elapsed = time.monotonic() - started
                await asyncio.sleep(2 * config.poll_interval)
            leaks = len(cloud.live_instances()) + len(cloud.state.live_side_resources())
        finally:
            await cloud.aclose()
            records.db.dispose()
    minutes = max(cloud.minute(), 1e-9)
    return PolicyRun(
        policy=policy.name,
        jobs=jobs,
        creates=dict(cloud.creates),
        sold_out=dict(cloud.sold_out),
        leaks=leaks,
        hedges=sum(
            1 for job in jobs if job.final for attempt in job.final.attempts if attempt.hedge
        ),
        elapsed=elapsed,
        deadline_minutes=size.deadline_minutes,
        sold_out_share={region: spell.share_sold_out(minutes) for region, spell in stock.items()},
    )


async def _drive(
    gp: GpuprovClient, policy: Policy, size: ScarcitySize, seed: int
) -> list[JobResult]:
    """Submit each job at its arrival, release it once ready (one visibility query per look for
    all of them), and wait for every one to end."""
    run = uuid.uuid4().hex[:6]
    names = [f"scarce-{run}-{index}" for index in range(size.jobs)]
    results = {name: JobResult(name, submitted=0.0) for name in names}
    handles: dict[str, JobHandle] = {}
    done = asyncio.Event()

    async def arrive(name: str, at: float, origin: float) -> None:
        await asyncio.sleep(max(0.0, origin + at - time.monotonic()))
        results[name].submitted = time.time()
        handles[name] = await gp.submit(job_spec(name, policy, size))
        results[name].final = await handles[name].result()

    releaser = asyncio.create_task(_release_ready(gp, handles, done))
    origin = time.monotonic()
    try:
        await asyncio.gather(
            *(arrive(n, at, origin) for n, at in zip(names, arrivals(seed, size), strict=True))
        )
    finally:
        done.set()
        await releaser
    return [results[name] for name in names]


async def _release_ready(
    gp: GpuprovClient, handles: dict[str, JobHandle], done: asyncio.Event
) -> None:
    queue = f"TaskQueue = '{gp.task_queue}'"
    ready = f"{queue} AND {contract.STATE.name} = '{JobState.READY.value}'"
    query = f"{ready} AND ExecutionStatus = 'Running'"
    released: set[str] = set()
    while not done.is_set():
        async for execution in gp.temporal.list_workflows(query):
            name = execution.id.removeprefix("job-")
            if name in handles and name not in released:
                released.add(name)
                await handles[name].release()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), RELEASE_EVERY)
