"""The reconciler's Temporal Schedule, "gpuprov-reconcile": one `Reconcile` pass every
`[reconcile] every_seconds` (5 minutes by default) on the worker's task queue; a pass still
running when the next is due makes that one skip (overlap policy SKIP).

`apply_reconcile_schedule` is idempotent: it creates the Schedule, updates it when the interval,
grace period, task queue or workflow differ, and otherwise changes nothing. An update keeps the
Schedule's state, so one an operator paused stays paused. Called by `gpuprov setup`,
`gpuprov schedules apply` and `gpuprov dev`.
"""

from __future__ import annotations

import argparse
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

from gpuprov.client import GpuprovError
from gpuprov.config import ReconcileSettings, Settings
from gpuprov.engine import connect
from workflows.reconcile import Reconcile, ReconcileInput

SCHEDULE_ID = "gpuprov-reconcile"
WORKFLOW_ID = "gpuprov-reconcile"  # Temporal appends each run's scheduled time
# A pass is bounded: a stuck one must not hold every later pass back (SKIP) for long.
PASS_TIMEOUT = timedelta(hours=1)

Outcome = Literal["created", "updated", "unchanged"]


def reconcile_schedule(task_queue: str, settings: ReconcileSettings) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            Reconcile.run,
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


async def apply_reconcile_schedule(
    client: Client, task_queue: str, settings: ReconcileSettings | None = None
) -> Outcome:
    """Create or update the Schedule so that it matches `settings`; says which it did."""
    settings = settings or ReconcileSettings()
    wanted = reconcile_schedule(task_queue, settings)
    try:
        await client.create_schedule(SCHEDULE_ID, wanted)
        return "created"
    except ScheduleAlreadyRunningError:
        pass
    handle = client.get_schedule_handle(SCHEDULE_ID)
    outcome: Outcome = "unchanged"

    async def update(current: ScheduleUpdateInput) -> ScheduleUpdate | None:
        nonlocal outcome
        schedule = current.description.schedule
        if await _matches(client, schedule, wanted):
            return None
        outcome = "updated"
        schedule.action, schedule.spec, schedule.policy = wanted.action, wanted.spec, wanted.policy
        return ScheduleUpdate(schedule=schedule)  # its state (paused, note) is kept

    await handle.update(update)
    return outcome


async def _matches(client: Client, current: Schedule, wanted: Schedule) -> bool:
    action, goal = current.action, wanted.action
    if not isinstance(action, ScheduleActionStartWorkflow):
        return False
    assert isinstance(goal, ScheduleActionStartWorkflow)
    if (action.workflow, action.task_queue, action.execution_timeout) != (
        "Reconcile",
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
        [arg] = await client.data_converter.decode(list(action.args), [ReconcileInput])
    except Exception:  # an argument this version cannot read: replace it
        return False
    return arg == goal.args[0]


# ---------------------------------------------------------------- `gpuprov schedules apply`


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "schedules",
        help="Temporal Schedules gpuprov needs (the orphan reconciler)",
    )
    actions = parser.add_subparsers(dest="schedules_command", required=True)
    actions.add_parser(
        "apply",
        help="create or update the reconciler's Schedule (idempotent)",
        description=(
            f"Create the Schedule {SCHEDULE_ID} that runs the orphan reconciler every "
            "[reconcile] every_seconds on the task queue, or update it to match the settings."
        ),
    )


def describe(settings: Settings, outcome: Outcome) -> str:
    reconcile = settings.reconcile
    return (
        f"reconciler schedule {SCHEDULE_ID}: {outcome} (every {reconcile.every_seconds}s, "
        f"grace {reconcile.grace_seconds:g}s, task queue {settings.temporal.task_queue})"
    )


async def command(settings: Settings, args: argparse.Namespace) -> int:
    try:
        client = await connect(settings.temporal, codec=settings.codec)
    except RuntimeError as error:
        address = settings.temporal.address
        raise GpuprovError(f"cannot reach Temporal at {address}: {error}") from None
    task_queue = settings.temporal.task_queue
    outcome = await apply_reconcile_schedule(client, task_queue, settings.reconcile)
    print(describe(settings, outcome))
    return 0
