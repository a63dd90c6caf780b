"""Which worker process served the jobs, read from their histories (`--workers N`).

Temporal records the identity of the worker that started each workflow task and each activity
task; a Python worker's default identity is `<pid>@<host>`. The harness knows every pid each
worker process had (one per start), so it can say how many tasks each worker ran, and a
multi-worker run checks that every worker took part rather than one idling beside the other.

Temporal keeps a workflow on the worker that has it cached and runs its activities eagerly
there, so in a small run one worker can hold every job while the other idles, and a killed
worker's jobs come back on another only after Temporal notices (the sticky queue's poller gone,
an activity's timeout); a worker back within a second usually takes its own jobs again. With
several workers the harness therefore aims each kill at a moment its worker holds an open job
(`jobs_held_by`, waited for a bounded while) and keeps the killed worker down until another has
taken those jobs over (`wait_for_takeover`): the run proves the takeover, and that every worker
ran tasks, instead of hoping for it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import datetime

from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

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


class Takeover(BaseModel):
    """What became of the open jobs a killed worker held, once it had been down a while."""

    held: list[str] = []  # open jobs whose last task the killed worker ran
    taken_over: list[str] = []  # a task of theirs started on another worker since the kill
    ended: list[str] = []  # closed meanwhile
    waited: float = 0.0

    @property
    def waiting(self) -> list[str]:
        return [job for job in self.held if job not in self.taken_over + self.ended]


async def wait_for_takeover(
    client: Client, workflow_ids: list[str], killed_pid: int, since: datetime, limit: float
) -> Takeover:
    """Until every open job whose latest task ran in `killed_pid` has a task started by another
    process after `since` (or has closed), polling twice a second for at most `limit` seconds.
    Unreadable histories count as not taken over; the caller restarts the worker regardless."""
    started = time.monotonic()
    result = Takeover(held=await jobs_held_by(client, workflow_ids, killed_pid))
    while result.waiting and time.monotonic() - started < limit:
        await asyncio.sleep(0.5)
        for workflow_id in result.waiting:
            pid = await _last_task_pid(client, workflow_id, since)
            if pid == _CLOSED:
                result.ended.append(workflow_id)
            elif pid not in (None, killed_pid):
                result.taken_over.append(workflow_id)
    result.waited = time.monotonic() - started
    return result


async def jobs_held_by(client: Client, workflow_ids: list[str], pid: int) -> list[str]:
    """The open jobs whose latest task (workflow task or activity attempt) ran in `pid`."""
    return [
        workflow_id
        for workflow_id in workflow_ids
        if await _last_task_pid(client, workflow_id, None) == pid
    ]


_CLOSED = -2


async def _last_task_pid(client: Client, workflow_id: str, since: datetime | None) -> int | None:
    """The pid of the process that started the job's latest task (since `since`, when given),
    _CLOSED for a job no longer running, None when there is none or the server cannot say.

    An activity's started event is written only when the attempt ends, so the attempt in flight
    is read from the pending activities."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        description = await handle.describe()
        if description.status != WorkflowExecutionStatus.RUNNING:
            return _CLOSED
        history = await handle.fetch_history()
    except Exception:  # a server restarting; the next poll asks again
        return None
    latest: tuple[datetime, int] | None = None
    for event in history.events:
        if event.event_type == STARTED[0]:
            identity = event.workflow_task_started_event_attributes.identity
        elif event.event_type == STARTED[1]:
            identity = event.activity_task_started_event_attributes.identity
        else:
            continue
        latest = _later(latest, event.event_time.ToDatetime(), identity, since)
    for pending in description.raw_description.pending_activities:
        if pending.last_worker_identity and pending.HasField("last_started_time"):
            when = pending.last_started_time.ToDatetime()
            latest = _later(latest, when, pending.last_worker_identity, since)
    return latest[1] if latest else None


def _later(
    latest: tuple[datetime, int] | None, when: datetime, identity: str, since: datetime | None
) -> tuple[datetime, int] | None:
    if since is not None and when < since:
        return latest
    if latest is None or when >= latest[0]:
        return when, _pid(identity)
    return latest
