"""Where jobs lost time, read from their histories.

- Stalls: activity steps that waited long for their next attempt.
- Workflow task waits: how long each job's workflow tasks waited for a worker (schedule to
  start), and how many timed out. After a SIGKILL the restarted worker has an empty cache, so
  every open job replays its history on its next task, on top of the worker's start-up; on a
  small machine this, more than any single stall, is where a chaos run's time goes.

When a worker dies holding an activity, Temporal only hands it out again once the attempt's
timeout runs out: the heartbeat timeout for the steps that heartbeat (create, the waits), the
start-to-close timeout for the others. Read from each job's history: an activity whose final
attempt (> 1) started more than `threshold` seconds after it was scheduled, or that was still
unstarted when it was cancelled or timed out after that long.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

THRESHOLD = 25.0  # above the forward retry backoff (1+2+4+8 s) and a heartbeat timeout
MAX_FETCHES = 8


@dataclass
class JobTimes:
    """Per job: workflow task waits (seconds) and timeouts."""

    job: str
    wft_wait: float = 0.0
    wft_timeouts: int = 0
    stalls: tuple[Stall, ...] = ()


@dataclass(frozen=True)
class Stall:
    job: str
    activity: str
    scheduled_at: float  # seconds since the run started
    resumed_at: float  # when the attempt that ran started, or when it was given up
    attempt: int | None  # the attempt that ran; None when none did
    ended: str  # "retried" / "cancelled" / "timed out"

    @property
    def gap(self) -> float:
        return self.resumed_at - self.scheduled_at


async def find_stalls(
    client: Client, workflow_ids: list[str], epoch0: float, threshold: float = THRESHOLD
) -> tuple[list[JobTimes], list[str]]:
    """Each job's stalls and waits (seconds relative to `epoch0`), and unreadable histories."""
    limit = asyncio.Semaphore(MAX_FETCHES)
    unread: list[str] = []

    async def one(workflow_id: str) -> JobTimes | None:
        async with limit:
            try:
                history = await client.get_workflow_handle(workflow_id).fetch_history()
            except Exception as error:  # reported, never fatal
                unread.append(f"{workflow_id}: {error}")
                return None
        return _times(workflow_id.removeprefix("job-"), history.events, epoch0, threshold)

    results = await asyncio.gather(*(one(workflow_id) for workflow_id in workflow_ids))
    return [result for result in results if result is not None], unread


def _times(job: str, events, epoch0: float, threshold: float) -> JobTimes:  # type: ignore[no-untyped-def]
    times = JobTimes(job)
    task_scheduled: float | None = None
    scheduled: dict[int, tuple[str, float]] = {}
    started: dict[int, tuple[int, float]] = {}
    given_up: dict[int, tuple[str, float]] = {}
    for event in events:
        at = event.event_time.ToMicroseconds() / 1e6 - epoch0
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            task_scheduled = at
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and task_scheduled is not None:
            times.wft_wait += max(0.0, at - task_scheduled)
            task_scheduled = None
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            times.wft_timeouts += 1
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = (attributes.activity_type.name, at)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attributes = event.activity_task_started_event_attributes
            started[attributes.scheduled_event_id] = (attributes.attempt, at)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            attributes = event.activity_task_canceled_event_attributes
            given_up.setdefault(attributes.scheduled_event_id, ("cancelled", at))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED:
            attributes = event.activity_task_cancel_requested_event_attributes
            given_up.setdefault(attributes.scheduled_event_id, ("cancelled", at))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            attributes = event.activity_task_timed_out_event_attributes
            given_up.setdefault(attributes.scheduled_event_id, ("timed out", at))
    found = []
    for event_id, (activity, at) in scheduled.items():
        if event_id in started:
            attempt, began = started[event_id]
            if attempt > 1 and began - at > threshold:
                found.append(Stall(job, activity, at, began, attempt, "retried"))
        elif event_id in given_up:
            how, when = given_up[event_id]
            if when - at > threshold:
                found.append(Stall(job, activity, at, when, None, how))
    times.stalls = tuple(found)
    return times


def stall_lines(stalls: list[Stall], disruptions: list[tuple[float, str]]) -> list[str]:
    """One line per activity type, then the longest stalls with the disruption before each."""
    if not stalls:
        return []
    by_type: dict[str, list[Stall]] = defaultdict(list)
    for stall in stalls:
        by_type[stall.activity].append(stall)
    lines = [
        f"{activity}: {len(items)} stall(s), longest {max(s.gap for s in items):.0f}s"
        for activity, items in sorted(by_type.items(), key=lambda kv: -len(kv[1]))
    ]
    for stall in sorted(stalls, key=lambda s: -s.gap)[:10]:
        cause = _cause(stall, disruptions)
        attempt = f"attempt {stall.attempt}" if stall.attempt else stall.ended
        lines.append(
            f"{stall.job}: {stall.activity} scheduled at t+{stall.scheduled_at:.1f}s, "
            f"{attempt} at t+{stall.resumed_at:.1f}s ({stall.gap:.0f}s later); {cause}"
        )
    return lines


def _cause(stall: Stall, disruptions: list[tuple[float, str]]) -> str:
    """The first disruption while it waited: the one whose worker most likely held it."""
    during = [
        (at, what)
        for at, what in disruptions
        if stall.scheduled_at - 2.0 <= at <= stall.resumed_at  # 2 s: clocks and dispatch
    ]
    if not during:
        return "no disruption while it waited"
    at, what = during[0]
    return f"{what} at t+{at:.1f}s"
