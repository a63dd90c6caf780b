"""The Python SDK other services use: typed pydantic models in and out, over a Temporal client.

client = await GpuprovClient.connect("localhost:7233")  # or settings=load_settings().temporal
handle = await client.submit(JobSpec(name="train-7b", nodes=2, resources=...))
status = await handle.wait_ready(timeout=1800)
await handle.release()
final = await handle.result()
jobs = await client.list(state=JobState.READY, provider="lambda")  # [JobSummary]
report = await client.end_job("train-7b", reason="stuck after a bad deploy")  # EndReport
costs = await client.cost("train-7b")  # CostReport; needs database_url= on connect
async for line in client.logs("train-7b", follow=True):  # LogLine; needs database_url= too
    print(line.node, line.text)

The workers (registered machines) live in the control plane's database, so their SDK talks to
the control-plane API with an operator API key (`gpuprov apikey create`):

async with WorkersClient("https://cp:8080", api_key) as workers:
    for worker in await workers.list(state="idle"):  # [WorkerSummary]: liveness, health, ...
        ...
    await workers.drain(worker_id)      # no new reservations (undrain takes it back)
    await workers.remove(worker_id)     # revoked, with its credential; its agent stops

Every failure is a GpuprovError (JobNotFound, JobAlreadyExists, WorkerNotFound) whose message
says what went wrong; a wait that runs out raises TimeoutError. examples/sdk_service.py is a
worked example.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta

import httpx
from sqlalchemy.exc import SQLAlchemyError
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from gpuprov import contract
from gpuprov.config import CodecSettings, ConfigError, TemporalSettings
from gpuprov.contract import (
    HealthInput,
    HealthRequest,
    OffersQuery,
    OffersResult,
    ReconcileInput,
    ReconcileReport,
    vm_run_tag,
)
from gpuprov.models import (
    TEAM_NAME_PATTERN,
    HealthReport,
    JobSpec,
    JobState,
    JobStatus,
    WorkerList,
    WorkerSummary,
    workflow_id_for,
)
from gpuprov.sdk.connection import connect_temporal
from gpuprov.store.costs import CostReport, MachineCost, Money, ProviderCost, cost_report
from gpuprov.store.db import Database
from gpuprov.store.logs import LogLine, read_lines
from gpuprov.store.runs import RunNotFound
from providers import PROVIDER_IDS
from providers.base import Model, ResourceRequest

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


class WorkerNotFound(GpuprovError):
    pass


class JobSummary(Model):
    """One row of `GpuprovClient.list`: what the job's search attributes say."""

    name: str
    state: JobState
    provider: str | None = None  # the offer in use (or last tried)
    region: str | None = None
    gpu: str | None = None
    team: str | None = None
    started_at: datetime | None = None
    closed_at: datetime | None = None


class EndReport(ReconcileReport):
    """`GpuprovClient.end_job`: what happened to the job's workflow, then the report of the
    reconcile pass over the job's machines."""

    job: str
    terminated: bool = False  # this call terminated the running workflow
    workflow: str = ""  # how the workflow stands: "terminated", "had ended: completed", ...

    @property
    def nothing_left(self) -> bool:
        """No machine of the job is left for gpuprov to delete (kept ones are the user's)."""
        return self.still_open == 0


class JobHandle:
    """One job: status, waits and the two ways to end it (release, cancel)."""

    def __init__(self, name: str, handle: WorkflowHandle) -> None:
        self.name = name
        self._handle = handle

    async def status(self) -> JobStatus:
        try:
            return await self._handle.query(contract.JOB_STATUS, result_type=JobStatus)
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

    async def wait_ready(
        self, timeout: float = 3600, on_change: Callable[[JobStatus], None] | None = None
    ) -> JobStatus:
        """The status once placed (ready, or running its work); GpuprovError with the job's
        error if it ended instead."""
        placed = (JobState.READY, JobState.RUNNING)
        status = await self.wait_for(lambda s: s.state in placed, timeout, on_change)
        if status.state not in placed:
            raise GpuprovError(f"job {self.name!r} ended {status.state.value}: {status.error}")
        return status

    async def release(self) -> None:
        await self._running_only(self._handle.signal(contract.JOB_RELEASE))

    async def cancel(self) -> None:
        """Cancel the job; whatever it holds is torn down before it ends `cancelled`."""
        await self._running_only(self._cancel_if_running())

    async def _cancel_if_running(self) -> None:
        # The server accepts a cancel of a closed workflow silently; say it did nothing.
        description = await self._handle.describe()
        ended = _CLOSED_STATES.get(description.status) if description.status else None
        if ended is not None:
            raise JobNotFound(f"no running job named {self.name!r}: it ended {ended.value}")
        await self._handle.cancel()

    async def _running_only(self, call: Awaitable[None]) -> None:
        try:
            await call
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:
                raise JobNotFound(f"no running job named {self.name!r}: {error.message}") from None
            raise GpuprovError(f"job {self.name!r}: {error}") from None

    async def exists(self) -> bool:
        """Whether there is (or was, within the namespace's retention) a workflow for the job."""
        try:
            await self._handle.describe()
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:
                return False
            raise GpuprovError(f"cannot describe job {self.name!r}: {error}") from None
        return True

    async def running(self) -> bool:
        """Whether the job's workflow is still running (False once it ended, or if there is
        none)."""
        try:
            description = await self._handle.describe()
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:
                return False
            raise GpuprovError(f"cannot describe job {self.name!r}: {error}") from None
        return description.status is WorkflowExecutionStatus.RUNNING

    async def result(self) -> JobStatus:
        """Wait for the job to end; the final status whatever the outcome."""
        try:
            with contextlib.suppress(WorkflowFailureError):
                await self._handle.result()
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:
                raise JobNotFound(f"no job named {self.name!r}") from None
            raise GpuprovError(f"cannot wait for job {self.name!r}: {error}") from None
        return await self.status()


def _spec_details(spec: JobSpec) -> str:
    """What the Temporal UI shows under Details: the ask at a glance (markdown)."""
    resources = spec.resources
    cap = f"{spec.max_hourly_cost:g} USD/hour" if spec.max_hourly_cost is not None else "none"
    lines = [
        f"**{spec.nodes} node(s)** of {resources.gpus_per_node}x {resources.gpu or 'any GPU'}"
        + (" (spot)" if resources.spot else ""),
        f"- providers: {', '.join(spec.placement.providers or ['any'])}; "
        f"regions: {', '.join(spec.placement.regions or ['any'])}",
        f"- cost cap: {cap}; provisioning timeout: {spec.provisioning_timeout_seconds}s",
        f"- release: {spec.release.value}",
    ]
    return "\n".join(lines)


def _summary(execution: WorkflowExecution) -> JobSummary:
    attrs = execution.typed_search_attributes
    recorded = attrs.get(contract.STATE)
    job_state = _CLOSED_STATES.get(execution.status) or JobState(recorded or "queued")
    return JobSummary(
        name=execution.id.removeprefix("job-"),
        state=job_state,
        provider=attrs.get(contract.PROVIDER),
        region=attrs.get(contract.REGION),
        gpu=attrs.get(contract.GPU),
        team=attrs.get(contract.TEAM),
        started_at=execution.start_time,
        closed_at=execution.close_time,
    )


class GpuprovClient:
    def __init__(
        self,
        client: Client,
        task_queue: str = DEFAULT_TASK_QUEUE,
        database_url: str | None = None,
    ) -> None:
        self.temporal = client
        self.task_queue = task_queue
        self.database_url = database_url  # gpuprov's database, for `cost`

    @classmethod
    async def connect(
        cls,
        address: str | None = None,
        namespace: str | None = None,
        task_queue: str | None = None,
        codec: CodecSettings | None = None,
        *,
        settings: TemporalSettings | None = None,
        database_url: str | None = None,
    ) -> GpuprovClient:
        """Connect to Temporal.

        `settings` (`load_settings().temporal`) carries TLS and the API key of a production
        cluster (docs/operations.md); `address`, `namespace` and `task_queue` override its
        values. With payload encryption on (`[codec]` in gpuprov.toml), pass the same `codec`
        settings as the workers, e.g. `load_settings().codec`. A setting that cannot work (a
        certificate, key, CA or API key) raises GpuprovError naming it; so does an address
        where nothing answers. `database_url` (`load_settings().database_url`) is gpuprov's
        database, which `cost` reads."""
        overrides = {"address": address, "namespace": namespace, "task_queue": task_queue}
        temporal = (settings or TemporalSettings()).model_copy(
            update={name: value for name, value in overrides.items() if value is not None}
        )
        try:
            client = await connect_temporal(temporal, codec=codec)
        except ConfigError as error:
            raise GpuprovError(str(error)) from None
        except (RuntimeError, ValueError) as error:  # ValueError: an address it cannot parse
            raise GpuprovError(f"cannot reach Temporal at {temporal.address}: {error}") from None
        return cls(client, temporal.task_queue, database_url)

    async def submit(self, spec: JobSpec) -> JobHandle:
        attributes = [
            SearchAttributePair(contract.STATE, JobState.QUEUED.value),
            SearchAttributePair(contract.TEAM, spec.team),
        ]
        if spec.resources.gpu:
            attributes.append(SearchAttributePair(contract.GPU, spec.resources.gpu))
        try:
            handle = await self.temporal.start_workflow(
                contract.PROVISION_JOB,
                spec,
                id=spec.workflow_id,
                task_queue=self.task_queue,
                search_attributes=TypedSearchAttributes(attributes),
                static_summary=f"{spec.nodes}x {spec.resources.gpu or 'any'} for {spec.name}",
                static_details=_spec_details(spec),
            )
        except WorkflowAlreadyStartedError:
            raise JobAlreadyExists(f"a job named {spec.name!r} is already running") from None
        except RPCError as error:  # e.g. a search attribute or payload over the server's limits
            raise GpuprovError(f"cannot start job {spec.name!r}: {error.message}") from None
        return JobHandle(spec.name, handle)

    def job(self, name: str) -> JobHandle:
        """The name's latest run."""
        return JobHandle(name, self.temporal.get_workflow_handle(workflow_id_for(name)))

    async def job_run(self, name: str, run: str) -> JobHandle:
        """The run of the name whose tag is `run` (`JobStatus.run`), at its latest workflow
        execution (a run may have continued as new); JobNotFound if the name never had it."""
        workflow_id = workflow_id_for(name)
        query = f"WorkflowId = '{workflow_id}'"  # a job name has no quote (JOB_NAME_PATTERN)
        try:
            async for execution in self.temporal.list_workflows(query):  # newest first
                handle = self.temporal.get_workflow_handle(workflow_id, run_id=execution.run_id)
                first = (await handle.describe()).raw_description.workflow_execution_info
                if vm_run_tag(first.first_run_id or execution.run_id) == run:
                    return JobHandle(name, handle)
        except RPCError as error:
            raise GpuprovError(f"cannot find run {run!r} of job {name!r}: {error}") from None
        raise JobNotFound(f"job {name!r} has no run {run!r}")

    async def list(
        self,
        state: JobState | None = None,
        provider: str | None = None,
        limit: int = 100,
        team: str | None = None,
    ) -> list[JobSummary]:
        """Recent jobs, newest first, filtered by the GpuprovState/GpuprovProvider/GpuprovTeam
        search attributes (Temporal's visibility lags a moment behind the jobs themselves)."""
        query = _list_query(state, provider, team)
        try:
            return [
                _summary(execution)
                async for execution in self.temporal.list_workflows(query, limit=limit)
            ]
        except RPCError as error:
            raise GpuprovError(f"cannot list jobs: {error.message}") from None

    async def list_page(
        self,
        state: JobState | None = None,
        provider: str | None = None,
        team: str | None = None,
        page_size: int = 100,
        page_token: bytes | None = None,
    ) -> tuple[list[JobSummary], bytes | None]:
        """One page of `list`, and the token of the next (None: the last page)."""
        query = _list_query(state, provider, team)
        pages = self.temporal.list_workflows(query, page_size=page_size, next_page_token=page_token)
        try:
            await pages.fetch_next_page()
        except RPCError as error:
            raise GpuprovError(f"cannot list jobs: {error.message}") from None
        return [_summary(execution) for execution in pages.current_page], pages.next_page_token

    async def end_job(self, name: str, reason: str, timeout: float = 900) -> EndReport:
        """End a job that cannot end itself and delete its machines: terminate `job-<name>`
        if it is still running (no workflow code runs, so its own teardown does not either;
        the reason is recorded in its history), then run one reconcile pass over that job's
        machines with no grace period and wait for it. Idempotent: on an ended job it only
        sweeps again. Kept machines and those a running job holds are never touched."""
        terminated, workflow = await self._terminate(name, reason)
        try:
            report = await self.temporal.execute_workflow(
                contract.RECONCILE,
                ReconcileInput(grace_seconds=0, job=name),
                result_type=ReconcileReport,
                id=f"reconcile-end-{name}-{uuid.uuid4().hex[:8]}",
                task_queue=self.task_queue,
                execution_timeout=timedelta(seconds=timeout),
            )
        except WorkflowFailureError as error:
            raise GpuprovError(
                f"job {name!r}: {workflow}, but the pass over its machines failed "
                f"({error.cause}); is a worker polling {self.task_queue!r}?"
            ) from None
        return EndReport(**report.model_dump(), job=name, terminated=terminated, workflow=workflow)

    async def _terminate(self, name: str, reason: str) -> tuple[bool, str]:
        """Terminate the latest run if it is running: (whether this call did, what it is)."""
        handle = self.temporal.get_workflow_handle(workflow_id_for(name))
        try:
            description = await handle.describe()
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:
                return False, "no such workflow"
            raise GpuprovError(f"cannot describe job {name!r}: {error}") from None
        if description.status is not WorkflowExecutionStatus.RUNNING:
            ended = description.status.name.lower() if description.status else "closed"
            return False, f"had ended: {ended}"
        run = self.temporal.get_workflow_handle(handle.id, run_id=description.run_id)
        try:
            await run.terminate(reason=reason)
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:  # it closed in the meantime
                return False, "had ended"
            raise GpuprovError(f"cannot terminate job {name!r}: {error}") from None
        return True, "terminated"

    async def cost(self, job: str | None = None, run: str | None = None) -> CostReport:
        """What jobs cost, read from gpuprov's database (as `gpuprov cost` reads it): per job
        and provider the hourly estimates and the actual totals per currency; with `job`, each
        of its machines too (quote, launched, gone, billed seconds, amount, or why none), of
        its latest run or of the run `run`."""
        if self.database_url is None:
            raise GpuprovError(
                "cost reads gpuprov's database: connect with database_url= "
                "(load_settings().database_url)"
            )
        return await asyncio.to_thread(_read_cost, self.database_url, job, run)

    async def logs(
        self, job: str, node: int | None = None, follow: bool = False, run: str | None = None
    ) -> AsyncIterator[LogLine]:
        """A job's output, line by line, from gpuprov's database (as `gpuprov logs` reads it;
        needs database_url=): each node's lines in order (of one node with `node`), the nodes'
        interleaved as their output arrived, the control plane's notes (stream "gpuprov") among
        them. Of the job's latest run, or of the run `run` (`JobStatus.run`). `follow`: read on
        while the job runs; the iteration ends once it has ended and all of its output is
        read."""
        if self.database_url is None:
            raise GpuprovError(
                "logs reads gpuprov's database: connect with database_url= "
                "(load_settings().database_url)"
            )
        running = None
        if follow:
            running = self.job(job).running
            if run is None:  # the run Temporal has now, even before it wrote a row
                run = await self._current_run(job)
        try:
            async for line in read_lines(self.database_url, job, node, running, run=run):
                yield line
        except RunNotFound as unknown:
            raise JobNotFound(str(unknown)) from None
        except SQLAlchemyError as error:
            raise GpuprovError(f"cannot read logs from gpuprov's database: {error}") from None

    async def _current_run(self, job: str) -> str | None:
        try:
            return (await self.job(job).status()).run
        except GpuprovError:  # no such job in Temporal (any more): the database's latest
            return None

    async def offers(self, query: OffersQuery, timeout: float = 300) -> OffersResult:
        """Offers a job would try, cheapest first, planned by a worker (it holds the keys)."""
        try:
            return await self.temporal.execute_workflow(
                contract.PLAN_OFFERS,
                query,
                result_type=OffersResult,
                id=f"offers-{uuid.uuid4().hex[:12]}",
                task_queue=self.task_queue,
                execution_timeout=timedelta(seconds=timeout),
            )
        except WorkflowFailureError as error:
            cause = error.cause
            reason = getattr(cause, "message", None) or str(cause)
            raise GpuprovError(
                f"planning offers failed ({reason}); is a worker polling {self.task_queue!r}?"
            ) from None

    async def health(self, name: str, timeout: float = 300) -> list[HealthReport]:
        """Health of a job's machines (`name` is a job) or of one machine (`name` is a VM),
        checked by a worker: the provider's diagnosis plus an SSH probe of each node."""
        try:
            status = await self.job(name).status()
        except JobNotFound:
            checks = [HealthInput(vm=name)]
        else:
            checks = [
                HealthInput(
                    vm=node.vm,
                    expected_gpus=len(node.capabilities.gpus) if node.capabilities else None,
                )
                for node in status.live_nodes()
            ]
            if not checks:
                raise GpuprovError(f"job {name!r} holds no machines ({status.state.value})")
        try:
            return await self.temporal.execute_workflow(
                contract.CHECK_HEALTH,
                HealthRequest(checks=checks),
                result_type=list[HealthReport],
                id=f"health-{uuid.uuid4().hex[:12]}",
                task_queue=self.task_queue,
                execution_timeout=timedelta(seconds=timeout),
            )
        except WorkflowFailureError as error:
            raise GpuprovError(
                f"health check failed ({error.cause}); is a worker polling {self.task_queue!r}?"
            ) from None


def _read_cost(database_url: str, job: str | None, run: str | None = None) -> CostReport:
    """The report from the database as it is: nothing is migrated or written."""
    database = Database(database_url)
    try:
        return cost_report(database, job, run)
    except RunNotFound as unknown:
        raise JobNotFound(str(unknown)) from None
    except SQLAlchemyError as error:
        raise GpuprovError(f"cannot read costs from gpuprov's database: {error}") from None
    finally:
        database.dispose()


class WorkersClient:
    """The control plane's workers, over its API with an operator API key."""

    def __init__(
        self,
        api_url: str,
        api_key: str,
        *,
        ca_file: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.api_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            verify=ca_file if ca_file is not None else True,
            transport=transport,
        )

    async def __aenter__(self) -> WorkersClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def list(self, state: str | None = None, job: str | None = None) -> list[WorkerSummary]:
        """Every worker (of `state`, of `job`), oldest registration first."""
        params = {name: value for name, value in (("state", state), ("job", job)) if value}
        answer = await self._call("GET", "/v1/workers", params=params)
        return WorkerList.model_validate(answer).workers

    async def drain(self, worker_id: str) -> WorkerSummary:
        """No new reservations for this worker; the job it runs keeps it."""
        return await self._worker("POST", f"/v1/workers/{worker_id}/drain", worker_id)

    async def undrain(self, worker_id: str) -> WorkerSummary:
        return await self._worker("POST", f"/v1/workers/{worker_id}/undrain", worker_id)

    async def remove(self, worker_id: str) -> WorkerSummary:
        """Revoke the worker and its credential (its job is told; its agent stops)."""
        return await self._worker("DELETE", f"/v1/workers/{worker_id}", worker_id)

    async def _worker(self, method: str, path: str, worker_id: str) -> WorkerSummary:
        return WorkerSummary.model_validate(await self._call(method, path, worker_id=worker_id))

    async def _call(
        self, method: str, path: str, *, worker_id: str | None = None, **options: object
    ) -> object:
        try:
            response = await self._http.request(method, path, **options)  # type: ignore[arg-type]
        except httpx.HTTPError as error:
            where = f"cannot reach the control-plane API at {self.api_url}"
            raise GpuprovError(f"{where}: {error}") from None
        if response.status_code == 404 and worker_id is not None:
            raise WorkerNotFound(f"no worker {worker_id} that is not revoked")
        if response.status_code >= 400:
            try:
                said = response.json().get("detail")
            except ValueError:
                said = response.text[:300]
            raise GpuprovError(f"the control-plane API answered {response.status_code}: {said}")
        return response.json()


__all__ = [
    "CostReport",
    "EndReport",
    "GpuprovClient",
    "GpuprovError",
    "JobAlreadyExists",
    "JobHandle",
    "JobNotFound",
    "JobSpec",
    "JobState",
    "JobStatus",
    "JobSummary",
    "LogLine",
    "MachineCost",
    "Money",
    "OffersQuery",
    "ProviderCost",
    "ResourceRequest",
    "WorkerNotFound",
    "WorkerSummary",
    "WorkersClient",
]


def _list_query(state: JobState | None, provider: str | None, team: str | None) -> str:
    """The visibility query of `GpuprovClient.list`; GpuprovError for a provider or team that
    could change the query."""
    if provider is not None and provider not in PROVIDER_IDS:
        # It goes into a visibility query: a quote in it would change the query.
        known = ", ".join(PROVIDER_IDS)
        raise GpuprovError(f"unknown provider {provider!r} (known: {known})")
    if team is not None and not re.fullmatch(TEAM_NAME_PATTERN, team):
        raise GpuprovError(f"{team[:64]!r} is not a team name")
    clauses = ["WorkflowType = 'ProvisionJob'"]
    if state is not None:
        clauses.append(f"{contract.STATE.name} = '{state.value}'")
        if not state.terminal:  # a terminated workflow keeps its last recorded state
            clauses.append("ExecutionStatus = 'Running'")
    if provider is not None:
        clauses.append(f"{contract.PROVIDER.name} = '{provider}'")
    if team is not None:
        clauses.append(f"{contract.TEAM.name} = '{team}'")
    return " AND ".join(clauses)
