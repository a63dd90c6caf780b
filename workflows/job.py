"""ProvisionJob: one job's life, top to bottom. Deterministic only.

1. accept: the input is a valid job spec whose name matches the workflow id (job-<name>), or
   the workflow fails at once naming the field, before any side effect (workflows/intake.py);
2. existing workers: one local activity reads the providers' capabilities and the shared blocks
   and reserves idle, compatible existing workers for every node (all or none); if it got them,
   the job skips to step 5;
3. provision, within `provisioning_timeout_seconds`: plan on every enabled provider in parallel,
   skip offers under a block, rank the rest cheapest first (workflows/selection.py);
4. try offers in that order, one saga attempt each (workflows/attempt.py): record an estimate,
   bring every node up and wait for its agent's registration. A failure is decided by
   `workflows/policy.py`: unwind the attempt's compensations (LIFO), block what it says (shared
   with every job until the block expires), abort, or move on to the next offer. When other
   jobs' blocks cover every offer left, wait for the first to lapse and plan again;
5. the k3s profile, where the spec asks for it; the job's workers busy, its VM rows running;
6. ready: wait for `release` (signal) or cancellation, checking each machine's health on the
   job's interval;
7. release: terminate and confirm gone (or keep); workers revoked, existing ones freed.
Cancellation at any moment still unwinds. State changes, attempts, failovers and time to ready
are counted in workflows/metrics.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import workflows.health as health
    import workflows.metrics as metrics
    import workflows.policy as policy
    import workflows.report as report
    from activities.cloud import CloudActivities, PlanInput
    from activities.errors import StepFailure
    from activities.health import HealthInput
    from activities.job_context import ContextInput, JobContextActivities
    from activities.k3s import K3sActivities, K3sInput, K3sNode
    from activities.store import (
        BlockInput,
        CostInput,
        PlacedInput,
        ReleaseInput,
        ReserveInput,
        StoreActivities,
        VmStatusInput,
    )
    from gpuprov import search_attributes
    from gpuprov.models import (
        Attempt,
        AttemptOutcome,
        Block,
        BlockScope,
        JobSpec,
        JobSpecError,
        JobState,
        JobStatus,
        NodeInstance,
        ReleasePolicy,
    )
    from providers.base import Capabilities, Offer
    from workflows.attempt import AttemptSaga
    from workflows.compensation import (
        Compensation,
        CompensationStack,
        unwind_surviving_cancellation,
    )
    from workflows.intake import NO_INPUT, accept_job_spec, job_name_of
    from workflows.selection import blocking, rank_offers
    from workflows.steps import run_step


class JobFailed(Exception):
    """Internal: the job cannot succeed; `run` turns it into the workflow's failure."""


@workflow.defn(name="ProvisionJob")
class ProvisionJob:
    def __init__(self) -> None:
        self._status = JobStatus(name=job_name_of(workflow.info().workflow_id))
        self._release_requested = False
        self._capabilities: dict[str, Capabilities] = {}
        self._stack = CompensationStack()
        # Shared blocks read by the first step, for the first plan only.
        self._prefetched_blocks: list[Block] | None = None

    @workflow.query
    def status(self) -> JobStatus:
        return self._status

    @workflow.signal
    def release(self) -> None:
        self._release_requested = True

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> JobStatus:
        self._spec = self._accept(raw)
        self._complete_start_attributes()
        metrics.job_state(JobState.QUEUED)
        try:
            if await self._reserve_existing_workers():
                metrics.provisioning_seconds("existing_worker")
            else:
                await self._provision_within_timeout()
                metrics.provisioning_seconds("provisioned")
            await self._set_up_profile()
            await self._mark_placed()
            self._set_state(JobState.READY, "release: signal `release` or cancel the workflow")
            await self._serve_until_released()
            await self._release()
            self._set_state(JobState.COMPLETED)
            return self._status
        except asyncio.CancelledError:
            if self._status.state in (JobState.QUEUED, JobState.PROVISIONING):
                metrics.provisioning_seconds("cancelled")
            self._set_state(JobState.RELEASING, "teardown after cancellation")
            await self._unwind()
            await self._free_workers()
            self._set_state(JobState.CANCELLED)
            raise
        except (JobFailed, StepFailure) as failure:
            # A StepFailure here is a bookkeeping step (the database) that failed for good
            # outside any attempt: the policy fails the job, which releases what it holds.
            metrics.provisioning_seconds("failed")
            await self._unwind()  # nothing is left by now; kept as a guarantee
            await self._free_workers()
            self._fail(str(failure))
            raise ApplicationError(str(failure), type="JobFailed", non_retryable=True) from None

    # ------------------------------------------------------------------ 1. accept

    def _accept(self, raw: RawValue) -> JobSpec:
        """The job spec, or the workflow fails now: nothing has happened yet to undo."""
        try:
            return accept_job_spec(raw, workflow.info().workflow_id, workflow.payload_converter())
        except JobSpecError as invalid:
            self._fail(str(invalid))
            raise ApplicationError(
                str(invalid), type="InvalidJobSpec", non_retryable=True
            ) from None

    def _complete_start_attributes(self) -> None:
        """`GpuprovClient.submit` sets the state (queued) and the GPU at start, at no cost in
        events; a job started another way (the temporal CLI, another SDK) gets them here."""
        present = workflow.info().typed_search_attributes
        missing = []
        if present.get(search_attributes.STATE) is None:
            missing.append(search_attributes.STATE.value_set(JobState.QUEUED.value))
        gpu = self._spec.resources.gpu
        if gpu and present.get(search_attributes.GPU) is None:
            missing.append(search_attributes.GPU.value_set(gpu))
        if missing:
            workflow.upsert_search_attributes(missing)

    # ------------------------------------------------------------------ 2. existing workers

    async def _reserve_existing_workers(self) -> bool:
        """One local activity: the providers' capabilities and the shared blocks for the first
        plan, then idle, compatible existing workers reserved for every node (none for the
        k3s profile, which installs over SSH on machines the job provisions). The job stays
        queued until it tries an offer."""
        k3s = self._spec.profile == "k3s"
        reserve = None
        if not k3s:
            reserve = ReserveInput(
                job=self._spec.name, request=self._spec.resource_request(), nodes=self._spec.nodes
            )
        self._waiting(
            "offers (the k3s profile provisions)" if k3s else "an idle, compatible existing worker"
        )
        context = await run_step(JobContextActivities.job_context, ContextInput(reserve=reserve))
        self._status.existing_workers = context.reserved  # freed by _free_workers at any ending
        self._capabilities = context.capabilities
        self._prefetched_blocks = context.blocks
        return bool(context.reserved)

    # ------------------------------------------------------------------ 3. provision

    async def _provision_within_timeout(self) -> None:
        timeout = self._spec.provisioning_timeout_seconds
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
        raise JobFailed(
            f"provisioning timed out after {timeout}s; instances released.{self._attempt_lines()}"
        )

    async def _provision(self) -> None:
        if not self._spec.placement.provisioning:
            raise JobFailed("placement.provisioning is false and no existing worker is eligible")
        while True:
            self._waiting("offers from the enabled providers")
            offers = await self._plan()
            for offer in offers:
                if blocking(self._status.blocks, offer) is not None or self._tried(offer):
                    continue
                if await self._try_offer(offer):
                    return
            wait = self._until_a_shared_block_lapses(offers)
            if wait is None:
                raise JobFailed(self._spent_message(offers))
            # Other jobs' recent failures block every offer left: wait for the first of those
            # blocks to lapse and plan again (within the provisioning timeout), rather than fail
            # a job that never tried.
            self._waiting(f"offers blocked by other jobs' failures; next block lapses in {wait:g}s")
            await workflow.sleep(wait)

    async def _plan(self) -> list[Offer]:
        if self._prefetched_blocks is not None:  # the first plan reads what step 2 read
            shared_blocks, self._prefetched_blocks = self._prefetched_blocks, None
        else:
            self._capabilities, shared_blocks = await asyncio.gather(
                run_step(CloudActivities.describe_providers),
                run_step(StoreActivities.active_blocks),
            )
        own = [block for block in self._status.blocks if block.expires_at is None]
        self._status.blocks = own + [
            block for block in shared_blocks if not any(_same(block, o) for o in own)
        ]
        allowed = self._spec.placement.providers
        providers = [p for p in sorted(self._capabilities) if allowed is None or p in allowed]
        request = self._spec.resource_request()
        results = await asyncio.gather(
            *(self._plan_one(PlanInput(provider=p, request=request)) for p in providers)
        )
        offers = [offer for result in results for offer in result]
        ranked, rejected = rank_offers(offers, self._spec.nodes, self._spec.max_hourly_cost)
        self._status.rejected_offers += rejected
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
                await self._add_block(decision.block, request.provider, failure)
            return []
        self._status.rejected_offers += result.rejected
        return result.offers

    def _tried(self, offer: Offer) -> bool:
        return any(attempt.offer.id == offer.id for attempt in self._status.attempts)

    def _until_a_shared_block_lapses(self, offers: list[Offer]) -> float | None:
        """Seconds until an untried offer is free of blocks, counting only shared blocks (with
        an expiry); None when every offer left is blocked by this job's own failures."""
        now = workflow.now()
        waits = []
        for offer in offers:
            if self._tried(offer):
                continue
            covering = [block for block in self._status.blocks if block.covers(offer)]
            if covering and all(block.expires_at is not None for block in covering):
                lapse = max(block.expires_at for block in covering if block.expires_at)
                waits.append(max(1.0, math.ceil((lapse - now).total_seconds())))
        return min(waits) if waits else None

    # ------------------------------------------------------------------ 4. try an offer

    async def _try_offer(self, offer: Offer) -> bool:
        """One saga attempt on `offer`. True when every node is placed; False to fail over."""
        attempt = Attempt(number=len(self._status.attempts) + 1, offer=offer)
        self._status.attempts.append(attempt)
        self._stack = CompensationStack()
        metrics.offer_tried(offer)
        placement = [
            search_attributes.PROVIDER.value_set(offer.provider),
            search_attributes.REGION.value_set(offer.region),
        ]
        if self._status.state is not JobState.PROVISIONING:
            # The first offer tried: the job moves to provisioning in the same upsert (each
            # upsert is an event, and a visibility write on the server).
            placement.append(search_attributes.STATE.value_set(JobState.PROVISIONING.value))
            metrics.job_state(JobState.PROVISIONING)
            self._status.state = JobState.PROVISIONING
        workflow.upsert_search_attributes(placement)
        await self._record_estimate(offer)
        saga = AttemptSaga(
            self._spec, attempt, self._capabilities[offer.provider], self._stack, self._waiting
        )
        self._status.nodes += saga.nodes
        try:
            await saga.bring_up()
        except StepFailure as failure:
            await self._fail_attempt(attempt, failure)
            return False
        except asyncio.CancelledError:
            # Workflow cancelled or provisioning timed out: undo this attempt, then propagate.
            attempt.outcome = AttemptOutcome.ABANDONED
            self._waiting(f"teardown of attempt #{attempt.number} after cancellation")
            await self._unwind()
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
        decision = policy.decide(failure.failure(instances_may_exist=len(self._stack) > 0))
        if decision.teardown:
            self._waiting(f"teardown of attempt #{attempt.number}")
            await self._unwind()
        for node in self._status.nodes:
            if node.attempt == attempt.number and node.status == "requested":
                node.status = "not_created"  # nothing was started for it
        if decision.block is not BlockScope.NONE:
            key = _block_key(decision.block, attempt.offer)
            await self._add_block(decision.block, key, failure)
        if decision.abort:
            raise JobFailed(f"aborted by {failure.kind.value}:{self._attempt_lines()}")

    async def _record_estimate(self, offer: Offer) -> None:
        """The estimate for the whole job on this offer (None-priced offers record nothing)."""
        if offer.price is None:
            self._status.hourly_cost = None
            return
        quote = offer.price.model_copy(update={"amount": offer.price.amount * self._spec.nodes})
        self._status.hourly_cost = quote
        metrics.estimated_spend(offer.provider, quote)
        await run_step(StoreActivities.record_cost, CostInput(job=self._spec.name, quote=quote))

    async def _add_block(self, scope: BlockScope, key: str, failure: StepFailure) -> None:
        if any(b.scope is scope and b.key == key for b in self._status.blocks):
            return
        block = Block(scope=scope, key=key, kind=failure.kind, message=failure.message)
        self._status.blocks.append(block)
        await run_step(StoreActivities.record_block, BlockInput(job=self._spec.name, block=block))

    # ------------------------------------------------------------------ 5. profile, placed

    async def _set_up_profile(self) -> None:
        """`profile: k3s`: node 0 runs the k3s server, the others join it (activities/k3s.py,
        over SSH; the cluster's join token never leaves the worker)."""
        if self._spec.profile != "k3s":
            return
        nodes = [node for node in self._status.live_nodes() if node.status == "running"]
        missing = [node.vm for node in nodes if node.ssh is None]
        if not nodes or missing:
            raise JobFailed(f"the k3s profile needs SSH to every node; none for {missing}")
        self._waiting(f"k3s: server on {nodes[0].vm}, {len(nodes) - 1} agent(s) joining")
        cluster = await run_step(
            K3sActivities.setup_k3s,
            K3sInput(
                nodes=[
                    K3sNode(vm=node.vm, provider=node.provider, ssh=node.ssh)
                    for node in nodes
                    if node.ssh is not None
                ]
            ),
            summary=f"k3s on {len(nodes)} node(s)",
        )
        self._status.kubeconfig = cluster.kubeconfig

    async def _mark_placed(self) -> None:
        """The job runs now: its workers are busy, its machines' rows say running."""
        placed = self._status.live_nodes()
        await run_step(
            StoreActivities.mark_placed,
            PlacedInput(
                job=self._spec.name,
                vms=[node.vm for node in placed],
                worker_ids=[
                    *(node.worker_id for node in placed if node.worker_id),
                    *(worker.worker_id for worker in self._status.existing_workers),
                ],
            ),
        )

    # ------------------------------------------------------------------ 6. ready

    async def _serve_until_released(self) -> None:
        """Wait for `release`; meanwhile check each machine's health on the job's interval and
        show it in the status and the current details."""
        interval = self._spec.health_check_interval_seconds
        machines = [node for node in self._status.live_nodes() if node.status == "running"]
        if not interval or not machines:
            await workflow.wait_condition(lambda: self._release_requested)
            return
        while True:
            try:
                await workflow.wait_condition(lambda: self._release_requested, timeout=interval)
                return
            except TimeoutError:
                await self._check_health(machines)

    async def _check_health(self, machines: list[NodeInstance]) -> None:
        reports = await asyncio.gather(
            *(
                health.check(HealthInput(vm=node.vm, expected_gpus=_gpus_of(node)))
                for node in machines
            )
        )
        self._status.health = list(reports)
        self._publish_details()

    # ------------------------------------------------------------------ 7. release

    async def _release(self) -> None:
        self._set_state(JobState.RELEASING, "terminating instances")
        if self._spec.release is ReleasePolicy.KEEP:
            self._stack.discard()  # first: nothing after this may tear the machines down
            for node in self._status.live_nodes():
                node.status = "kept"
                try:
                    await run_step(
                        StoreActivities.mark_vm, VmStatusInput(vm=node.vm, status="kept")
                    )
                except StepFailure as failure:
                    self._status.leaks.append(f"{node.vm} kept but not recorded: {failure}")
            await self._free_workers()
            return
        await self._unwind()
        await self._free_workers()

    async def _unwind(self) -> None:
        await unwind_surviving_cancellation(self._stack, on_failure=self._record_leak)

    def _record_leak(self, compensation: Compensation, failure: StepFailure) -> None:
        self._status.leaks.append(f"{compensation.name}: {failure}")

    async def _free_workers(self) -> None:
        """Existing workers back to idle, managed workers revoked (idempotent). Runs on every
        ending, so it records a failure instead of raising one."""
        try:
            await run_step(StoreActivities.release_job_workers, ReleaseInput(job=self._spec.name))
        except StepFailure as failure:
            self._status.leaks.append(f"workers of {self._spec.name} not freed: {failure}")

    # ------------------------------------------------------------------ status

    def _fail(self, error: str) -> None:
        self._status.error = error
        self._set_state(JobState.FAILED)

    def _set_state(self, state: JobState, waiting_for: str | None = None) -> None:
        if state is not self._status.state:  # each upsert is a history event
            workflow.upsert_search_attributes([search_attributes.STATE.value_set(state.value)])
            metrics.job_state(state)
        self._status.state = state
        self._status.waiting_for = waiting_for
        self._publish_details()

    def _waiting(self, waiting_for: str) -> None:
        self._status.waiting_for = waiting_for
        self._publish_details()

    def _publish_details(self) -> None:
        workflow.set_current_details(report.current_details(self._status))

    def _attempt_lines(self) -> str:
        return report.attempt_lines(self._status)

    def _spent_message(self, offers: list[Offer]) -> str:
        return report.spent_message(self._status, offers)


def _gpus_of(node: NodeInstance) -> int | None:
    """The GPUs the node reported at registration (None where it never registered)."""
    return len(node.capabilities.gpus) if node.capabilities is not None else None


def _same(block: Block, other: Block) -> bool:
    return block.scope is other.scope and block.key == other.key


def _block_key(scope: BlockScope, offer: Offer) -> str:
    if scope is BlockScope.OFFER:
        return offer.id
    if scope is BlockScope.REGION:
        return f"{offer.provider}/{offer.region}"
    return offer.provider


async def _settled(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError, JobFailed):
        await task
