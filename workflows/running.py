"""The job's work on its nodes: what each node runs, and what the nodes' reports mean. Pure.

`assignments` gives every node its command: the spec's `setup` and `run`, the spec's `env`
plus GPUPROV_JOB_NAME, GPUPROV_NODE_RANK (0..N-1), GPUPROV_NUM_NODES, GPUPROV_NODE_IPS
(newline-separated, rank order), GPUPROV_MASTER_ADDR (rank 0's address) and GPUPROV_ATTEMPT
(1, then one more per restart: user code fences its own storage by it).
`judge` reads the nodes' work states and health into one of: still running, completed (every
node exited 0), failed (the first node, by rank, that exited otherwise: its code and last
lines), or lost (a node the cloud reclaimed or said it will, whose agent went silent, or that
stopped its work because its lease lapsed: a new attempt may run the work again).
`work_fence` says when a new attempt's work may start: once every old node that might still
run its work (its machine not confirmed gone) is past its lease and stop grace period.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuprov.models import (
    ExistingWorker,
    HealthReport,
    JobSpec,
    NodeInstance,
    NodeWork,
    WorkerLiveness,
    WorkState,
)
from gpuprov.store.work import Assignment, RunCommand
from providers.base import Verdict

MAX_TAIL_LINES = 20
# Beyond an old node's `work_ends_by`: its agent checks its lease twice a second, and its stop
# (SIGKILL of every process of the work) takes a moment; the API's and the workflow's clocks
# may differ by a little.
FENCE_MARGIN = timedelta(seconds=10)
# Node statuses of a machine the cloud confirmed gone: no work of it can still run.
CONFIRMED_GONE = ("terminated", "not_created")


@dataclass(frozen=True)
class PlacedNode:
    """A node the work runs on: its rank, the worker that pulls the work, where it is."""

    rank: int
    worker_id: str
    vm: str | None
    address: str | None


def placed_nodes(machines: list[NodeInstance], existing: list[ExistingWorker]) -> list[PlacedNode]:
    """The nodes in rank order: the placed machines' workers, or the existing workers."""
    registered = [node for node in machines if node.worker_id]
    if registered:
        return [
            PlacedNode(
                rank=rank, worker_id=node.worker_id or "", vm=node.vm, address=_address(node)
            )
            for rank, node in enumerate(registered)
        ]
    return [
        PlacedNode(
            rank=rank, worker_id=worker.worker_id, vm=None, address=worker.capabilities.address
        )
        for rank, worker in enumerate(existing)
    ]


def _address(node: NodeInstance) -> str | None:
    """Where the other nodes reach this one: what its agent reported, else its SSH host."""
    if node.capabilities is not None and node.capabilities.address:
        return node.capabilities.address
    return node.ssh.host if node.ssh is not None else None


def gpus_of(node: NodeInstance) -> int | None:
    """The GPUs the node reported at registration (None where it never registered)."""
    return len(node.capabilities.gpus) if node.capabilities is not None else None


def assignments(spec: JobSpec, nodes: list[PlacedNode], attempt: int = 1) -> list[Assignment]:
    """Every node's command; `attempt`: 1 for the first epoch, one more per restart."""
    assert spec.run is not None
    addresses = [node.address or "" for node in nodes]
    common = {
        **spec.env,
        "GPUPROV_JOB_NAME": spec.name,
        "GPUPROV_ATTEMPT": str(attempt),
        "GPUPROV_NUM_NODES": str(len(nodes)),
        "GPUPROV_NODE_IPS": "\n".join(addresses),
        "GPUPROV_MASTER_ADDR": addresses[0] if addresses else "",
    }
    return [
        Assignment(
            rank=node.rank,
            worker_id=node.worker_id,
            vm=node.vm,
            command=RunCommand(
                setup=spec.setup,
                run=spec.run,
                env={**common, "GPUPROV_NODE_RANK": str(node.rank)},
            ),
        )
        for node in nodes
    ]


@dataclass(frozen=True)
class Running:
    pass


@dataclass(frozen=True)
class Completed:
    pass


@dataclass(frozen=True)
class Failed:
    message: str


@dataclass(frozen=True)
class Lost:
    cause: str
    reclaimed: bool = False  # the cloud said it takes the machine back (a spot reclaim)


Judgement = Running | Completed | Failed | Lost


def judge(
    work: list[NodeWork], health: list[HealthReport], lost_workers: dict[str, str]
) -> Judgement:
    """What the nodes' reports add up to. `lost_workers`: worker id -> why it is lost (its
    agent went silent, its GPU broke, or the cloud takes its machine back)."""
    for node in work:
        reason = lost_workers.get(node.worker_id)
        # A node the cloud takes back stopped its work on the notice: that end is not the
        # work's own (only a clean exit before it counts as one).
        taken = reason is not None and reason.startswith(TAKEN_BACK) and node.exit_code != 0
        if reason is not None and (taken or not node.state.final):
            where = node.vm or f"worker {node.worker_id}"
            return Lost(f"node {node.rank} ({where}): {reason}", reason.startswith(RECLAIMED))
    for node in work:
        if node.lease_lapsed:
            where = node.vm or f"worker {node.worker_id}"
            return Lost(
                f"node {node.rank} ({where}): cut off from the control plane, it stopped its "
                f"work when its lease lapsed (exit {node.exit_code})"
            )
    ranks = {node.vm: node.rank for node in work if node.vm}
    for report in health:
        if report.verdict in (Verdict.GONE, Verdict.UNHEALTHY):
            said = "; ".join(f.message for f in report.findings if f.severity.value == "critical")
            where = f"node {ranks[report.vm]} ({report.vm})" if report.vm in ranks else report.vm
            return Lost(f"{where} is {report.verdict.value}: {said or 'the cloud says so'}")
    exited = [node for node in work if node.state is WorkState.EXITED]
    for node in sorted(exited, key=lambda n: n.rank):
        if node.exit_code != 0:
            return Failed(failure_message(node))
    if work and all(node.state is WorkState.EXITED for node in work):
        return Completed()
    return Running()


RECLAIMED = "spot reclaimed"  # how a reclaim's cause begins: the offer's block says it too
MACHINE_STOPS = "maintenance stops the machine"
TAKEN_BACK = (RECLAIMED, MACHINE_STOPS)


def lost(workers: list[WorkerLiveness]) -> dict[str, str]:
    """Worker id -> why it cannot carry the work any more: the cloud says it takes the machine
    back (a reclaim, or a maintenance that stops it), its agent went silent, or it reports a
    broken GPU (a GPU fallen off the bus, an uncorrectable ECC error, ...)."""
    reasons = {}
    for worker in workers:
        if worker.state == "revoked":  # an earlier attempt's, already let go
            continue
        notice = worker.notice
        if notice is not None and notice.ends_the_machine:
            said = notice.detail or f"{notice.source} {notice.action}"
            first = RECLAIMED if notice.kind == "reclaim" else MACHINE_STOPS
            reasons[worker.worker_id] = f"{first} ({said})"
        elif worker.liveness == "lost":
            seen = worker.last_seen_at.isoformat() if worker.last_seen_at else "never"
            reasons[worker.worker_id] = f"its agent went silent (last heard {seen})"
        elif worker.health == "unhealthy":
            reasons[worker.worker_id] = f"unhealthy: {worker.detail or 'its agent says so'}"
    return reasons


def unreachable(workers: list[WorkerLiveness], health: list[HealthReport]) -> set[str]:
    """Workers that cannot be expected to report their work stopped: silent or unhealthy
    agents, and the workers of machines the cloud reports gone or unhealthy. A node the cloud
    only said it takes back still reports: its work is stopping, maybe checkpointing."""
    silent = {worker for worker, why in lost(workers).items() if not why.startswith(TAKEN_BACK)}
    broken = {r.vm for r in health if r.verdict in (Verdict.GONE, Verdict.UNHEALTHY)}
    silent |= {w.worker_id for w in workers if w.vm is not None and w.vm in broken}
    return silent


def failure_message(node: NodeWork) -> str:
    where = node.vm or f"worker {node.worker_id}"
    lines = (node.tail or "").rstrip("\n").splitlines()[-MAX_TAIL_LINES:]
    tail = "".join(f"\n    {line}" for line in lines)
    return f"node {node.rank} ({where}) exited with code {node.exit_code}" + (
        f"; its last lines:{tail}" if tail else ""
    )


def settled(work: list[NodeWork]) -> bool:
    """Whether nothing of the run executes any more (every node's part has ended)."""
    return all(node.state.final for node in work)


def work_fence(
    workers: list[WorkerLiveness], nodes: list[NodeInstance], ended: set[str]
) -> datetime | None:
    """When a new attempt's work may start: past the `work_ends_by` (with FENCE_MARGIN) of
    every old worker that might still run its work: not one whose work was reported ended
    (`ended`: worker ids), nor one whose machine the cloud confirmed gone. None: no wait."""
    gone = {node.vm for node in nodes if node.status in CONFIRMED_GONE}
    waits = [
        worker.work_ends_by + FENCE_MARGIN
        for worker in workers
        if worker.work_ends_by is not None
        and worker.worker_id not in ended
        and (worker.vm is None or worker.vm not in gone)
    ]
    return max(waits) if waits else None


def taken_back_by(workers: list[WorkerLiveness]) -> datetime | None:
    """The earliest deadline of the cloud's notices that it takes a machine back (None: no
    such notice says when)."""
    deadlines = [
        worker.notice.deadline
        for worker in workers
        if worker.state != "revoked"
        and worker.notice is not None
        and worker.notice.ends_the_machine
        and worker.notice.deadline is not None
    ]
    return min(deadlines) if deadlines else None
