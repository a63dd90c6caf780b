"""ProvisionJob: plan -> try offers (saga) -> ready -> release. Deterministic code only.

Read top to bottom, `run` is DESIGN.md's lifecycle:
1. plan on every enabled provider in parallel, filter and rank the offers (cheapest first);
2. try offers in order: prepare -> create one instance per node -> wait running. A failure
   unwinds the attempt's compensation stack (LIFO), blocks per `workflows/policy.py`, and moves
   to the next offer; InvalidRequest and Credentials abort;
3. ready: wait for `release` (signal) or cancellation;
4. release: terminate and confirm gone (or keep), then completed.
`provisioning_timeout_seconds` bounds steps 1-2; cancellation at any moment still unwinds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.cloud import CloudActivities, CreateInput, PlanInput, PrepareInput, VmInput
    from activities.errors import StepFailure, unwrap
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
    )
    from providers.base import Capabilities, InstanceSpec, Location, Offer
    from workflows import policy
    from workflows.compensation import (
        Compensation,
        CompensationStack,
        unwind_surviving_cancellation,
    )
    from workflows.selection import blocking, rank_offers

SHORT_STEP = timedelta(seconds=30)
CLOUD_STEP = timedelta(minutes=5)
WAIT_MARGIN = timedelta(minutes=2)
MIN_HEARTBEAT = 5.0


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

    @workflow.query
    def status(self) -> JobStatus:
        return self._status

    @workflow.signal
    def release(self) -> None:
        self._release_requested = True

    @workflow.run
    async def run(self, spec: JobSpec) -> JobStatus:
        if spec.resources.gpu:
            workflow.upsert_search_attributes([search_attributes.GPU.value_set(spec.resources.gpu)])
        try:
            await self._provision_within_timeout()
            self._set_state(JobState.READY, "release: signal `release` or cancel the workflow")
            await workflow.wait_condition(lambda: self._release_requested)
            await self._release()
            self._set_state(JobState.COMPLETED)
            return self._status
        except asyncio.CancelledError:
            self._set_state(JobState.RELEASING, "teardown after cancellation")
            await self._unwind(teardown=True)
            self._set_state(JobState.CANCELLED)
            raise
        except JobFailed as failure:
            await self._unwind(teardown=True)  # nothing is left by now; kept as a guarantee
            self._status.error = str(failure)
            self._set_state(JobState.FAILED)
            raise ApplicationError(str(failure), type="JobFailed", non_retryable=True) from None

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
        self._set_state(JobState.PROVISIONING, "offers from the enabled providers")
        if not self._spec.placement.provisioning:
            raise JobFailed("placement.provisioning is false and no existing worker is eligible")
        offers = await self._plan()
        for offer in offers:
            block = blocking(self._status.blocks, offer)
            if block is not None:
                continue
            if await self._try_offer(offer):
                return
        raise JobFailed(self._spent_message(offers))

    async def _plan(self) -> list[Offer]:
        self._capabilities = await workflow.execute_activity_method(
            CloudActivities.describe_providers,
            start_to_close_timeout=SHORT_STEP,
            retry_policy=policy.FORWARD_RETRY,
        )
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
            result = await self._step(
                "plan",
                CloudActivities.plan,
                request,
                start_to_close_timeout=CLOUD_STEP,
                summary=f"plan on {request.provider}",
            )
        except StepFailure as failure:
            action = policy.action_for(failure.kind)
            if action.abort:
                raise JobFailed(f"{request.provider}: {failure}") from None
            self._add_block(BlockScope.PROVIDER, request.provider, failure)
            return []
        self._status.rejected_offers += result.rejected
        return result.offers

    async def _try_offer(self, offer: Offer) -> bool:
        """One saga attempt on `offer`. True when every node runs; False to fail over."""
        attempt = Attempt(number=len(self._status.attempts) + 1, offer=offer)
        self._status.attempts.append(attempt)
        self._stack = CompensationStack()
        workflow.upsert_search_attributes(
            [
                search_attributes.PROVIDER.value_set(offer.provider),
                search_attributes.REGION.value_set(offer.region),
            ]
        )
        try:
            await self._bring_up(attempt)
        except StepFailure as failure:
            attempt.outcome = AttemptOutcome.FAILED
            attempt.step, attempt.kind, attempt.message = (
                failure.step,
                failure.kind,
                failure.message,
            )
            action = policy.action_for(failure.kind)
            self._set_state(JobState.PROVISIONING, f"teardown of attempt #{attempt.number}")
            await self._unwind(teardown=action.teardown)
            scope = BlockScope(failure.block_scope) if failure.block_scope else action.block
            if scope is not None:
                self._add_block(scope, _block_key(scope, offer), failure)
            if action.abort:
                raise JobFailed(f"aborted: {attempt.describe()}") from None
            return False
        except asyncio.CancelledError:
            # Workflow cancelled or provisioning timed out: undo this attempt, then propagate.
            attempt.outcome = AttemptOutcome.ABANDONED
            self._waiting(f"teardown of attempt #{attempt.number} after cancellation")
            await self._unwind(teardown=True)
            raise
        attempt.outcome = AttemptOutcome.SUCCEEDED
        price = offer.price
        if price is not None:
            self._status.hourly_cost = price.model_copy(
                update={"amount": price.amount * self._spec.nodes}
            )
        return True

    async def _bring_up(self, attempt: Attempt) -> None:
        offer = attempt.offer
        nodes = [
            NodeInstance(
                attempt=attempt.number,
                node_index=index,
                vm=f"{self._spec.name}-a{attempt.number}-n{index}",
                provider=offer.provider,
                region=offer.region,
                zone=offer.zone,
            )
            for index in range(self._spec.nodes)
        ]
        self._status.nodes += nodes
        specs = [
            InstanceSpec(
                vm=node.vm,
                job=self._spec.name,
                node_index=node.node_index,
                attempt=attempt.number,
                labels={"gpuprov-job": self._spec.name},
            )
            for node in nodes
        ]
        self._waiting(f"prepare on {offer.id} for {len(nodes)} node(s)")
        prepared = await _all(self._prepare(offer, spec) for spec in specs)
        self._waiting(f"create {len(nodes)} instance(s) of {offer.instance_type} on {offer.id}")
        await _all(
            self._create(offer, spec, node, data)
            for spec, node, data in zip(specs, nodes, prepared, strict=True)
        )
        hints = self._capabilities[offer.provider]
        self._waiting(
            f"running: {len(nodes)} instance(s) booting on {offer.id} "
            f"(boot_timeout {hints.boot_timeout:g}s)"
        )
        await _all(self._wait_running(offer, node) for node in nodes)

    async def _prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        location = offer.location
        self._stack.push(
            Compensation(
                name=f"cleanup {spec.vm}",
                run=lambda: self._in_rounds(
                    lambda: self._step(
                        "cleanup",
                        CloudActivities.cleanup,
                        VmInput(location=location, vm=spec.vm),
                        start_to_close_timeout=CLOUD_STEP,
                        retry_policy=policy.TEARDOWN_RETRY,
                        summary=f"cleanup {spec.vm}",
                    )
                ),
            )
        )
        return await self._step(
            "prepare",
            CloudActivities.prepare,
            PrepareInput(offer=offer, spec=spec),
            start_to_close_timeout=CLOUD_STEP,
            summary=f"prepare {spec.vm}",
        )

    async def _create(
        self, offer: Offer, spec: InstanceSpec, node: NodeInstance, prepared: dict[str, Any]
    ) -> None:
        self._stack.push(
            Compensation(
                name=f"terminate {node.vm}",
                run=lambda: self._terminate(node),
                terminates=True,
                has_instances=lambda: bool(node.instance_ids),
            )
        )
        node.instance_ids = await self._step(
            "create",
            CloudActivities.create,
            CreateInput(offer=offer, prepared=prepared, spec=spec),
            start_to_close_timeout=CLOUD_STEP,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"create {spec.vm} on {offer.id}",
        )

    async def _wait_running(self, offer: Offer, node: NodeInstance) -> None:
        hints = self._capabilities[offer.provider]
        observed = await self._step(
            "wait_running",
            CloudActivities.wait_running,
            VmInput(location=offer.location, vm=node.vm, ids=node.instance_ids),
            start_to_close_timeout=timedelta(seconds=hints.boot_timeout) + WAIT_MARGIN,
            heartbeat_timeout=_heartbeat_timeout(hints),
            summary=f"wait for {node.vm} to run",
        )
        node.record_observed(observed)
        node.status = "running"

    # ------------------------------------------------------------------ teardown

    async def _terminate(self, node: NodeInstance) -> None:
        location = node.location
        hints = self._capabilities[node.provider]
        try:
            await self._in_rounds(lambda: self._delete_and_confirm(node, location, hints))
        except StepFailure:
            node.status = "leaked"
            raise
        node.status = "terminated"

    async def _in_rounds(self, step: Callable[[], Awaitable[Any]]) -> None:
        """Run a teardown step; repeat it per policy when it fails for good."""
        rounds = 0
        while True:
            rounds += 1
            try:
                await step()
                return
            except StepFailure as failure:
                if not policy.retry_teardown(failure.kind, rounds):
                    raise
            await workflow.sleep(policy.TEARDOWN_PAUSE * rounds)

    async def _delete_and_confirm(
        self, node: NodeInstance, location: Location, hints: Capabilities
    ) -> None:
        node.instance_ids = await self._step(
            "delete",
            CloudActivities.delete,
            VmInput(location=location, vm=node.vm, ids=node.instance_ids),
            start_to_close_timeout=CLOUD_STEP,
            retry_policy=policy.TEARDOWN_RETRY,
            summary=f"delete {node.vm}",
        )
        await self._step(
            "wait_gone",
            CloudActivities.wait_gone,
            VmInput(location=location, vm=node.vm, ids=node.instance_ids),
            start_to_close_timeout=timedelta(seconds=hints.delete_timeout) + WAIT_MARGIN,
            heartbeat_timeout=_heartbeat_timeout(hints),
            retry_policy=policy.TEARDOWN_RETRY,
            summary=f"wait for {node.vm} to be gone",
        )

    async def _unwind(self, *, teardown: bool) -> None:
        await unwind_surviving_cancellation(
            self._stack, teardown=teardown, on_failure=self._record_leak
        )

    def _record_leak(self, compensation: Compensation, failure: StepFailure) -> None:
        self._status.leaks.append(f"{compensation.name}: {failure}")

    async def _release(self) -> None:
        self._set_state(JobState.RELEASING, "terminating instances")
        if self._spec.release is ReleasePolicy.KEEP:
            for node in self._status.live_nodes():
                node.status = "kept"
            self._stack.discard()
            return
        await self._unwind(teardown=True)

    # ------------------------------------------------------------------ helpers

    async def _step(self, step: str, activity: Any, arg: Any, **options: Any) -> Any:
        options.setdefault("retry_policy", policy.FORWARD_RETRY)
        try:
            return await workflow.execute_activity_method(activity, arg, **options)
        except ActivityError as error:
            raise unwrap(step, error) from None

    def _add_block(self, scope: BlockScope, key: str, failure: StepFailure) -> None:
        if any(b.scope is scope and b.key == key for b in self._status.blocks):
            return
        self._status.blocks.append(
            Block(scope=scope, key=key, kind=failure.kind, message=failure.message)
        )

    def _set_state(self, state: JobState, waiting_for: str | None = None) -> None:
        if state is not self._status.state:  # each upsert is a history event
            workflow.upsert_search_attributes([search_attributes.STATE.value_set(state.value)])
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


def _block_key(scope: BlockScope, offer: Offer) -> str:
    if scope is BlockScope.OFFER:
        return offer.id
    if scope is BlockScope.REGION:
        return f"{offer.provider}/{offer.region}"
    return offer.provider


def _heartbeat_timeout(hints: Capabilities) -> timedelta:
    return timedelta(seconds=max(MIN_HEARTBEAT, 4 * hints.poll_interval))


async def _all(steps: Any) -> list[Any]:
    """Run steps concurrently; let all finish, then raise the first failure in node order."""
    results = await asyncio.gather(*steps, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


async def _settled(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError, JobFailed):
        await task
