"""What Temporal says about the job a VM row names: the one judgement that the reconciler's
survey, `gpuprov orphans` and `gpuprov end` share.

A job is the workflow `job-<name>` (its latest run), and it stands in one of four ways:
- ended: there is no such workflow, or it is closed; nothing holds its machines any more;
- running: its `status` query answered; `live_vms` are the machines it holds (requested,
  running, kept);
- stuck: it is running, but its workflow task keeps failing (the pending task's attempt is over
  1, e.g. after a nondeterminism error) or its status query fails. Such a job cannot look after
  its machines, a cancel never reaches its code, and only a terminate (`gpuprov end`) ends it;
- unknown: Temporal did not answer, or no worker answered the query in time.
Only "running" and "ended" say who holds a machine; the reconciler leaves the other two alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from pydantic import Field
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.service import RPCError, RPCStatusCode

from gpuprov import contract
from gpuprov.models import JobStatus, workflow_id_for
from gpuprov.sdk.codec import PayloadDecryptionError
from gpuprov.store.db import VmRecord
from providers.base import Model
from providers.errors import truncate

RPC_TIMEOUT = timedelta(seconds=10)
# The last failed workflow task is near the end of the history: read that far back, no further.
HISTORY_TAIL_EVENTS = 200
MAX_DETAIL = 500
CONCURRENT_ASKS = 16  # jobs asked at once by `situations`


class Standing(StrEnum):
    ENDED = "ended"
    RUNNING = "running"
    STUCK = "stuck"
    UNKNOWN = "unknown"


class JobSituation(Model):
    job: str
    standing: Standing
    live_vms: list[str] = Field(default_factory=list)  # running only: the machines it holds
    detail: str = ""  # how it ended, why it is stuck, or what did not answer

    def holds(self, vm: str) -> bool:
        return self.standing is Standing.RUNNING and vm in self.live_vms


async def job_situation(
    client: Client, job: str, rpc_timeout: timedelta = RPC_TIMEOUT
) -> JobSituation:
    """Describe `job-<job>`, and ask a running one which machines it holds."""
    handle = client.get_workflow_handle(workflow_id_for(job))
    try:
        description = await handle.describe(rpc_timeout=rpc_timeout)
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            return JobSituation(job=job, standing=Standing.ENDED, detail="no such workflow")
        return _unknown(job, f"describe {handle.id}: {error.message}")
    if description.status is not WorkflowExecutionStatus.RUNNING:
        closed = description.status.name.lower() if description.status else "closed"
        return JobSituation(job=job, standing=Standing.ENDED, detail=f"workflow {closed}")
    attempt = description.raw_description.pending_workflow_task.attempt
    if attempt > 1:
        failure = await _last_task_failure(client, description, rpc_timeout)
        why = f"its workflow task keeps failing (attempt {attempt})"
        return _stuck(job, f"{why}: {failure}" if failure else why)
    try:
        status = await handle.query(
            contract.JOB_STATUS, result_type=JobStatus, rpc_timeout=rpc_timeout
        )
    except WorkflowQueryFailedError as error:  # a worker answered: it cannot run the job's code
        return _stuck(job, f"its status query fails: {error}")
    except RPCError as error:
        if error.status is RPCStatusCode.FAILED_PRECONDITION:  # its workflow task has failed
            return _stuck(job, f"its status query fails: {error.message}")
        return _unknown(
            job,
            f"status query of {handle.id}: {error.message} "
            f"(is a worker polling task queue {description.task_queue}?)",
        )
    except WorkflowQueryRejectedError as error:
        return _unknown(job, f"status query of {handle.id} rejected: {error}")
    live = sorted(node.vm for node in status.live_nodes())
    return JobSituation(job=job, standing=Standing.RUNNING, live_vms=live)


async def situations(
    client: Client, jobs: Iterable[str], rpc_timeout: timedelta = RPC_TIMEOUT
) -> dict[str, JobSituation]:
    """Each job's situation, a few jobs asked at once."""
    gate = asyncio.Semaphore(CONCURRENT_ASKS)

    async def ask(job: str) -> JobSituation:
        async with gate:
            return await job_situation(client, job, rpc_timeout)

    names = sorted(set(jobs))
    answers = await asyncio.gather(*(ask(job) for job in names))
    return dict(zip(names, answers, strict=True))


def unreachable(jobs: Iterable[str], why: str) -> dict[str, JobSituation]:
    """Every job's situation when Temporal cannot be reached at all."""
    return {job: _unknown(job, why) for job in sorted(set(jobs))}


@dataclass(frozen=True)
class Unheld:
    """The unfinished machines of one job that does not hold them as a running job would."""

    situation: JobSituation
    vms: list[VmRecord]


def unheld_machines(unfinished: list[VmRecord], by_job: dict[str, JobSituation]) -> list[Unheld]:
    """Unfinished VM rows (neither terminated nor kept) grouped by job, leaving out the
    machines a running job holds: what is left is stuck, unknown, or waiting for the reconciler."""
    groups: dict[str, list[VmRecord]] = {}
    for row in unfinished:
        if not by_job[row.job].holds(row.vm):
            groups.setdefault(row.job, []).append(row)
    return [Unheld(by_job[job], rows) for job, rows in sorted(groups.items())]


async def _last_task_failure(
    client: Client, description: WorkflowExecutionDescription, rpc_timeout: timedelta
) -> str:
    """The message of the latest failed workflow task (decoded with the client's converter, so
    an encrypted one reads in clear); "" when there is none or the history cannot be read."""
    request = GetWorkflowExecutionHistoryReverseRequest(
        namespace=client.namespace,
        execution=WorkflowExecution(workflow_id=description.id, run_id=description.run_id),
        maximum_page_size=HISTORY_TAIL_EVENTS,
    )
    try:
        page = await client.workflow_service.get_workflow_execution_history_reverse(
            request, timeout=rpc_timeout
        )
    except RPCError:
        return ""
    for event in page.history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failure = event.workflow_task_failed_event_attributes.failure
            try:
                error = await client.data_converter.decode_failure(failure)
            except PayloadDecryptionError:  # encrypted with a key this client lacks
                return truncate(failure.message, MAX_DETAIL)
            return truncate(str(error), MAX_DETAIL)
    return ""


def _stuck(job: str, detail: str) -> JobSituation:
    return JobSituation(job=job, standing=Standing.STUCK, detail=truncate(detail, MAX_DETAIL))


def _unknown(job: str, detail: str) -> JobSituation:
    return JobSituation(job=job, standing=Standing.UNKNOWN, detail=truncate(detail, MAX_DETAIL))
