"""gpuprov's Temporal Schedules, both on the worker's task queue, both with overlap policy SKIP (a
run still going when the next is due makes that one skip):

- "gpuprov-reconcile": one `Reconcile` pass (the orphan reconciler) every
  `[reconcile] every_seconds` (5 minutes by default);
- "gpuprov-liveness": one `WatchWorkers` sweep every `[workers] sweep_every_seconds` (30 s by
  default): silent workers become lost, and jobs whose workers changed are told.

`apply_reconcile_schedule` and `apply_liveness_schedule` are idempotent: each creates its
Schedule, updates it when the interval, input, task queue or workflow differ, and otherwise
changes nothing. An update keeps the Schedule's state, so one an operator paused stays paused.
Called by `gpuprov setup`, `gpuprov schedules apply` and `gpuprov dev`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from gpuprov import contract
from gpuprov.config import ReconcileSettings, Settings, WorkersSettings
from gpuprov.contract import ReconcileInput, WatchInput
from providers.base import Model

SCHEDULE_ID = "gpuprov-reconcile"
WORKFLOW_ID = "gpuprov-reconcile"  # Temporal appends each run's scheduled time
# A pass is bounded: a stuck one must not hold every later pass back (SKIP) for long.
PASS_TIMEOUT = timedelta(hours=1)
LIVENESS_SCHEDULE_ID = "gpuprov-liveness"
LIVENESS_WORKFLOW_ID = "gpuprov-liveness"
SWEEP_TIMEOUT = timedelta(minutes=10)

Outcome = Literal["created", "updated", "unchanged"]


def reconcile_schedule(task_queue: str, settings: ReconcileSettings) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            contract.RECONCILE,
            ReconcileInput(grace_seconds=settings.grace_seconds),
            id=WORKFLOW_ID,
            task_queue=task_queue,
            execution_timeout=PASS_TIMEOUT,
        ),
        spec=ScheduleSpec(
            intervals=[ScheduleIntervalSpec(every=timedelta(seconds=settings.every_seconds))]
        ),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        state=ScheduleState(note="gpuprov orphan reconciler (gpuprov schedules apply)"),
    )


def liveness_schedule(task_queue: str, settings: WorkersSettings) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            contract.WATCH_WORKERS,
            WatchInput(lost_after_seconds=settings.lost_after_seconds),
            id=LIVENESS_WORKFLOW_ID,
            task_queue=task_queue,
            execution_timeout=SWEEP_TIMEOUT,
        ),
        spec=ScheduleSpec(
            intervals=[ScheduleIntervalSpec(every=timedelta(seconds=settings.sweep_every_seconds))]
        ),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        state=ScheduleState(note="gpuprov worker liveness sweep (gpuprov schedules apply)"),
    )


async def apply_reconcile_schedule(
    client: Client, task_queue: str, settings: ReconcileSettings | None = None
) -> Outcome:
    """Create or update the reconciler's Schedule to match `settings`; says which it did."""
    wanted = reconcile_schedule(task_queue, settings or ReconcileSettings())
    return await _apply(client, SCHEDULE_ID, wanted, ReconcileInput)


async def apply_liveness_schedule(
    client: Client, task_queue: str, settings: WorkersSettings | None = None
) -> Outcome:
    """Create or update the liveness sweep's Schedule to match `settings`; says which it did."""
    wanted = liveness_schedule(task_queue, settings or WorkersSettings())
    return await _apply(client, LIVENESS_SCHEDULE_ID, wanted, WatchInput)


async def apply_schedules(client: Client, settings: Settings) -> tuple[Outcome, Outcome]:
    """Both Schedules: (the reconciler's outcome, the liveness sweep's)."""
    task_queue = settings.temporal.task_queue
    return (
        await apply_reconcile_schedule(client, task_queue, settings.reconcile),
        await apply_liveness_schedule(client, task_queue, settings.workers),
    )


async def _apply(
    client: Client, schedule_id: str, wanted: Schedule, input_type: type[Model]
) -> Outcome:
    try:
        await client.create_schedule(schedule_id, wanted)
        return "created"
    except ScheduleAlreadyRunningError:
        pass
    handle = client.get_schedule_handle(schedule_id)
    outcome: Outcome = "unchanged"

    async def update(current: ScheduleUpdateInput) -> ScheduleUpdate | None:
        nonlocal outcome
        schedule = current.description.schedule
        if await _matches(client, schedule, wanted, input_type):
            return None
        outcome = "updated"
        schedule.action, schedule.spec, schedule.policy = wanted.action, wanted.spec, wanted.policy
        return ScheduleUpdate(schedule=schedule)  # its state (paused, note) is kept

    await handle.update(update)
    return outcome


async def _matches(
    client: Client, current: Schedule, wanted: Schedule, input_type: type[Model]
) -> bool:
    action, goal = current.action, wanted.action
    if not isinstance(action, ScheduleActionStartWorkflow):
        return False
    assert isinstance(goal, ScheduleActionStartWorkflow)
    if (action.workflow, action.task_queue, action.execution_timeout) != (
        goal.workflow,
        goal.task_queue,
        goal.execution_timeout,
    ):
        return False
    if (
        [interval.every for interval in current.spec.intervals]
        != [interval.every for interval in wanted.spec.intervals]
        or current.spec.cron_expressions
        or current.spec.calendars
    ):
        return False
    if current.policy.overlap != wanted.policy.overlap or len(action.args) != 1:
        return False
    try:
        # Described actions carry their arguments as encoded payloads.
        [arg] = await client.data_converter.decode(list(action.args), [input_type])
    except Exception:  # an argument this version cannot read: replace it
        return False
    return arg == goal.args[0]


def describe(settings: Settings, outcome: Outcome) -> str:
    reconcile = settings.reconcile
    return (
        f"reconciler schedule {SCHEDULE_ID}: {outcome} (every {reconcile.every_seconds}s, "
        f"grace {reconcile.grace_seconds:g}s, task queue {settings.temporal.task_queue})"
    )


def describe_liveness(settings: Settings, outcome: Outcome) -> str:
    workers = settings.workers
    return (
        f"liveness schedule {LIVENESS_SCHEDULE_ID}: {outcome} (every "
        f"{workers.sweep_every_seconds}s, lost after {workers.lost_after_seconds:g}s, "
        f"task queue {settings.temporal.task_queue})"
    )
