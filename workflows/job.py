"""ProvisionJob: reserve or plan -> try offers (saga) -> ready -> release. Deterministic only.

Read top to bottom, `run` is DESIGN.md's lifecycle:
1. reserve idle, compatible existing workers for every node; if that works, skip to ready;
2. plan on every enabled provider in parallel, skip offers under a shared block, rank the rest
   cheapest first (no price + cost cap = rejected);
3. try offers in order (workflows/attempt.py): record an estimate, prepare -> create ->
   wait running -> wait for each node to register with compatible capabilities. A failure
   unwinds the attempt's compensation stack (LIFO), blocks per `workflows/policy.py` (shared
   with every job until the block expires) and moves on; InvalidRequest and Credentials abort;
4. ready: wait for `release` (signal) or cancellation;
5. release: terminate and confirm gone (or keep); workers revoked, existing ones freed.
`provisioning_timeout_seconds` bounds steps 2-3; cancellation at any moment still unwinds.
State changes, attempts, failovers and time to ready are counted in workflows/metrics.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import workflows.health as health
    import workflows.metrics as metrics
    import workflows.policy as policy
    import workflows.versions as versions
    from activities.cloud import CloudActivities, PlanInput
    from activities.errors import NO_BLOCK, StepFailure
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
        JobState,
        JobStatus,
        NodeInstance,
        ReleasePolicy,
        WorkerRegistration,
    )
    from providers.base import Capabilities, Offer, Severity, Verdict
    from workflows.attempt import AttemptSaga
    from workflows.compensation import (
        Compensation,
        CompensationStack,
        unwind_surviving_cancellation,
    )
    from workflows.selection import blocking, rank_offers
    from workflows.steps import SHORT_STEP, run_step


K3S_STEP = timedelta(minutes=30)  # the installers on every node, with their downloads
K3S_HEARTBEAT = timedelta(seconds=60)


class JobFailed(Exception):
    """Internal: the job cannot succeed; `run` turns it into the workflow's failure."""


@workflow.defn(name="ProvisionJob")
class ProvisionJob:
    @workflow.init
    def __init__(self, spec: JobSpec) -> None:
        self._spec = spec
        self._status = JobStatus(name=spec.name)
        self._release_requested = False
        self._capabilities: dict[str, Capabilities] = {}
        self._stack = CompensationStack()
        # Capabilities and shared blocks read by job_context, for the first plan only.
        self._prefetched: tuple[dict[str, Capabilities], list[Block]] | None = None

    @workflow.query
    def status(self) -> JobStatus:
        return self._status

    @workflow.signal
    def release(self) -> None:
        self._release_requested = True

    @workflow.update(name="register_worker")
    def register_worker(self, registration: WorkerRegistration) -> None:
        node = next(n for n in self._status.nodes if n.vm == registration.vm)
        node.worker_id = registration.worker_id
        node.capabilities = registration.capabilities

    @register_worker.validator
    def _accepts_registration(self, registration: WorkerRegistration) -> None:
        """Only a node of the attempt in progress, while the job provisions (rejected updates
        leave no history). A node registering again replaces its earlier worker id: the API
        takes back a claim whose answer it could not confirm, so the node's retry is the
        registration of record (single-use tokens mean only that node can retry)."""
        current = len(self._status.attempts)
        node = next((n for n in self._status.nodes if n.vm == registration.vm), None)
        if node is None or node.attempt != current or node.status not in ("requested", "running"):
            raise ValueError(f"{registration.vm} is not a node this job is waiting for")
        if self._status.state is not JobState.PROVISIONING:
            raise ValueError(f"job is {self._status.state.value}, not provisioning")

    @workflow.run
    async def run(self, spec: JobSpec) -> JobStatus:
        versions.adopt()
        if versions.lean():
            self._complete_start_attributes()
        elif spec.resources.gpu:
            workflow.upsert_search_attributes([search_attributes.GPU.value_set(spec.resources.gpu)])
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
            await self._unwind(teardown=True)
            await self._free_workers()
            self._set_state(JobState.CANCELLED)
            raise
        except (JobFailed, StepFailure) as failure:
            # StepFailure here is a bookkeeping step (database) that failed for good outside
            # any attempt: the job fails and releases what it holds, it never hangs.
            metrics.provisioning_seconds("failed")
            await self._unwind(teardown=True)  # nothing is left by now; kept as a guarantee
            await self._free_workers()
            self._status.error = str(failure)
            self._set_state(JobState.FAILED)
            raise ApplicationError(str(failure), type="JobFailed", non_retryable=True) from None

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

    # ------------------------------------------------------------------ existing workers

    async def _reserve_existing_workers(self) -> bool:
        """Idle, compatible existing workers for every node, or none at all."""
        if versions.lean():
            return await self._read_job_context()
        if self._spec.profile == "k3s":
            # The k3s profile installs over SSH on machines the job provisions; an existing
            # worker offers no SSH endpoint to the control plane.
            self._set_state(JobState.PROVISIONING, "offers (the k3s profile provisions)")
            return False
        self._set_state(JobState.PROVISIONING, "an idle, compatible existing worker")
        reserved = await run_step(
            "reserve",
            StoreActivities.reserve_existing_workers,
            ReserveInput(
                job=self._spec.name,
                request=self._spec.resource_request(),
                nodes=self._spec.nodes,
            ),
            start_to_close_timeout=SHORT_STEP,
        )
        self._status.existing_workers = reserved  # freed by _free_workers at any ending
        return bool(reserved)

    async def _read_job_context(self) -> bool:
        """One local activity (activities/job_context.py): the providers' capabilities and the
        shared blocks for the first plan, then existing workers reserved for every node (none
        for the k3s profile, which installs over SSH on machines the job provisions). The job
        stays queued until it tries an offer (DESIGN: lifecycle step 4)."""
        k3s = self._spec.profile == "k3s"
        reserve = None
        if not k3s:
            reserve = ReserveInput(
                job=self._spec.name, request=self._spec.resource_request(), nodes=self._spec.nodes
            )
        self._waiting(
            "offers (the k3s profile provisions)" if k3s else "an idle, compatible existing worker"
        )
        context = await run_step(
            "job_context",
            JobContextActivities.job_context,
            ContextInput(reserve=reserve),
            start_to_close_timeout=SHORT_STEP,
        )
        self._status.existing_workers = context.reserved  # freed by _free_workers at any ending
        self._prefetched = (context.capabilities, context.blocks)
        return bool(context.reserved)

    async def _free_workers(self) -> None:
        """Existing workers back to idle, managed workers revoked (idempotent). Runs on every
        ending, so it records a failure instead of raising one."""
        try:
            await run_step(
                "release_workers",
                StoreActivities.release_job_workers,
                ReleaseInput(job=self._spec.name),
                start_to_close_timeout=SHORT_STEP,
                retry_policy=policy.TEARDOWN_RETRY,
            )
        except StepFailure as failure:
            self._status.leaks.append(f"workers of {self._spec.name} not freed: {failure}")

    async def _mark_placed(self) -> None:
        """The job runs now: its workers are busy, its machines' rows say running."""
        placed = self._status.live_nodes()
        await run_step(
            "mark_placed",
            StoreActivities.mark_placed,
            PlacedInput(
                job=self._spec.name,
                vms=[node.vm for node in placed],
                worker_ids=[
                    *(node.worker_id for node in placed if node.worker_id),
                    *(worker.worker_id for worker in self._status.existing_workers),
                ],
            ),
            start_to_close_timeout=SHORT_STEP,
            retry_policy=policy.STORE_RETRY,
        )

    # ------------------------------------------------------------------ profile

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
            "setup_k3s",
            K3sActivities.setup_k3s,
            K3sInput(
                nodes=[
                    K3sNode(vm=node.vm, provider=node.provider, ssh=node.ssh)
                    for node in nodes
                    if node.ssh is not None
                ]
            ),
            start_to_close_timeout=K3S_STEP,
            heartbeat_timeout=K3S_HEARTBEAT,
            summary=f"k3s on {len(nodes)} node(s)",
        )
        self._status.kubeconfig = cluster.kubeconfig

    # ------------------------------------------------------------------ ready

    async def _serve_until_released(self) -> None:
        """Wait for `release`; meanwhile check each machine's health on the job's interval and
        show it in the status and the current details."""
        interval = self._spec.health_check_interval_seconds
        machines = [node for node in self._status.live_nodes() if node.status == "running"]
        if not interval or not machines or not versions.current():
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

    # ------------------------------------------------------------------ provisioning

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
            if wait is None or not versions.current():
                raise JobFailed(self._spent_message(offers))
            # Other jobs' recent failures block every offer left: wait for the first of those
            # blocks to lapse and plan again (within the provisioning timeout), rather than fail
            # a job that never tried (chaos finding 7).
            self._waiting(f"offers blocked by other jobs' failures; next block lapses in {wait:g}s")
            await workflow.sleep(wait)

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

    async def _plan(self) -> list[Offer]:
        if self._prefetched is not None:  # the job's first plan reads what job_context read
            (self._capabilities, shared_blocks), self._prefetched = self._prefetched, None
        else:
            self._capabilities, shared_blocks = await asyncio.gather(
                run_step(
                    "describe",
                    CloudActivities.describe_providers,
                    start_to_close_timeout=SHORT_STEP,
                ),
                run_step(
                    "blocks", StoreActivities.active_blocks, start_to_close_timeout=SHORT_STEP
                ),
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
                "plan", CloudActivities.plan, request, summary=f"plan on {request.provider}"
            )
        except StepFailure as failure:
            action = policy.action_for(failure.kind)
            if action.abort:
                raise JobFailed(f"aborted: plan on {request.provider}: {failure}") from None
            if failure.block_scope != NO_BLOCK or not versions.current():
                await self._add_block(policy.PLAN_FAILURE_SCOPE, request.provider, failure)
            return []
        self._status.rejected_offers += result.rejected
        return result.offers

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
        if versions.lean() and self._status.state is not JobState.PROVISIONING:
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
            await self._unwind(teardown=True)
            raise
        attempt.outcome = AttemptOutcome.SUCCEEDED
        return True

    async def _fail_attempt(self, attempt: Attempt, failure: StepFailure) -> None:
        attempt.outcome = AttemptOutcome.FAILED
        attempt.step, attempt.kind, attempt.message = failure.step, failure.kind, failure.message
        metrics.failover(failure.kind, attempt.offer)
        action = policy.action_for(failure.kind)
        self._waiting(f"teardown of attempt #{attempt.number}")
        teardown = action.teardown
        if not teardown and versions.current():
            # `failure` is one node's (the first in node order); another node's create may
            # have landed with its answer lost. Terminating observes by identity first, so a
            # node where nothing landed costs one observe (chaos finding 2).
            teardown = True
        await self._unwind(teardown=teardown)
        for node in self._status.nodes:
            if node.attempt == attempt.number and node.status == "requested":
                node.status = "not_created"  # teardown skipped: no create reported an id
        scope = action.block
        if failure.block_scope == NO_BLOCK:
            scope = action.block if not versions.current() else None
        elif failure.block_scope:
            scope = BlockScope(failure.block_scope)
        if scope is not None:
            await self._add_block(scope, _block_key(scope, attempt.offer), failure)
        if action.abort:
            raise JobFailed(f"aborted by {failure.kind.value}:{self._attempt_lines()}")

    async def _record_estimate(self, offer: Offer) -> None:
        """The estimate for the whole job on this offer (None-priced offers record nothing)."""
        if offer.price is None:
            self._status.hourly_cost = None
            return
        quote = offer.price.model_copy(update={"amount": offer.price.amount * self._spec.nodes})
        self._status.hourly_cost = quote
        metrics.estimated_spend(offer.provider, quote)
        await run_step(
            "record_cost",
            StoreActivities.record_cost,
            CostInput(job=self._spec.name, quote=quote),
            start_to_close_timeout=SHORT_STEP,
        )

    # ------------------------------------------------------------------ release and teardown

    async def _release(self) -> None:
        self._set_state(JobState.RELEASING, "terminating instances")
        if self._spec.release is ReleasePolicy.KEEP:
            self._stack.discard()  # first: nothing after this may tear the machines down
            for node in self._status.live_nodes():
                node.status = "kept"
                try:
                    await run_step(
                        "mark_vm",
                        StoreActivities.mark_vm,
                        VmStatusInput(vm=node.vm, status="kept"),
                        start_to_close_timeout=SHORT_STEP,
                        retry_policy=policy.STORE_RETRY,
                    )
                except StepFailure as failure:
                    self._status.leaks.append(f"{node.vm} kept but not recorded: {failure}")
            await self._free_workers()
            return
        await self._unwind(teardown=True)
        await self._free_workers()

    async def _unwind(self, *, teardown: bool) -> None:
        await unwind_surviving_cancellation(
            self._stack, teardown=teardown, on_failure=self._record_leak
        )

    def _record_leak(self, compensation: Compensation, failure: StepFailure) -> None:
        self._status.leaks.append(f"{compensation.name}: {failure}")

    async def _add_block(self, scope: BlockScope, key: str, failure: StepFailure) -> None:
        if any(b.scope is scope and b.key == key for b in self._status.blocks):
            return
        block = Block(scope=scope, key=key, kind=failure.kind, message=failure.message)
        self._status.blocks.append(block)
        await run_step(
            "record_block",
            StoreActivities.record_block,
            BlockInput(job=self._spec.name, block=block),
            start_to_close_timeout=SHORT_STEP,
        )

    # ------------------------------------------------------------------ status

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
        lines = [f"**{self._status.state.value}**"]
        if self._status.waiting_for:
            lines.append(f"waiting for: {self._status.waiting_for}")
        lines += [f"- attempt {a.describe()}" for a in self._status.attempts]
        lines += [f"- blocked {b.scope.value} {b.key}: {b.kind.value}" for b in self._status.blocks]
        lines += [
            f"- node {report.vm}: **{report.verdict.value}**: "
            + "; ".join(f.message for f in report.findings if f.severity is not Severity.INFO)
            for report in self._status.health
            if report.verdict is not Verdict.HEALTHY
        ]
        workflow.set_current_details("\n".join(lines))

    def _attempt_lines(self) -> str:
        return "".join(f"\n  {attempt.describe()}" for attempt in self._status.attempts)

    def _spent_message(self, offers: list[Offer]) -> str:
        if not offers:
            reasons = "".join(f"\n  {r}" for r in self._status.rejected_offers[:20])
            blocks = "".join(
                f"\n  {b.key}: {b.kind.value}: {b.message}" for b in self._status.blocks
            )
            return f"no compatible offer for the job{blocks}{reasons}"
        tried = len(self._status.attempts)
        skipped = [
            f"\n  {offer.id}: skipped, {block.scope.value} blocked by {block.kind.value}"
            for offer in offers
            if (block := blocking(self._status.blocks, offer)) is not None
            and not any(a.offer.id == offer.id for a in self._status.attempts)
        ]
        return f"every offer failed ({tried} tried):{self._attempt_lines()}{''.join(skipped)}"


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
