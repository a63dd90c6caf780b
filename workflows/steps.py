"""How the workflow runs one activity step: options, error unwrapping, fan-out, rounds.

Deterministic helpers only; shared by the job lifecycle, the attempt saga and teardown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError

with workflow.unsafe.imports_passed_through():
    from activities.errors import StepFailure, unwrap
    from providers.base import Capabilities
    from workflows import policy, versions

SHORT_STEP = timedelta(seconds=30)
CLOUD_STEP = timedelta(minutes=5)
WAIT_MARGIN = timedelta(minutes=2)
# A wait heartbeats every third of its timeout; 15 s at least, so an overloaded (not dead)
# worker's late beats do not time its waits out (1000 jobs on 2 cores did, at 5 s).
MIN_HEARTBEAT = 15.0
# Bookkeeping steps (the database): a short outage is waited out, not failed over.
STORE_STEPS = frozenset(
    {"job_context", "reserve", "blocks", "record_cost", "record_block", "mark_vm", "mark_placed"}
)
# Steps that run as local activities (in the workflow task, on the worker running the workflow):
# short database and configuration reads and writes. No activity task round trip, no three
# history events each (a marker instead): about half of a job's server-side work (issue 8), and
# a worker killed during one costs a workflow task retry, not a 30 s start-to-close.
LOCAL_STEPS = STORE_STEPS | {"describe", "release_workers", "record_orphan", "resolve_orphan"}
# Cloud calls heartbeat while they run, so a dead worker is noticed in seconds instead of after
# the 5-minute start-to-close (chaos finding 4: 300 s stalls per step a killed worker held).
CALL_HEARTBEAT = timedelta(seconds=15)
CREATE_HEARTBEAT = CALL_HEARTBEAT
HEARTBEATING_CALLS = frozenset({"plan", "prepare", "create", "launch", "delete", "cleanup"})


async def run_step(step: str, activity: Any, *args: Any, **options: Any) -> Any:
    """Execute one activity; a failure comes back as StepFailure(step, kind, cloud's words)."""
    options.setdefault(
        "retry_policy",
        policy.STORE_RETRY if step in STORE_STEPS else policy.FORWARD_RETRY,
    )
    options.setdefault("start_to_close_timeout", CLOUD_STEP)
    if step in HEARTBEATING_CALLS:  # (a schedule's timeouts are not part of determinism)
        options.setdefault("heartbeat_timeout", CALL_HEARTBEAT)
    try:
        if step in LOCAL_STEPS and versions.current():
            return await workflow.execute_local_activity_method(activity, *args, **options)
        return await workflow.execute_activity_method(activity, *args, **options)
    except ActivityError as error:
        if isinstance(error.cause, CancelledError) and versions.current():
            # The step was cancelled because this workflow (or the provisioning timeout's task)
            # was: that is a cancellation, never a failure to fail over from or to block.
            raise asyncio.CancelledError() from None
        raise unwrap(step, error) from None


async def run_all(steps: Iterable[Awaitable[Any]]) -> list[Any]:
    """Run steps concurrently; let all finish, then raise the first failure in order."""
    results = await asyncio.gather(*steps, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


async def in_rounds(step: Callable[[], Awaitable[Any]]) -> None:
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


def heartbeat_timeout(hints: Capabilities) -> timedelta:
    return timedelta(seconds=max(MIN_HEARTBEAT, 4 * hints.poll_interval))


def wait_timeout(seconds: float) -> timedelta:
    return timedelta(seconds=seconds) + WAIT_MARGIN
