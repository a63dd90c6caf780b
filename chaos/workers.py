"""Which worker process served the jobs, read from their histories (`--workers N`).

Temporal records the identity of the worker that started each workflow task and each activity
task; a Python worker's default identity is `<pid>@<host>`. The harness knows every pid each
worker process had (one per start), so it can say how many tasks each worker ran, and a
multi-worker run checks that every worker took part rather than one idling beside the other.

Taking part means polling the jobs' task queue while they ran (`polling_pids`, sampled through the
run): a worker on the wrong queue or namespace, or one that never connects, fails that. Which
poller gets a job is Temporal's choice, and it keeps a workflow on the worker that has it cached
and runs its activities eagerly there, so in a small run one worker can hold every job (seen in a
4-job run: worker 1 0 tasks, worker 2 109). Tasks per worker are therefore reported always and
required only of a run with enough jobs to spread (`SPREAD_JOBS_PER_WORKER`).
"""

from __future__ import annotations

import asyncio
from collections import Counter

from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

MAX_FETCHES = 8
STARTED = (EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)
OTHER = "another process"
# With this many jobs per worker or more, every worker must also have run tasks: a 40-job run on
# two workers split 559/420, a 4-job run 0/109.
SPREAD_JOBS_PER_WORKER = 10
QUEUE_TYPES = (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)


async def tasks_by_worker(
    client: Client, workflow_ids: list[str], names_by_pid: dict[int, str]
) -> Counter[str]:
    """Workflow and activity tasks started by each worker (by name); histories that cannot be
    read are skipped, tasks of a pid not listed count under OTHER."""
    limit = asyncio.Semaphore(MAX_FETCHES)
    tally: Counter[str] = Counter()

    async def one(workflow_id: str) -> None:
        async with limit:
            try:
                history = await client.get_workflow_handle(workflow_id).fetch_history()
            except Exception:  # stalls.py already reports unreadable histories
                return
        for event in history.events:
            if event.event_type == STARTED[0]:
                identity = event.workflow_task_started_event_attributes.identity
            elif event.event_type == STARTED[1]:
                identity = event.activity_task_started_event_attributes.identity
            else:
                continue
            tally[names_by_pid.get(_pid(identity), OTHER)] += 1

    await asyncio.gather(*(one(workflow_id) for workflow_id in workflow_ids))
    return tally


async def polling_pids(client: Client, task_queue: str) -> set[int]:
    """The pids of the processes the server lists as pollers of the task queue (workflow and
    activity): those polling now and those that polled in the last few minutes."""
    pids: set[int] = set()
    for queue_type in QUEUE_TYPES:
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=queue_type,
            )
        )
        pids.update(_pid(poller.identity) for poller in described.pollers)
    return pids


def _pid(identity: str) -> int:
    head = identity.split("@", 1)[0]
    return int(head) if head.isdigit() else -1
