"""A run's plan, all from the seed: the jobs (sizes, arrival times, roles: chaos/mix.py), the
fault rules (chaos/faults.py, plus the rules that make a cancel point visible:
chaos/cancels.py, and those of a partitioned node: chaos/mix.py), and the disruption schedule
(worker SIGKILLs and dev server restarts at random moments inside the arrival window, each with
a random down time)."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from chaos.cancels import aid_rules
from chaos.faults import FaultPlan, PlannedFault, Timings, plan_faults
from chaos.mix import (
    HEDGE_AFTER_SECONDS,
    LARGEST_NODES,
    LARGEST_PROVISIONING_TIMEOUT,
    MID_STEP_TIMEOUT,
    RACE_AND_WAIT_PROVISIONING_TIMEOUT,
    RUN_HEALTH_INTERVAL,
    Mix,
    Role,
    assign_roles,
    hedge_rule,
    mid_step_rule,
    partition_rules,
    stockout_rule,
)
from gpuprov.models import JobSpec, JobStatus
from gpuprov.sdk.client import JobHandle


@dataclass(frozen=True)
class Options:
    jobs: int
    seed: int
    kills: int
    server_restarts: int
    window: float  # seconds over which jobs arrive (and disruptions happen)
    deadline: float  # seconds after the last submission for every job to be terminal
    provisioning_timeout: int
    cancel_fraction: float = 0.1
    density: float = 1.0  # fault rules per job (at least the coverage deck)
    keep: bool = False
    command: str = ""
    workers: int = 1  # worker processes on the task queue, each killed on its own
    database: str = "sqlite"  # or "postgresql": a scratch database (chaos/postgres.py)
    postgres_url: str | None = None  # a server to make it on; None: the harness runs one
    run_fraction: float = 0.25  # jobs with `run` (chaos/nodes.py plays their nodes)
    hostile_fraction: float = 0.05  # hostile raw starts (chaos/hostile.py)
    mid_step_fraction: float = 0.05  # timeouts that land while creates are in flight
    largest: int = 0  # jobs of 256 nodes
    hedged_fraction: float = 0.05  # leases that race a hung first attempt (placement.hedge)
    waiting_fraction: float = 0.05  # leases whose first creates are sold out


@dataclass
class JobRun:
    name: str
    nodes: int
    arrive_at: float
    role: Role = field(default_factory=Role)
    handle: JobHandle | None = None
    submitted_at: float | None = None
    submitted_wall: float | None = None  # time.time() then (history and status times)
    closed_wall: float | None = None  # when its workflow closed, as Temporal says
    released: bool = False
    cancel: str | None = None  # what happened to its cancel
    cancel_sent_at: str | None = None  # the point the status showed when it was sent
    state: str | None = None  # terminal state once closed
    last_seen: str = "not submitted"  # GpuprovState from the last look
    final: JobStatus | None = None
    error: str | None = None
    problems: list[str] = field(default_factory=list)  # a hostile start's broken promises
    notes: list[str] = field(default_factory=list)  # what the harness saw, for the summary
    impersonated: bool = False  # an impostor is started beside it once it is ready

    @property
    def workflow_id(self) -> str:
        return f"job-{self.name}"

    @property
    def held(self) -> bool:
        """Not released when ready: it is cancelled there, or it runs its work (it ends by
        itself), or an impostor is to be started beside it first (released after that)."""
        if self.impersonated or self.role.kind == "run":
            return True
        return self.role.cancel_at not in (None, "releasing")


@dataclass(frozen=True)
class Disruption:
    at: float  # seconds since the start of the arrivals
    action: str  # kill_worker / restart_server
    pause: float  # how long the process stays down
    signal: str = "KILL"  # for restart_server: KILL or TERM
    worker: int = 0  # for kill_worker: which worker process (0-based)


@dataclass
class Plan:
    jobs: list[JobRun]
    faults: FaultPlan
    disruptions: list[Disruption]


def make_plan(options: Options, timings: Timings) -> Plan:
    rng = random.Random(options.seed)
    names = [f"chaos-{i:04d}" for i in range(options.jobs)]
    arrivals = sorted([0.0] + [rng.uniform(0, options.window) for _ in names[1:]])
    sizes = [rng.randint(1, 3) for _ in names]
    mix = Mix(
        cancel_fraction=options.cancel_fraction,
        run_fraction=options.run_fraction,
        hostile_fraction=options.hostile_fraction,
        mid_step_fraction=options.mid_step_fraction,
        largest=options.largest,
        hedged_fraction=options.hedged_fraction,
        waiting_fraction=options.waiting_fraction,
    )
    roles = assign_roles(options.seed, names, sizes, mix)
    jobs = [
        JobRun(
            name=name,
            nodes=LARGEST_NODES if role.kind == "largest" else size,
            arrive_at=arrive_at,
            role=role,
        )
        for name, size, arrive_at, role in zip(names, sizes, arrivals, roles, strict=True)
    ]
    targets = {job.role.impersonates for job in jobs if job.role.impersonates}
    for job in jobs:
        job.impersonated = job.name in targets
    # Hostile starts never reach a cloud call: no rule is aimed at them. Nor at a partitioned
    # job: a fault that failed its first attempt over would leave no node to cut off.
    aimed = [job.name for job in jobs if job.role.kind != "hostile" and not _partitioned(job)]
    faults = plan_faults(rng, aimed, options.window, timings, options.density)
    for job in jobs:
        if job.role.cancel_at is not None:
            faults.faults += [
                PlannedFault(rule, job.name, aid=True)
                for rule in aid_rules(job.name, job.role.cancel_at)
            ]
        if job.role.mid_step:
            faults.faults.append(PlannedFault(mid_step_rule(job.name), job.name, aid=True))
        if job.role.hedged:
            faults.faults.append(PlannedFault(hedge_rule(job.name), job.name, role=True))
        if job.role.waits:
            rule = stockout_rule(job.name, job.nodes)
            faults.faults.append(PlannedFault(rule, job.name, role=True))
        if job.role.work is not None and _partitioned(job):
            faults.faults += [
                PlannedFault(rule, job.name, role=True)
                for rule in partition_rules(job.name, job.role.work)
            ]
    actions = ["kill_worker"] * options.kills + ["restart_server"] * options.server_restarts
    rng.shuffle(actions)
    moments = sorted(rng.uniform(0.1, 0.9) * options.window for _ in actions)
    disruptions = []
    restarts = 0
    for at, action in zip(moments, actions, strict=True):
        if action == "kill_worker":
            disruptions.append(Disruption(at, action, round(rng.uniform(0.0, 2.0), 2)))
        else:
            # Alternate: the first restart SIGKILLs the server, the next one stops it cleanly.
            sig = "KILL" if restarts % 2 == 0 else "TERM"
            restarts += 1
            disruptions.append(Disruption(at, action, round(rng.uniform(0.5, 3.0), 2), sig))
    return Plan(jobs, faults, _target_workers(disruptions, options))


def _partitioned(job: JobRun) -> bool:
    return job.role.work is not None and job.role.work.ending == "partition"


def _target_workers(disruptions: list[Disruption], options: Options) -> list[Disruption]:
    """Which worker each kill hits: every worker in turn, in a seeded order, so with at least as
    many kills as workers each one dies at least once. Drawn apart from the rest of the plan,
    so a one-worker run keeps the plan it always had for its seed."""
    kills = [index for index, d in enumerate(disruptions) if d.action == "kill_worker"]
    targets = [n % options.workers for n in range(len(kills))]
    random.Random(f"{options.seed}/workers").shuffle(targets)
    chosen = list(disruptions)
    for index, target in zip(kills, targets, strict=True):
        chosen[index] = dataclasses.replace(disruptions[index], worker=target)
    return chosen


def job_spec(job: JobRun, options: Options) -> JobSpec:
    data: dict[str, Any] = {
        "name": job.name,
        "nodes": job.nodes,
        "resources": {"gpu": "H100", "gpus_per_node": 8},
        "provisioning_timeout_seconds": options.provisioning_timeout,
    }
    if job.role.kind == "largest":
        timeout = max(options.provisioning_timeout, LARGEST_PROVISIONING_TIMEOUT)
        data["provisioning_timeout_seconds"] = timeout
    if job.role.mid_step:
        data["provisioning_timeout_seconds"] = MID_STEP_TIMEOUT
    if job.role.hedged:
        data["placement"] = {"hedge": {"max_parallel": 2, "after_seconds": HEDGE_AFTER_SECONDS}}
    if job.role.hedged or job.role.waits:
        timeout = max(options.provisioning_timeout, RACE_AND_WAIT_PROVISIONING_TIMEOUT)
        data["provisioning_timeout_seconds"] = timeout
    work = job.role.work
    if work is not None:
        data |= {
            "run": "python train.py --rank $GPUPROV_NODE_RANK",
            "recovery": {"max_restarts": work.max_restarts},
            "health_check_interval_seconds": RUN_HEALTH_INTERVAL,
        }
    return JobSpec.model_validate(data)
