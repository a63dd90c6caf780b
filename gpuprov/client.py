"""The Python SDK other services use: typed pydantic models in and out, over a Temporal client.

client = await GpuprovClient.connect("localhost:7233")
handle = await client.submit(JobSpec(name="train-7b", nodes=2, resources=...))
status = await handle.wait_ready(timeout=1800)
await handle.release()
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from gpuprov import search_attributes
from gpuprov.models import JobSpec, JobState, JobStatus, workflow_id_for
from providers.base import ResourceRequest
from workflows.offers import OffersQuery, OffersResult, PlanOffers

DEFAULT_TASK_QUEUE = "gpuprov"
_CLOSED_STATES = {
    WorkflowExecutionStatus.COMPLETED: JobState.COMPLETED,
    WorkflowExecutionStatus.FAILED: JobState.FAILED,
    WorkflowExecutionStatus.CANCELED: JobState.CANCELLED,
    WorkflowExecutionStatus.TERMINATED: JobState.FAILED,
    WorkflowExecutionStatus.TIMED_OUT: JobState.FAILED,
}


class GpuprovError(Exception):
    """Something the SDK user should read: a job that does not exist, a failed job, ..."""


class JobNotFound(GpuprovError):
    pass


class JobAlreadyExists(GpuprovError):
    pass


class JobHandle:
    """One job: status, waits and the two ways to end it (release, cancel)."""

    def __init__(self, name: str, handle: WorkflowHandle) -> None:
        self.name = name
        self._handle = handle

    async def status(self) -> JobStatus:
        try:
            return await self._handle.query("status", result_type=JobStatus)
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:
                raise JobNotFound(f"no job named {self.name!r}") from None
            raise GpuprovError(f"cannot read status of job {self.name!r}: {error}") from None
        except WorkflowQueryFailedError as error:
            raise GpuprovError(f"job {self.name!r} could not answer its status: {error}") from None

    async def wait_for(
        self,
        done: Callable[[JobStatus], bool],
        timeout: float,
        on_change: Callable[[JobStatus], None] | None = None,
        poll_interval: float = 0.5,
    ) -> JobStatus:
        """Poll status until `done(status)` or the job reaches a terminal state."""
        deadline = time.monotonic() + timeout
        last: JobStatus | None = None
        while True:
            status = await self.status()
            if on_change is not None and status != last:
                on_change(status)
            last = status
            if done(status) or status.state.terminal:
                return status
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.name!r} still {status.state.value} after {timeout}s")
            await asyncio.sleep(poll_interval)

    async def wait_ready(self, timeout: float = 3600) -> JobStatus:
        status = await self.wait_for(lambda s: s.state is JobState.READY, timeout)
        if status.state is not JobState.READY:
            raise GpuprovError(f"job {self.name!r} ended {status.state.value}: {status.error}")
        return status

    async def release(self) -> None:
        await self._running_only(self._handle.signal("release"))

    async def cancel(self) -> None:
        await self._running_only(self._handle.cancel())

    async def _running_only(self, call: Awaitable[None]) -> None:
        try:
            await call
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:
                raise JobNotFound(f"no running job named {self.name!r}: {error.message}") from None
            raise GpuprovError(f"job {self.name!r}: {error}") from None

    async def result(self) -> JobStatus:
        """Wait for the job to end; the final status whatever the outcome."""
        with contextlib.suppress(WorkflowFailureError):
            await self._handle.result()
        return await self.status()


class GpuprovClient:
    def __init__(self, client: Client, task_queue: str = DEFAULT_TASK_QUEUE) -> None:
        self.temporal = client
        self.task_queue = task_queue

    @classmethod
    async def connect(
        cls,
        address: str = "localhost:7233",
        namespace: str = "default",
        task_queue: str = DEFAULT_TASK_QUEUE,
    ) -> GpuprovClient:
        try:
            client = await Client.connect(
                address, namespace=namespace, data_converter=pydantic_data_converter
            )
        except RuntimeError as error:
            raise GpuprovError(f"cannot reach Temporal at {address}: {error}") from None
        return cls(client, task_queue)

    async def submit(self, spec: JobSpec) -> JobHandle:
        attributes = [SearchAttributePair(search_attributes.STATE, JobState.QUEUED.value)]
        if spec.resources.gpu:
            attributes.append(SearchAttributePair(search_attributes.GPU, spec.resources.gpu))
        try:
            handle = await self.temporal.start_workflow(
                "ProvisionJob",
                spec,
                id=spec.workflow_id,
                task_queue=self.task_queue,
                search_attributes=TypedSearchAttributes(attributes),
                static_summary=f"{spec.nodes}x {spec.resources.gpu or 'any'} for {spec.name}",
            )
        except WorkflowAlreadyStartedError:
            raise JobAlreadyExists(f"a job named {spec.name!r} is already running") from None
        return JobHandle(spec.name, handle)

    def job(self, name: str) -> JobHandle:
        return JobHandle(name, self.temporal.get_workflow_handle(workflow_id_for(name)))

    async def list(
        self, state: JobState | None = None, provider: str | None = None, limit: int = 100
    ) -> list[tuple[str, JobState, str | None]]:
        """(name, state, provider) of recent jobs, newest first, via search attributes."""
        clauses = ["WorkflowType = 'ProvisionJob'"]
        if state is not None:
            clauses.append(f"{search_attributes.STATE.name} = '{state.value}'")
        if provider is not None:
            clauses.append(f"{search_attributes.PROVIDER.name} = '{provider}'")
        jobs = []
        async for execution in self.temporal.list_workflows(" AND ".join(clauses), limit=limit):
            attrs = execution.typed_search_attributes
            recorded = attrs.get(search_attributes.STATE)
            job_state = _CLOSED_STATES.get(execution.status) or JobState(recorded or "queued")
            name = execution.id.removeprefix("job-")
            jobs.append((name, job_state, attrs.get(search_attributes.PROVIDER)))
        return jobs

    async def offers(self, query: OffersQuery) -> OffersResult:
        return await self.temporal.execute_workflow(
            PlanOffers.run,
            query,
            id=f"offers-{uuid.uuid4().hex[:12]}",
            task_queue=self.task_queue,
        )


__all__ = [
    "GpuprovClient",
    "GpuprovError",
    "JobAlreadyExists",
    "JobHandle",
    "JobNotFound",
    "OffersQuery",
    "ResourceRequest",
]
