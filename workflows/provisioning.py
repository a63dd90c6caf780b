"""Steps 3 and 4 of a job's life: provision, within `provisioning_timeout_seconds`.

Plan on every enabled provider in parallel, skip offers under a block, rank the rest cheapest
first (workflows/selection.py), and try them in that order, one saga attempt each
(workflows/attempt.py): record an estimate, bring every node up and wait for its agent's
registration. A failure is decided by `gpuprov/policy.py`: unwind the attempt's compensations
(LIFO), block what it says (shared with every job until the block expires), abort, or move on
to the next offer. When other jobs' blocks cover every offer left, wait for the first to lapse
and plan again. The winning attempt's compensation stack (`stack`) is the job's to unwind at
release; a job that restarts after a lost node provisions again with a new `Provisioning`.
Deterministic only.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import gpuprov.policy as policy
    import workflows.metrics as metrics
    import workflows.report as report
    from activities.cloud import CloudActivities, PlanInput
    from activities.errors import StepFailure
    from activities.store import BlockInput, CostInput, StoreActivities
    from gpuprov import contract
    from gpuprov.contract import vm_run_tag
    from gpuprov.models import (
        Attempt,
        AttemptOutcome,
        Block,
        BlockScope,
        JobSpec,
        JobState,
        JobStatus,
    )
    from providers.base import Capabilities, Offer
    from workflows.attempt import AttemptSaga
    from workflows.compensation import (
        Compensation,
        CompensationStack,
        unwind_surviving_cancellation,
    )
    from workflows.failures import JobFailed
    from workflows.selection import blocking, rank_offers
    from workflows.steps import run_step


@dataclass
class Provisioning:
    spec: JobSpec
    status: JobStatus
    capabilities: dict[str, Capabilities]
    waiting: Callable[[str], None]
    record_leak: Callable[[Compensation, StepFailure], None]
    # Shared blocks the job's first step read, for the first plan only.
    prefetched_blocks: list[Block] | None = None
    stack: CompensationStack = field(default_factory=CompensationStack)

    async def within_timeout(self) -> None:
        timeout = self.spec.provisioning_timeout_seconds
        task = asyncio.create_task(self._provision())
        try:
            done, _ = await workflow.wait([task], timeout=timeout)
        except asyncio.CancelledError:
            task.cancel()
            await _settled(task)
            raise
        if task in done:
            task.result()
            return
        task.cancel()
        await _settled(task)
        attempts = report.attempt_lines(self.status)
        raise JobFailed(f"provisioning timed out after {timeout}s; instances released.{attempts}")

    async def _provision(self) -> None:
        if not self.spec.placement.provisioning:
            raise JobFailed("placement.provisioning is false and no existing worker is eligible")
        while True:
            self.waiting("offers from the enabled providers")
            offers = await self._plan()
            for offer in offers:
                if blocking(self.status.blocks, offer) is not None or self._tried(offer):
                    continue
                if await self._try_offer(offer):
                    return
            wait = self._until_a_shared_block_lapses(offers)
            if wait is None:
                raise JobFailed(report.spent_message(self.status, offers))
            # Other jobs' recent failures block every offer left: wait for the first of those
            # blocks to lapse and plan again (within the provisioning timeout), rather than fail
            # a job that never tried.
            self.waiting(f"offers blocked by other jobs' failures; next block lapses in {wait:g}s")
            await workflow.sleep(wait)

    async def _plan(self) -> list[Offer]:
        if self.prefetched_blocks is not None:  # the first plan reads what step 2 read
            shared_blocks, self.prefetched_blocks = self.prefetched_blocks, None
        else:
            self.capabilities, shared_blocks = await asyncio.gather(
                run_step(CloudActivities.describe_providers),
                run_step(StoreActivities.active_blocks),
            )
        own = [block for block in self.status.blocks if block.expires_at is None]
        self.status.blocks = own + [
            block for block in shared_blocks if not any(_same(block, o) for o in own)
        ]
        allowed = self.spec.placement.providers
        providers = [p for p in sorted(self.capabilities) if allowed is None or p in allowed]
        if self.spec.run is not None:  # the work is pulled by each node's agent
            agentless = [p for p in providers if not self.capabilities[p].node_agent]
            self.status.rejected_offers += [
                f"{p}: its nodes run no agent, so no work can be given to them" for p in agentless
            ]
            providers = [p for p in providers if p not in agentless]
        request = self.spec.resource_request()
        results = await asyncio.gather(
            *(self._plan_one(PlanInput(provider=p, request=request)) for p in providers)
        )
        offers = [offer for result in results for offer in result]
        ranked, rejected = rank_offers(offers, self.spec.nodes, self.spec.max_hourly_cost)
        self.status.rejected_offers += rejected
        return ranked

    async def _plan_one(self, request: PlanInput) -> list[Offer]:
        try:
            result = await run_step(
                CloudActivities.plan, request, summary=f"plan on {request.provider}"
            )
        except StepFailure as failure:
            decision = policy.decide(failure.failure())
            if decision.abort:
                raise JobFailed(f"aborted: plan on {request.provider}: {failure}") from None
            if decision.block is not BlockScope.NONE:
                await self.add_block(decision.block, request.provider, failure)
            return []
        self.status.rejected_offers += result.rejected
        return result.offers

    def _tried(self, offer: Offer) -> bool:
        return any(attempt.offer.id == offer.id for attempt in self.status.attempts)

    def _until_a_shared_block_lapses(self, offers: list[Offer]) -> float | None:
        """Seconds until an untried offer is free of blocks, counting only shared blocks (with
        an expiry); None when every offer left is blocked by this job's own failures."""
        now = workflow.now()
        waits = []
        for offer in offers:
            if self._tried(offer):
                continue
            covering = [block for block in self.status.blocks if block.covers(offer)]
            if covering and all(block.expires_at is not None for block in covering):
                lapse = max(block.expires_at for block in covering if block.expires_at)
                waits.append(max(1.0, math.ceil((lapse - now).total_seconds())))
        return min(waits) if waits else None

    async def _try_offer(self, offer: Offer) -> bool:
        """One saga attempt on `offer`. True when every node is placed; False to fail over."""
        attempt = Attempt(number=len(self.status.attempts) + 1, offer=offer)
        self.status.attempts.append(attempt)
        self.stack = CompensationStack()
        metrics.offer_tried(offer)
        placement = [
            contract.PROVIDER.value_set(offer.provider),
            contract.REGION.value_set(offer.region),
        ]
        if self.status.state is not JobState.PROVISIONING:
            # The first offer tried: the job moves to provisioning in the same upsert (each
            # upsert is an event, and a visibility write on the server).
            placement.append(contract.STATE.value_set(JobState.PROVISIONING.value))
            metrics.job_state(JobState.PROVISIONING)
            self.status.state = JobState.PROVISIONING
        workflow.upsert_search_attributes(placement)
        await self._record_estimate(offer)
        saga = AttemptSaga(
            self.spec, attempt, self.capabilities[offer.provider], self.stack, self.waiting
        )
        self.status.nodes += saga.nodes
        try:
            await saga.bring_up()
        except StepFailure as failure:
            await self._fail_attempt(attempt, failure)
            return False
        except asyncio.CancelledError:
            # Workflow cancelled or provisioning timed out: undo this attempt, then propagate.
            attempt.outcome = AttemptOutcome.ABANDONED
            self.waiting(f"teardown of attempt #{attempt.number} after cancellation")
            await unwind_surviving_cancellation(self.stack, on_failure=self.record_leak)
            raise
        attempt.outcome = AttemptOutcome.SUCCEEDED
        return True

    async def _fail_attempt(self, attempt: Attempt, failure: StepFailure) -> None:
        attempt.outcome = AttemptOutcome.FAILED
        attempt.step, attempt.kind, attempt.message = failure.step, failure.kind, failure.message
        metrics.failover(failure.kind, attempt.offer)
        # `failure` is one node's (the first in node order); another node's create may have
        # landed with its answer lost, so every node whose first step started is torn down
        # (retire observes by identity first: a node where nothing landed costs one observe).
        decision = policy.decide(failure.failure(instances_may_exist=len(self.stack) > 0))
        if decision.teardown:
            self.waiting(f"teardown of attempt #{attempt.number}")
            await unwind_surviving_cancellation(self.stack, on_failure=self.record_leak)
        for node in self.status.nodes:
            if node.attempt == attempt.number and node.status == "requested":
                node.status = "not_created"  # nothing was started for it
        if decision.block is not BlockScope.NONE:
            key = block_key(decision.block, attempt.offer)
            await self.add_block(decision.block, key, failure)
        if decision.abort:
            raise JobFailed(f"aborted by {failure.kind.value}:{report.attempt_lines(self.status)}")

    async def _record_estimate(self, offer: Offer) -> None:
        """The estimate for the whole job on this offer (None-priced offers record nothing)."""
        if offer.price is None:
            self.status.hourly_cost = None
            return
        quote = offer.price.model_copy(update={"amount": offer.price.amount * self.spec.nodes})
        self.status.hourly_cost = quote
        metrics.estimated_spend(offer.provider, quote)
        run = vm_run_tag(workflow.info().first_execution_run_id)  # the job's run (job.py)
        estimate = CostInput(job=self.spec.name, quote=quote, provider=offer.provider, run=run)
        await run_step(StoreActivities.record_cost, estimate)

    async def add_block(self, scope: BlockScope, key: str, failure: StepFailure) -> None:
        if any(b.scope is scope and b.key == key for b in self.status.blocks):
            return
        block = Block(scope=scope, key=key, kind=failure.kind, message=failure.message)
        self.status.blocks.append(block)
        await run_step(StoreActivities.record_block, BlockInput(job=self.spec.name, block=block))


def _same(block: Block, other: Block) -> bool:
    return block.scope is other.scope and block.key == other.key


def block_key(scope: BlockScope, offer: Offer) -> str:
    if scope is BlockScope.OFFER:
        return offer.id
    if scope is BlockScope.REGION:
        return f"{offer.provider}/{offer.region}"
    return offer.provider


async def _settled(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError, JobFailed):
        await task
