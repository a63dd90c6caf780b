"""One attempt: bring up every node of the job on one offer, as a saga.

prepare (all nodes) -> create (all nodes) -> wait running (all nodes) -> [start the node agent
over SSH, where the provider's nodes are bootstrapped that way] -> wait for each node's
registration and check its reported capabilities. Each undo is pushed on the compensation stack
*before* the step it undoes starts, because a create can land even when its response is lost.
Any failure propagates as StepFailure; the job decides (by policy) what to do with it.
On the 2026-12-01 code (`versions.lean()`) a node's one undo (`teardown.retire`) is pushed
before its prepare, and a single-node job runs prepare + create as one `launch` activity (a
multi-node job keeps the barrier: every node prepared before any machine is created).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.bootstrap import AGENT_TIMEOUT, BootstrapActivities, BootstrapInput
    from activities.cloud import CloudActivities, CreateInput, PrepareInput, VmInput
    from activities.errors import StepFailure
    from gpuprov.models import Attempt, JobSpec, NodeInstance
    from providers.base import Capabilities, InstanceSpec, compatibility_reasons
    from providers.errors import ErrorKind
    from workflows import teardown, versions
    from workflows.compensation import Compensation, CompensationStack
    from workflows.steps import (
        CLOUD_STEP,
        CREATE_HEARTBEAT,
        heartbeat_timeout,
        run_all,
        run_step,
        wait_timeout,
    )


def vm_run_tag(run_id: str) -> str:
    """Six hex digits from the random end of the job's first run id (UUIDv7 starts with a
    timestamp). A job name can be submitted again once its job ended; the tag keeps each run's
    VM identities, rows and cloud labels apart, so nothing of an earlier run is ever adopted.
    It stays the same across resets and continue-as-new."""
    return run_id.replace("-", "")[-6:]


class AttemptSaga:
    def __init__(
        self,
        spec: JobSpec,
        attempt: Attempt,
        hints: Capabilities,
        stack: CompensationStack,
        waiting: Callable[[str], None],
    ) -> None:
        self.spec = spec
        self.attempt = attempt
        self.offer = attempt.offer
        self.hints = hints
        self.stack = stack
        self._waiting = waiting
        run_tag = vm_run_tag(workflow.info().first_execution_run_id)
        self.nodes = [
            NodeInstance(
                attempt=attempt.number,
                node_index=index,
                vm=f"{spec.name}-a{attempt.number}-n{index}-{run_tag}",
                provider=self.offer.provider,
                region=self.offer.region,
                zone=self.offer.zone,
            )
            for index in range(spec.nodes)
        ]

    async def bring_up(self) -> None:
        offer, count = self.offer, len(self.nodes)
        specs = [self._instance_spec(node) for node in self.nodes]
        if versions.lean() and count == 1:
            # One node: prepare + create as one activity. Several nodes keep the barrier: every
            # node is prepared (has its place) before any machine is created and paid for.
            self._waiting(f"create {count} instance(s) of {offer.instance_type} on {offer.id}")
            await run_all(self._launch(spec, node) for spec, node in self._pairs(specs))
        else:
            self._waiting(f"prepare on {offer.id} for {count} node(s)")
            prepared = await run_all(self._prepare(spec, node) for spec, node in self._pairs(specs))
            self._waiting(f"create {count} instance(s) of {offer.instance_type} on {offer.id}")
            await run_all(
                self._create(spec, node, data)
                for (spec, node), data in zip(self._pairs(specs), prepared, strict=True)
            )
        self._waiting(
            f"running: {count} instance(s) booting on {offer.id} "
            f"(boot_timeout {self.hints.boot_timeout:g}s)"
        )
        await run_all(self._wait_running(node) for node in self.nodes)
        if self.hints.ssh_bootstrap and versions.current():
            self._waiting(f"bootstrap: starting the node agent over SSH on {count} node(s)")
            await run_all(self._bootstrap(node) for node in self.nodes)
        if self.hints.node_agent:
            await self._await_registrations()

    def _pairs(self, specs: list[InstanceSpec]) -> list[tuple[InstanceSpec, NodeInstance]]:
        return list(zip(specs, self.nodes, strict=True))

    def _instance_spec(self, node: NodeInstance) -> InstanceSpec:
        return InstanceSpec(
            vm=node.vm,
            job=self.spec.name,
            node_index=node.node_index,
            attempt=self.attempt.number,
            labels={"gpuprov-job": self.spec.name},
        )

    def _push_retire(self, node: NodeInstance) -> None:
        """The node's one undo (lean): retire deletes whatever carries the identity (nothing,
        if create never ran) and cleans up the side resources. Never skipped: those need it
        even when no instance was created."""
        self.stack.push(
            Compensation(name=f"tear down {node.vm}", run=lambda: teardown.retire(node, self.hints))
        )

    async def _launch(self, spec: InstanceSpec, node: NodeInstance) -> None:
        """prepare + create as one activity, its undo pushed first."""
        self._push_retire(node)
        node.instance_ids = await run_step(
            "launch",
            CloudActivities.launch,
            PrepareInput(offer=self.offer, spec=spec),
            start_to_close_timeout=2 * CLOUD_STEP,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            heartbeat_timeout=CREATE_HEARTBEAT,
            summary=f"create {spec.vm} on {self.offer.id}",
        )

    async def _prepare(self, spec: InstanceSpec, node: NodeInstance) -> dict[str, Any]:
        if versions.lean():
            self._push_retire(node)  # the node's one undo, covering its create too
        else:
            self.stack.push(
                Compensation(name=f"cleanup {node.vm}", run=lambda: teardown.cleanup(node))
            )
        return await run_step(
            "prepare",
            CloudActivities.prepare,
            PrepareInput(offer=self.offer, spec=spec),
            summary=f"prepare {spec.vm}",
        )

    async def _create(
        self, spec: InstanceSpec, node: NodeInstance, prepared: dict[str, Any]
    ) -> None:
        if not versions.lean():  # lean: the retire pushed before prepare terminates too
            self.stack.push(
                Compensation(
                    name=f"terminate {node.vm}",
                    run=lambda: teardown.terminate(node, self.hints),
                    terminates=True,
                    has_instances=lambda: bool(node.instance_ids),
                )
            )
        node.instance_ids = await run_step(
            "create",
            CloudActivities.create,
            CreateInput(offer=self.offer, prepared=prepared, spec=spec),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            heartbeat_timeout=CREATE_HEARTBEAT,
            summary=f"create {spec.vm} on {self.offer.id}",
        )

    async def _wait_running(self, node: NodeInstance) -> None:
        observed = await run_step(
            "wait_running",
            CloudActivities.wait_running,
            VmInput(location=node.location, vm=node.vm, ids=node.instance_ids),
            start_to_close_timeout=wait_timeout(self.hints.boot_timeout),
            heartbeat_timeout=heartbeat_timeout(self.hints),
            summary=f"wait for {node.vm} to run",
        )
        node.record_observed(observed)
        node.status = "running"

    async def _bootstrap(self, node: NodeInstance) -> None:
        """Upload and start the node agent over SSH (host key verified); the join token is
        minted inside the activity and travels only over the SSH channel."""
        if node.ssh is None:
            raise StepFailure(
                "bootstrap", ErrorKind.FAILED, f"{node.vm} runs but reports no SSH endpoint"
            )
        await run_step(
            "bootstrap",
            BootstrapActivities.bootstrap,
            BootstrapInput(
                provider=node.provider,
                vm=node.vm,
                ssh=node.ssh,
                boot_timeout=self.hints.boot_timeout,
                poll_interval=min(self.hints.poll_interval, 5.0),
            ),
            start_to_close_timeout=wait_timeout(self.hints.boot_timeout + AGENT_TIMEOUT),
            heartbeat_timeout=heartbeat_timeout(self.hints),
            summary=f"bootstrap {node.vm}",
        )

    async def _await_registrations(self) -> None:
        """Placement waits for each node's own report (a running machine may still lack a
        working GPU runtime); a missing or incompatible report is Failed for this offer."""
        self._waiting(f"registration of {len(self.nodes)} node(s) with the control plane")
        try:
            await workflow.wait_condition(
                lambda: all(node.worker_id for node in self.nodes),
                timeout=self.hints.boot_timeout,
            )
        except TimeoutError:
            missing = ", ".join(node.vm for node in self.nodes if not node.worker_id)
            raise StepFailure(
                "register",
                ErrorKind.FAILED,
                f"{missing} did not register within {self.hints.boot_timeout:g}s",
            ) from None
        request = self.spec.resource_request()
        for node in self.nodes:
            assert node.capabilities is not None
            shape = node.capabilities.shape(node.provider, node.region)
            reasons = compatibility_reasons(shape, request)
            if reasons:
                raise StepFailure(
                    "register",
                    ErrorKind.FAILED,
                    f"{node.vm} reported incompatible capabilities: {'; '.join(reasons)}",
                )
