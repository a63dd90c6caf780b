"""Database activities: the job's durable records beside Temporal's history.

- reserve_existing_workers (called by activities/job_context.py): all-or-nothing reservation of
  idle, compatible existing workers (atomic per worker, so two jobs never get the same one).
- active_blocks / record_block: blocks shared by every job until they expire (a Capacity block
  backs off per offering: gpuprov/store/capacity.py).
- claim_launch / capacity_back: the launch budget of an offering that keeps failing with
  Capacity, and its reset once a probe made its nodes ready.
- record_cost: the estimate written when an attempt starts (a machine's actual is written
  by `Records.vm_terminated` when it is confirmed gone: gpuprov/store/costs.py).
- mark_vm: VM row status as teardown confirms it; a terminated VM's worker is revoked.
- mark_placed: at ready, the job's workers become busy and its VM rows running.
- record_orphan: a termination that did not confirm; the reconciler keeps trying (a new
  orphan counts in gpuprov_orphans_found_total; a repeat only bumps its attempts).
- resolve_orphan: the reconciler confirmed it gone and cleaned up (counted in
  gpuprov_orphans_resolved_total).
- release_job_workers: at a terminal state, existing workers go back to idle and managed
  workers are revoked.
Every call runs the synchronous Records method in a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import Field
from temporalio import activity

from activities import metrics
from gpuprov.models import Block, BlockScope, ExistingWorker, NodeInstance, WorkerCapabilities
from gpuprov.store.capacity import CapacityBackoff, LaunchBudget
from gpuprov.store.db import BlockRecord, OrphanRecord
from gpuprov.store.records import Records
from providers.base import Location, Model, PriceQuote, ResourceRequest, compatibility_reasons
from providers.errors import ErrorKind


class ReserveInput(Model):
    job: str
    request: ResourceRequest
    nodes: int
    run: str | None = None  # the job's run (gpuprov/store/runs.py); None: sent before runs were


class BlockInput(Model):
    job: str
    block: Block
    now: datetime | None = None  # the job's clock (workflow time); None: the worker's


class BlocksQuery(Model):
    now: datetime | None = None  # the job's clock (workflow time); None: the worker's


class LaunchInput(Model):
    key: str  # the offer's block key (its id)
    now: datetime | None = None


class LaunchGrant(Model):
    granted: bool
    probe: bool = False  # a create that tests an offering with Capacity strikes
    retry_at: datetime | None = None  # refused: ask again then


class CostInput(Model):
    job: str
    kind: str = "estimate"
    quote: PriceQuote
    provider: str | None = None  # the offer's provider, for `gpuprov cost` per provider
    run: str | None = None  # the job's run (gpuprov/store/runs.py); None: sent before runs were


class VmStatusInput(Model):
    vm: str
    status: str


class PlacedInput(Model):
    job: str
    vms: list[str] = Field(default_factory=list)
    worker_ids: list[str] = Field(default_factory=list)  # the placed nodes' workers only


class OrphanInput(Model):
    node: NodeInstance
    error: str
    # The reconciler's own failed try (its backoff grows); a job's teardown records, however
    # often it repeats (a re-run local activity), do not count as tries.
    retried: bool = True


class ResolveInput(Model):
    vm: str
    provider: str


class ReleaseInput(Model):
    job: str
    run: str | None = None  # the job's run (gpuprov/store/runs.py); None: sent before runs were


class ReleasedWorkers(Model):
    idle: list[str] = Field(default_factory=list)
    revoked: list[str] = Field(default_factory=list)


class StoreActivities:
    def __init__(
        self,
        records: Records,
        block_ttl: timedelta,
        backoff: CapacityBackoff | None = None,
        budget: LaunchBudget | None = None,
    ) -> None:
        self._records = records
        self._block_ttl = block_ttl
        self._backoff = backoff or CapacityBackoff()
        self._budget = budget or LaunchBudget(records.db)

    def all(self) -> list[Any]:
        return [
            self.active_blocks,
            self.record_block,
            self.claim_launch,
            self.capacity_back,
            self.record_cost,
            self.mark_vm,
            self.mark_placed,
            self.record_orphan,
            self.resolve_orphan,
            self.release_job_workers,
        ]

    async def reserve_existing_workers(self, request: ReserveInput) -> list[ExistingWorker]:
        return await asyncio.to_thread(self._reserve_all_or_none, request)

    async def note_run(self, job: str, run: str | None) -> None:
        """The job's run recorded (once), before it writes anything else."""
        await asyncio.to_thread(self._records.note_run, job, run)

    def _reserve_all_or_none(self, request: ReserveInput) -> list[ExistingWorker]:
        if request.request.image is not None:
            return []  # an existing worker runs what it booted: only a new machine boots it

        def eligible(worker: Any) -> bool:
            capabilities = WorkerCapabilities.model_validate(worker.capabilities)
            shape = capabilities.shape(worker.provider, worker.region)
            return not compatibility_reasons(shape, request.request)

        reserved = []
        for _ in range(request.nodes):
            worker = self._records.reserve_worker(
                job=request.job, eligible=eligible, run=request.run
            )
            if worker is None:
                break
            reserved.append(worker)
        if len(reserved) < request.nodes:
            for worker in reserved:  # not enough for the whole job: give them back
                self._records.set_worker_state(worker.id, "idle", None)
            return []
        return [
            ExistingWorker(
                worker_id=worker.id,
                label=worker.label,
                capabilities=WorkerCapabilities.model_validate(worker.capabilities),
            )
            for worker in reserved
        ]

    @activity.defn(name="active_blocks")
    async def active_blocks(self, query: BlocksQuery | None = None) -> list[Block]:
        now = (query.now if query is not None else None) or datetime.now(UTC)
        rows = await asyncio.to_thread(self._records.active_blocks, now)
        return [_block(row) for row in rows]

    @activity.defn(name="record_block")
    async def record_block(self, request: BlockInput) -> Block:
        """The block as recorded: its expiry is the shared one (the backoff's, for Capacity)."""
        block = request.block
        row = await asyncio.to_thread(
            lambda: self._records.record_block(
                scope=block.scope.value,
                key=block.key,
                kind=block.kind.value,
                message=block.message,
                job=request.job,
                ttl=self._block_ttl,
                now=request.now,
                backoff=self._backoff,
            )
        )
        return block.model_copy(update={"expires_at": _aware_utc(row.expires_at)})

    @activity.defn(name="claim_launch")
    async def claim_launch(self, request: LaunchInput) -> LaunchGrant:
        now = request.now or datetime.now(UTC)
        grant = await asyncio.to_thread(self._budget.claim, request.key, now)
        return LaunchGrant(granted=grant.granted, probe=grant.probe, retry_at=grant.retry_at)

    @activity.defn(name="capacity_back")
    async def capacity_back(self, request: LaunchInput) -> None:
        await asyncio.to_thread(self._budget.came_back, request.key)

    @activity.defn(name="record_cost")
    async def record_cost(self, request: CostInput) -> None:
        quote = request.quote
        await asyncio.to_thread(
            lambda: self._records.record_cost(
                job=request.job,
                kind=request.kind,
                amount=quote.amount,
                currency=quote.currency,
                unit=quote.unit,
                source=quote.source,
                recorded_at=quote.observed_at,
                provider=request.provider,
                run=request.run,
            )
        )

    @activity.defn(name="mark_vm")
    async def mark_vm(self, request: VmStatusInput) -> None:
        """Set the VM row's status; a terminated VM's worker is revoked with it."""
        await asyncio.to_thread(self._mark_vm, request)

    def _mark_vm(self, request: VmStatusInput) -> None:
        if request.status == "terminated":
            self._records.vm_terminated(request.vm)
            return
        if self._records.get_vm(request.vm) is None:  # create never ran for it (the row is
            return  # written inside create)
        self._records.set_vm_status(request.vm, request.status)

    @activity.defn(name="mark_placed")
    async def mark_placed(self, request: PlacedInput) -> None:
        """At ready: the job's reserved workers become busy, its machines' rows running."""
        await asyncio.to_thread(
            self._records.mark_placed, request.job, request.vms, request.worker_ids
        )

    @activity.defn(name="record_orphan")
    async def record_orphan(self, request: OrphanInput) -> None:
        node = request.node
        await record_possible_orphan(
            self._records,
            node.location,
            node.vm,
            node.instance_ids,
            request.error,
            retried=request.retried,
        )

    @activity.defn(name="resolve_orphan")
    async def resolve_orphan(self, request: ResolveInput) -> bool:
        """The machine is confirmed gone and its side resources cleaned: close its orphan
        record. False when none was open (a repeat)."""
        resolved = await asyncio.to_thread(self._records.resolve_orphan, request.vm)
        if resolved:
            metrics.orphan_resolved(request.provider)
        return resolved

    @activity.defn(name="release_job_workers")
    async def release_job_workers(self, request: ReleaseInput) -> ReleasedWorkers:
        rows = await asyncio.to_thread(self._records.release_job_workers, request.job, request.run)
        released = ReleasedWorkers()
        for row in rows:
            (released.idle if row.state == "idle" else released.revoked).append(row.id)
        return released


async def record_possible_orphan(
    records: Records,
    location: Location,
    vm: str,
    instance_ids: list[str],
    error: str,
    *,
    retried: bool = True,
) -> OrphanRecord:
    """Record a machine that may outlive its job (a repeat bumps its attempts); a new one
    counts in gpuprov_orphans_found_total. Used by teardown and by the reconciler's survey."""
    orphan = await asyncio.to_thread(
        lambda: records.record_orphan(
            provider=location.provider,
            region=location.region,
            zone=location.zone,
            vm=vm,
            instance_ids=instance_ids,
            error=error,
            retried=retried,
        )
    )
    if orphan.attempts == 1:  # a failed retry of a known orphan is not new
        metrics.orphan_found(location.provider)
    return orphan


def _aware_utc(moment: datetime) -> datetime:
    """SQLite hands datetimes back naive; every stored time is UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _block(row: BlockRecord) -> Block:
    return Block(
        scope=BlockScope(row.scope),
        key=row.key,
        kind=ErrorKind(row.kind),
        message=row.message,
        expires_at=_aware_utc(row.expires_at),
    )
