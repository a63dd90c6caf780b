"""Steps 3 and 4 of a job's life: provision, within `provisioning_timeout_seconds`.

Plan on every enabled provider in parallel, skip offers under a block, rank the rest cheapest
first (workflows/selection.py), and try them in that order, one saga attempt each
(workflows/attempt.py): record an estimate, bring every node up and wait for its agent's
registration. A failure is decided by `gpuprov/policy.py`: unwind the attempt's compensations
(LIFO), block what it says (shared with every job until the block expires), abort, or move on
to the next offer. When other jobs' blocks cover every offer left, wait for the first to lapse
and plan again; with `placement.capacity_wait` (the default), an offer that failed for capacity
or quota is tried again once its block lapses, the job sleeping on a durable timer meanwhile
(workflows/capacity_wait.py), and after such a wait each try asks the offering's launch budget
first (gpuprov/store/capacity.py). `placement.hedge` races attempts (workflows/hedge.py);
`placement.order: ready_time` ranks by the offer statistics. Every attempt's outcome is
recorded per offering (the offer statistics). The winning attempt's compensation stack
(`stack`) is the job's to unwind at release; a job that restarts after a lost node provisions
again with a new `Provisioning`. Deterministic only.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import gpuprov.policy as policy
    import workflows.metrics as metrics
    import workflows.report as report
    from activities.cloud import CloudActivities, PlanInput
    from activities.errors import StepFailure
    from activities.offer_stats import OfferStatsActivities, OfferStatsQuery
    from activities.store import (
        BlockInput,
        BlocksQuery,
        CostInput,
        LaunchInput,
        StoreActivities,
    )
    from activities.teams import Admission
    from gpuprov import contract
    from gpuprov.contract import vm_run_tag
    from gpuprov.models import (
        Attempt,
        AttemptOutcome,
        AttemptRecord,
        Block,
        BlockScope,
        JobSpec,
        JobState,
        JobStatus,
        OfferStats,
        PlacementOrder,
        offering_of,
    )
    from providers.base import Capabilities, Offer
    from workflows import budget, capacity_wait
    from workflows.attempt import AttemptSaga
    from workflows.compensation import (
        Compensation,
        CompensationStack,
        unwind_surviving_cancellation,
    )
    from workflows.failures import JobFailed
    from workflows.hedge import Race, Runner, loser_cost
    from workflows.selection import blocking, by_ready_time, hedge_delay, rank_offers
    from workflows.steps import run_step

# New commands in a job's run, each behind its patch so that histories written before replay
# as they ran: the capacity wait (and the job's clock on the block steps, the launch budget),
# the per-offering record of every attempt, and the fixes below.
CAPACITY_WAIT = "capacity-wait"
ATTEMPT_RECORDS = "attempt-records"
# A job that ends before it handed out work gives up its work rows anyway (workflows/job.py).
ABANDON_STRAY_WORK = "abandon-stray-work"
# The provisioning deadline (or a cancel) landing after an attempt won, while the race's losers
# are torn down or its records written, unwinds the winner too (workflows/job.py, hedge.py).
UNWIND_WINNER_AT_DEADLINE = "unwind-winner-at-deadline"
# Work is handed to the nodes by an activity task, never by a local activity (workflows/job.py).
ASSIGN_WORK_AS_TASK = "assign-work-as-task"
# A job is admitted by its team, tagged GpuprovTeam, held to its team's budget (workflows/job.py).
TEAMS = "teams"
# Every change above at once (2026-12-06): a run started from now on records this one marker
# (and one TemporalChangeVersion upsert), not six of each; a run started before it replays
# the six it recorded.
ALL_CHANGES_2026_12 = "provisioning-changes-2026-12"


@dataclass(frozen=True)
class ProvisioningChanges:
    """Which of those changes a run takes, decided once, in the run's first activation.

    Asked for after the run's first local activity, these were seen on a loaded machine to
    fail the replay behind a status query ("patch marker encountered for change capacity-wait,
    but there is no corresponding change command"): where the marker lands then depends on
    how the first workflow tasks were split around the local activity. Asked for before any
    command, the marker is always in the first task."""

    capacity_wait: bool = False
    attempt_records: bool = False
    abandon_stray_work: bool = False
    unwind_winner_at_deadline: bool = False
    assign_work_as_task: bool = False
    teams: bool = False

    @classmethod
    def decide(cls) -> ProvisioningChanges:
        if workflow.patched(ALL_CHANGES_2026_12):
            return cls(
                capacity_wait=True,
                attempt_records=True,
                abandon_stray_work=True,
                unwind_winner_at_deadline=True,
                assign_work_as_task=True,
                teams=True,
            )
        return cls(
            capacity_wait=workflow.patched(CAPACITY_WAIT),
            attempt_records=workflow.patched(ATTEMPT_RECORDS),
            abandon_stray_work=workflow.patched(ABANDON_STRAY_WORK),
            unwind_winner_at_deadline=workflow.patched(UNWIND_WINNER_AT_DEADLINE),
            assign_work_as_task=workflow.patched(ASSIGN_WORK_AS_TASK),
            teams=workflow.patched(TEAMS),
        )


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
    changes: ProvisioningChanges = field(default_factory=ProvisioningChanges)
    # What the job's team left it of its monthly budget: every offer is held against it.
    admission: Admission | None = None
    # From the spec and the run's changes: wait for capacity, record attempts.
    waits: bool = False
    records: bool = False
    waited: bool = False  # a capacity wait has happened: tries ask the launch budget first
    refused_until: dict[str, datetime] = field(default_factory=dict)  # launch budget: offer id
    probes: set[str] = field(default_factory=set)  # offer ids granted as a probe
    stats: dict[str, OfferStats] = field(default_factory=dict)

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
        self.waits = self.spec.placement.capacity_wait and self.changes.capacity_wait
        self.records = self.changes.attempt_records
        while True:
            self.waiting("offers from the enabled providers")
            offers = await self._plan()
            if self.spec.placement.hedge is not None:
                if await self._race(offers):
                    return
            else:
                for offer in offers:
                    if not self._may_try(offer) or not await self._cleared(offer):
                        continue
                    if await self._try_offer(offer):
                        return
            if self.waits:
                await self._wait_for_capacity(offers)
                continue
            wait = self._until_a_shared_block_lapses(offers)
            if wait is None:
                raise JobFailed(report.spent_message(self.status, offers))
            # Other jobs' recent failures block every offer left: wait for the first of those
            # blocks to lapse and plan again (within the provisioning timeout), rather than fail
            # a job that never tried.
            self.waiting(f"offers blocked by other jobs' failures; next block lapses in {wait:g}s")
            await workflow.sleep(wait)

    async def _wait_for_capacity(self, offers: list[Offer]) -> None:
        """Sleep until the first block on an offer the job may still use lapses; fail when
        there is none (every offer left failed otherwise, or none was offered)."""
        upcoming = capacity_wait.next_try(
            offers, self.status.blocks, self._ruled_out, self.refused_until
        )
        if upcoming is None:
            raise JobFailed(report.spent_message(self.status, offers))
        events = workflow.info().get_current_history_length()
        if events >= capacity_wait.MOST_EVENTS_WAITING:
            # A wait is one run: past this, Temporal would soon terminate the job (51,200
            # events) instead of letting it fail cleanly, naming why.
            raise JobFailed(capacity_wait.too_long_message(events, self.status, offers))
        now = workflow.now()
        self.waiting(capacity_wait.waiting_message(offers, self.status, upcoming, now))
        self.waited = True
        await workflow.sleep(upcoming.seconds_from(now))

    def _may_try(self, offer: Offer) -> bool:
        if blocking(self.status.blocks, offer) is not None or self._ruled_out(offer):
            return False
        refused = self.refused_until.get(offer.id)
        return refused is None or refused <= workflow.now()

    def _ruled_out(self, offer: Offer) -> bool:
        """Tried already, and not to be tried again: every earlier try, unless the job waits
        for capacity and the latest one failed for capacity or quota with a block that lapses
        (tried again once it has)."""
        tries = [attempt for attempt in self.status.attempts if attempt.offer.id == offer.id]
        if not tries:
            return False
        if not self.waits or not capacity_wait.waitable(tries[-1]):
            return True
        covering = [block for block in self.status.blocks if block.covers(offer)]
        return any(block.expires_at is None for block in covering)

    async def _cleared(self, offer: Offer) -> bool:
        """After a capacity wait, a try asks the offering's launch budget first: a sold-out
        offering is probed by a few creates per window across every job, not a hundred."""
        if not (self.waits and self.waited):
            return True
        grant = await run_step(
            StoreActivities.claim_launch, LaunchInput(key=offer.id, now=workflow.now())
        )
        if not grant.granted:
            self.refused_until[offer.id] = grant.retry_at or workflow.now()
            return False
        if grant.probe:
            self.probes.add(offer.id)
        return True

    async def _race(self, offers: list[Offer]) -> bool:
        hedge = self.spec.placement.hedge
        assert hedge is not None
        queue = list(offers)

        async def next_offer(beside_another: bool) -> Offer | None:
            while queue:
                offer = queue.pop(0)
                if not self._may_try(offer):
                    continue
                if beside_another and offer.price is None and hedge.max_extra_cost is not None:
                    continue  # what it would cost is unknown: it is not raced
                if await self._cleared(offer):
                    return offer
            return None

        def start(offer: Offer, beside_another: bool) -> Runner:
            attempt = self._new_attempt(offer, hedge=beside_another)
            stack = CompensationStack()
            task = asyncio.create_task(self._run_attempt(attempt, stack))
            return Runner(attempt, task, stack)

        def delay_for(offer: Offer) -> float:
            return hedge_delay(offer, self.stats.get(offering_of(offer)), self._hints(offer))

        first = len(self.status.attempts)

        def on_win(winner: Runner) -> None:
            self.stack = winner.stack

        race = Race(
            hedge,
            self.spec.nodes,
            self.status.attempts,
            delay_for,
            next_offer,
            start,
            on_win if self.changes.unwind_winner_at_deadline else None,
        )
        winner = await race.run()
        if winner is None:
            return False
        self.stack = winner.stack
        self._won_with(winner.attempt)
        for attempt in self.status.attempts[first:]:
            if attempt.outcome is AttemptOutcome.LOST_RACE:
                await self._record(attempt, "lost_race")
        return True

    async def _plan(self) -> list[Offer]:
        if self.prefetched_blocks is not None:  # the first plan reads what step 2 read
            shared_blocks, self.prefetched_blocks = self.prefetched_blocks, None
        else:
            query = BlocksQuery(now=workflow.now()) if self.waits else None
            self.capabilities, shared_blocks = await asyncio.gather(
                run_step(CloudActivities.describe_providers),
                run_step(StoreActivities.active_blocks, query),
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
        if self.admission is not None and self.admission.left_usd is not None:
            within = []
            for offer in ranked:
                reason = budget.budget_reason(offer, self.spec, self.admission)
                if reason is None:
                    within.append(offer)
                else:
                    self.status.rejected_offers.append(f"{offer.id}: {reason}")
            if ranked and not within:
                raise JobFailed(budget.refused_message(self.admission, self.spec, ranked))
            ranked = within
        if self._needs_stats() and ranked:
            found = await run_step(
                OfferStatsActivities.offer_stats,
                OfferStatsQuery(
                    now=workflow.now(),
                    offerings=sorted({offering_of(offer) for offer in ranked}),
                ),
            )
            self.stats = {record.offering: record for record in found}
        if self.spec.placement.order is PlacementOrder.READY_TIME:
            ranked = by_ready_time(ranked, self.stats, self.capabilities, workflow.now())
        return ranked

    def _needs_stats(self) -> bool:
        placement = self.spec.placement
        auto = placement.hedge is not None and placement.hedge.after_seconds == "auto"
        return auto or placement.order is PlacementOrder.READY_TIME

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
        attempt = self._new_attempt(offer)
        self.stack = CompensationStack()
        return await self._run_attempt(attempt, self.stack)

    def _new_attempt(self, offer: Offer, hedge: bool = False) -> Attempt:
        attempt = Attempt(
            number=len(self.status.attempts) + 1,
            offer=offer,
            hedge=hedge,
            started_at=workflow.now(),
        )
        self.status.attempts.append(attempt)
        return attempt

    async def _run_attempt(self, attempt: Attempt, stack: CompensationStack) -> bool:
        """Bring `attempt` up as a saga on `stack`. True when every node is placed; False to
        fail over (its compensations undone). A cancel undoes them, then propagates."""
        offer = attempt.offer
        metrics.offer_tried(offer)
        self._upsert_placement(offer)
        await self._record_estimate(offer)
        waiting = self.waiting
        if attempt.hedge or self.spec.placement.hedge is not None:
            number = attempt.number
            waiting = lambda text: self.waiting(f"attempt #{number}: {text}")  # noqa: E731
        saga = AttemptSaga(self.spec, attempt, self._hints(offer), stack, waiting)
        self.status.nodes += saga.nodes
        try:
            await saga.bring_up()
        except StepFailure as failure:
            await self._fail_attempt(attempt, failure, stack)
            attempt.ended_at = workflow.now()
            await self._record(attempt, "failed")
            return False
        except asyncio.CancelledError:
            # Workflow cancelled, provisioning timed out, or another attempt won the race: undo
            # this attempt, then propagate.
            lost = attempt.outcome is AttemptOutcome.LOST_RACE
            if not lost:
                attempt.outcome = AttemptOutcome.ABANDONED
            self.waiting(f"teardown of attempt #{attempt.number} after cancellation")
            await unwind_surviving_cancellation(stack, on_failure=self.record_leak)
            attempt.ended_at = workflow.now()
            if lost:
                attempt.cost = loser_cost(attempt, self.spec.nodes, self._hints(offer).billing)
            raise
        attempt.outcome = AttemptOutcome.SUCCEEDED
        attempt.ended_at = workflow.now()
        await self._record(attempt, "ready")
        if offer.id in self.probes:  # the offering is back: the other jobs need not wait
            await run_step(
                StoreActivities.capacity_back, LaunchInput(key=offer.id, now=workflow.now())
            )
        return True

    def _upsert_placement(self, offer: Offer) -> None:
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

    def _won_with(self, attempt: Attempt) -> None:
        """A race's winner: the job's provider, region and estimate are its own."""
        offer = attempt.offer
        self._upsert_placement(offer)
        if offer.price is not None:
            quote = offer.price.model_copy(update={"amount": offer.price.amount * self.spec.nodes})
            self.status.hourly_cost = quote
        else:
            self.status.hourly_cost = None

    def _hints(self, offer: Offer) -> Capabilities:
        return self.capabilities[offer.provider]

    async def _record(self, attempt: Attempt, outcome: str) -> None:
        """The attempt's outcome in the offer statistics (a best guide, not a promise)."""
        if not self.records or attempt.started_at is None or attempt.ended_at is None:
            return
        offer = attempt.offer
        ready = outcome == "ready"
        record = AttemptRecord(
            offering=offering_of(offer),
            provider=offer.provider,
            region=offer.region,
            instance_type=offer.instance_type,
            spot=offer.spot,
            job=self.spec.name,
            run=vm_run_tag(workflow.info().first_execution_run_id),
            attempt=attempt.number,
            nodes=self.spec.nodes,
            outcome=outcome,  # type: ignore[arg-type]
            kind=attempt.kind,
            step=attempt.step,
            started_at=attempt.started_at,
            ended_at=attempt.ended_at,
            seconds_to_ready=(
                (attempt.ended_at - attempt.started_at).total_seconds() if ready else None
            ),
        )
        await run_step(OfferStatsActivities.record_attempt, record)

    async def _fail_attempt(
        self, attempt: Attempt, failure: StepFailure, stack: CompensationStack
    ) -> None:
        attempt.outcome = AttemptOutcome.FAILED
        attempt.step, attempt.kind, attempt.message = failure.step, failure.kind, failure.message
        metrics.failover(failure.kind, attempt.offer)
        # `failure` is one node's (the first in node order); another node's create may have
        # landed with its answer lost, so every node whose first step started is torn down
        # (retire observes by identity first: a node where nothing landed costs one observe).
        decision = policy.decide(failure.failure(instances_may_exist=len(stack) > 0))
        if decision.teardown:
            self.waiting(f"teardown of attempt #{attempt.number}")
            await unwind_surviving_cancellation(stack, on_failure=self.record_leak)
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
        if not self.waits:
            await run_step(
                StoreActivities.record_block, BlockInput(job=self.spec.name, block=block)
            )
            return
        recorded = await run_step(
            StoreActivities.record_block,
            BlockInput(job=self.spec.name, block=block, now=workflow.now()),
        )
        if recorded is not None and failure.kind in capacity_wait.WAITABLE:
            # It lapses (the shared backoff's expiry), and the offer is tried again then.
            block.expires_at = recorded.expires_at


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
