"""Which worker process served the jobs, read from their histories (`--workers N`).

Temporal records the identity of the worker that started each workflow task and each activity
task; a Python worker's default identity is `<pid>@<host>`. The harness knows every pid each
worker process had (one per start), so it can say how many tasks each worker ran, and a
multi-worker run checks that every worker took part rather than one idling beside the other.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

MAX_FETCHES = 8
STARTED = (EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)
OTHER = "another process"


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


def _pid(identity: str) -> int:
    head = identity.split("@", 1)[0]
    return int(head) if head.isdigit() else -1
