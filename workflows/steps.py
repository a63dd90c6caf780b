"""How the workflows run an activity: one table of step options keyed by the activity itself.

Each activity a workflow schedules has one `Step` row in `STEPS`: local or remote, its retry
policy, its timeouts (fixed, or derived from the provider's timing hints), its heartbeat, and the
stage the failure policy sees it in. `run_step(activity, arg)` looks the row up, so nothing
chooses options by an activity's name, and an activity without a row cannot be run at all
(tests/workflows/test_steps.py checks the table against what the worker registers).
Deterministic helpers only; shared by every workflow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError

with workflow.unsafe.imports_passed_through():
    from activities.bootstrap import AGENT_TIMEOUT, BootstrapActivities
    from activities.cloud import CloudActivities
    from activities.errors import StepFailure, unwrap
    from activities.health import HealthActivities
    from activities.job_context import JobContextActivities
    from activities.k3s import K3sActivities
    from activities.liveness import LivenessActivities
    from activities.offer_stats import OfferStatsActivities
    from activities.reconcile import ReconcileActivities
    from activities.registrations import RegistrationActivities
    from activities.store import StoreActivities
    from activities.teams import TeamActivities
    from activities.work import WorkActivities
    from gpuprov import policy
    from gpuprov.policy import Stage
    from providers.base import Capabilities

SHORT_STEP = timedelta(seconds=30)
CLOUD_STEP = timedelta(minutes=5)
WAIT_MARGIN = timedelta(minutes=2)
# Every step that talks to a cloud heartbeats (a background beat at a third of this, whatever
# the step is doing), so a step held by a dead worker is handed out again within about this
# long plus the retry's first backoff, instead of after its start-to-close timeout. An
# overloaded worker whose beat comes late only costs a retry: the retry waits for the first
# attempt's cloud call to finish (activities/fencing.py) and adopts what it made.
CALL_HEARTBEAT = timedelta(seconds=10)
K3S_STEP = timedelta(minutes=30)  # the installers on every node, with their downloads
K3S_HEARTBEAT = timedelta(seconds=60)
HEALTH_STEP = timedelta(minutes=3)
NODES_HEALTH_STEP = timedelta(minutes=10)  # every node of a job, 16 probes at a time

# A fixed duration, or one derived from the provider's timing hints.
Timing = timedelta | Callable[[Capabilities], timedelta]


def wait_timeout(seconds: float) -> timedelta:
    return timedelta(seconds=seconds) + WAIT_MARGIN


def _boot(hints: Capabilities) -> timedelta:
    return wait_timeout(hints.boot_timeout)


def _bootstrap(hints: Capabilities) -> timedelta:
    return wait_timeout(hints.boot_timeout + AGENT_TIMEOUT)


def _retire(hints: Capabilities) -> timedelta:
    return wait_timeout(hints.delete_timeout) + 2 * CLOUD_STEP


@dataclass(frozen=True)
class Step:
    """How one activity runs. Local steps run inside the workflow task on the worker that runs
    the workflow: short database and configuration reads and writes, with no activity-task
    round trip and one marker event instead of three."""

    stage: Stage
    retry: RetryPolicy
    timeout: Timing
    heartbeat: Timing | None = None
    local: bool = False
    # Cancelling the workflow waits for the activity to finish cancelling: a create that lands
    # meanwhile is then known to the teardown that follows.
    wait_cancellation: bool = False


def _bookkeeping(retry: RetryPolicy = policy.STORE_RETRY) -> Step:
    return Step(Stage.BOOKKEEPING, retry, SHORT_STEP, local=True)


def _cloud_call(stage: Stage, timeout: timedelta = CLOUD_STEP, **options: Any) -> Step:
    return Step(stage, policy.FORWARD_RETRY, timeout, CALL_HEARTBEAT, **options)


STEPS: dict[Callable[..., Any], Step] = {
    # what a job reads first, and the shared records
    JobContextActivities.job_context: _bookkeeping(),
    TeamActivities.team_spend: _bookkeeping(),
    CloudActivities.describe_providers: _bookkeeping(policy.FORWARD_RETRY),
    CloudActivities.skipped_providers: _bookkeeping(policy.FORWARD_RETRY),
    StoreActivities.active_blocks: _bookkeeping(),
    StoreActivities.record_block: _bookkeeping(),
    StoreActivities.claim_launch: _bookkeeping(),
    StoreActivities.capacity_back: _bookkeeping(),
    OfferStatsActivities.record_attempt: _bookkeeping(),
    OfferStatsActivities.offer_stats: _bookkeeping(),
    StoreActivities.record_cost: _bookkeeping(),
    StoreActivities.mark_vm: _bookkeeping(policy.TEARDOWN_RETRY),
    StoreActivities.mark_placed: _bookkeeping(),
    StoreActivities.release_job_workers: _bookkeeping(policy.TEARDOWN_RETRY),
    StoreActivities.record_orphan: _bookkeeping(policy.TEARDOWN_RETRY),
    StoreActivities.resolve_orphan: _bookkeeping(),
    WorkActivities.assign_work: _bookkeeping(),
    WorkActivities.stop_work: _bookkeeping(),
    WorkActivities.abandon_work: _bookkeeping(policy.TEARDOWN_RETRY),
    WorkActivities.work_state: _bookkeeping(),
    LivenessActivities.job_workers: _bookkeeping(),
    # the cloud
    CloudActivities.plan: _cloud_call(Stage.PLAN),
    CloudActivities.prepare: _cloud_call(Stage.ATTEMPT),
    CloudActivities.create: _cloud_call(Stage.ATTEMPT, wait_cancellation=True),
    CloudActivities.launch: _cloud_call(Stage.ATTEMPT, 2 * CLOUD_STEP, wait_cancellation=True),
    CloudActivities.wait_running: Step(Stage.ATTEMPT, policy.WAIT_RETRY, _boot, CALL_HEARTBEAT),
    CloudActivities.retire: Step(Stage.TEARDOWN, policy.TEARDOWN_RETRY, _retire, CALL_HEARTBEAT),
    # the node
    BootstrapActivities.bootstrap: Step(
        Stage.ATTEMPT, policy.WAIT_RETRY, _bootstrap, CALL_HEARTBEAT
    ),
    RegistrationActivities.await_registrations: Step(
        Stage.ATTEMPT, policy.WAIT_RETRY, _boot, CALL_HEARTBEAT
    ),
    K3sActivities.setup_k3s: Step(Stage.ATTEMPT, policy.FORWARD_RETRY, K3S_STEP, K3S_HEARTBEAT),
    HealthActivities.check_health: Step(
        Stage.ATTEMPT, policy.WAIT_RETRY, HEALTH_STEP, CALL_HEARTBEAT
    ),
    HealthActivities.check_nodes: Step(
        Stage.ATTEMPT, policy.WAIT_RETRY, NODES_HEALTH_STEP, CALL_HEARTBEAT
    ),
    # the reconciler
    ReconcileActivities.reconcile_survey: Step(
        Stage.PLAN, policy.FORWARD_RETRY, CLOUD_STEP, CALL_HEARTBEAT
    ),
    # the liveness sweep
    LivenessActivities.sweep_liveness: Step(Stage.BOOKKEEPING, policy.FORWARD_RETRY, CLOUD_STEP),
}


def step_name(fn: Callable[..., Any]) -> str:
    """The activity's registered name (what history and the worker call it)."""
    definition = activity._Definition.must_from_callable(fn)
    assert definition.name is not None
    return definition.name


def _duration(timing: Timing, hints: Capabilities | None, fn: Callable[..., Any]) -> timedelta:
    if isinstance(timing, timedelta):
        return timing
    if hints is None:
        raise ValueError(f"{step_name(fn)} needs the provider's timing hints")
    return timing(hints)


async def run_step(
    fn: Callable[..., Any],
    arg: Any = None,
    *,
    hints: Capabilities | None = None,
    summary: str | None = None,
    remote: bool = False,
) -> Any:
    """Execute one activity per its row in STEPS; a failure comes back as StepFailure(step,
    kind, cloud's words, block scope), and a cancellation as asyncio.CancelledError.

    `remote` runs a local step as an activity task instead: a local step runs inside the
    workflow task, so what it changes stays changed even when that task is lost (timed out
    on a busy worker, or its worker killed) and the history goes another way; an activity
    is only scheduled by a workflow task that completed."""
    step = STEPS[fn]
    args = [] if arg is None else [arg]
    timeout = _duration(step.timeout, hints, fn)
    cancellation = (
        workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
        if step.wait_cancellation
        else workflow.ActivityCancellationType.TRY_CANCEL
    )
    try:
        if step.local and not remote:
            return await workflow.execute_local_activity_method(
                fn,
                args=args,
                start_to_close_timeout=timeout,
                retry_policy=step.retry,
                cancellation_type=cancellation,
                summary=summary,
            )
        heartbeat = _duration(step.heartbeat, hints, fn) if step.heartbeat is not None else None
        return await workflow.execute_activity_method(
            fn,
            args=args,
            start_to_close_timeout=timeout,
            heartbeat_timeout=heartbeat,
            retry_policy=step.retry,
            cancellation_type=cancellation,
            summary=summary,
        )
    except ActivityError as error:
        if isinstance(error.cause, CancelledError):
            # The step was cancelled because this workflow (or the provisioning timeout's task)
            # was: that is a cancellation, never a failure to fail over from or to block.
            raise asyncio.CancelledError() from None
        raise unwrap(step_name(fn), step.stage, error) from None


async def run_all(steps: Iterable[Awaitable[Any]]) -> list[Any]:
    """Run steps concurrently; let all finish, then raise the first failure in order."""
    results = await asyncio.gather(*steps, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


async def in_rounds(step: Callable[[], Awaitable[Any]]) -> None:
    """Run a teardown step; run it again while the policy says another round is due."""
    rounds = 0
    while True:
        rounds += 1
        try:
            await step()
            return
        except StepFailure as failure:
            decision = policy.decide(
                policy.Failure(failure.kind, Stage.TEARDOWN, rounds_done=rounds)
            )
            if not decision.retry:
                raise
        await workflow.sleep(policy.TEARDOWN_PAUSE * rounds)
