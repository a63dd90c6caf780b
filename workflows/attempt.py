"""One attempt: bring up every node of the job on one offer, as a saga.

[prepare -> create, or both as one `launch` for a single node] -> wait running -> [start the node
agent over SSH, where the provider's nodes are bootstrapped that way] -> wait until each node's
agent has registered (activities/registrations.py) and check its reported capabilities. Each
node's one undo (`teardown.retire`) is pushed *before* its first step, because a create can land
even when its response is lost. A job of several nodes keeps a barrier: every node is prepared
(has its place) before any machine is created and paid for. Any failure propagates as
StepFailure; the job decides (gpuprov/policy.py) what to do with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.bootstrap import BootstrapActivities, BootstrapInput
    from activities.cloud import CloudActivities, CreateInput, PrepareInput, VmInput
    from activities.errors import StepFailure
    from activities.registrations import AwaitInput, RegistrationActivities
    from gpuprov.contract import vm_run_tag
    from gpuprov.models import Attempt, JobSpec, NodeInstance
    from providers.base import Capabilities, InstanceSpec, compatibility_reasons
    from providers.errors import ErrorKind
    from workflows import teardown
    from workflows.compensation import Compensation, CompensationStack
    from workflows.steps import run_all, run_step


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
        if count == 1:
            self._waiting(f"create 1 instance of {offer.instance_type} on {offer.id}")
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
        if self.hints.ssh_bootstrap:
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
            image=self.spec.image,
            ports=self.spec.ports,
            labels={"gpuprov-job": self.spec.name},
        )

    def _push_retire(self, node: NodeInstance) -> None:
        """The node's one undo: retire deletes whatever carries the identity (nothing, if
        create never ran) and cleans up the side resources that prepare made."""
        self.stack.push(
            Compensation(
                name=f"tear down {node.vm}",
                run=lambda: teardown.retire(node, self.hints),
                group=f"attempt {self.attempt.number}",
            )
        )

    async def _launch(self, spec: InstanceSpec, node: NodeInstance) -> None:
        """prepare + create as one activity, its undo pushed first."""
        self._push_retire(node)
        node.instance_ids = await run_step(
            CloudActivities.launch,
            PrepareInput(offer=self.offer, spec=spec),
            summary=f"create {spec.vm} on {self.offer.id}",
        )

    async def _prepare(self, spec: InstanceSpec, node: NodeInstance) -> dict[str, Any]:
        self._push_retire(node)  # the node's one undo, covering its create too
        return await run_step(
            CloudActivities.prepare,
            PrepareInput(offer=self.offer, spec=spec),
            summary=f"prepare {spec.vm}",
        )

    async def _create(
        self, spec: InstanceSpec, node: NodeInstance, prepared: dict[str, Any]
    ) -> None:
        node.instance_ids = await run_step(
            CloudActivities.create,
            CreateInput(offer=self.offer, prepared=prepared, spec=spec),
            summary=f"create {spec.vm} on {self.offer.id}",
        )

    async def _wait_running(self, node: NodeInstance) -> None:
        observed = await run_step(
            CloudActivities.wait_running,
            VmInput(location=node.location, vm=node.vm, ids=node.instance_ids),
            hints=self.hints,
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
            BootstrapActivities.bootstrap,
            BootstrapInput(
                provider=node.provider,
                vm=node.vm,
                ssh=node.ssh,
                boot_timeout=self.hints.boot_timeout,
                poll_interval=min(self.hints.poll_interval, 5.0),
            ),
            hints=self.hints,
            summary=f"bootstrap {node.vm}",
        )

    async def _await_registrations(self) -> None:
        """Placement waits for each node's own report (a running machine may still lack a
        working GPU runtime); a missing or incompatible report is Failed for this offer. The
        reports come from the database rows the API wrote when each node presented its join
        token, never from anything sent to the workflow."""
        self._waiting(f"registration of {len(self.nodes)} node(s) with the control plane")
        registrations = await run_step(
            RegistrationActivities.await_registrations,
            AwaitInput(
                vms=[node.vm for node in self.nodes], timeout_seconds=self.hints.boot_timeout
            ),
            hints=self.hints,
            summary=f"registration of {len(self.nodes)} node(s)",
        )
        request = self.spec.resource_request()
        for node, registration in zip(self.nodes, registrations, strict=True):
            node.worker_id = registration.worker_id
            node.capabilities = registration.capabilities
            shape = registration.capabilities.shape(node.provider, node.region)
            reasons = compatibility_reasons(shape, request)
            if reasons:
                raise StepFailure(
                    "register",
                    ErrorKind.FAILED,
                    f"{node.vm} reported incompatible capabilities: {'; '.join(reasons)}",
                )
