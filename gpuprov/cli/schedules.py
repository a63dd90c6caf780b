"""`gpuprov schedules apply`: create or update the Temporal Schedules gpuprov needs (the orphan
reconciler's and the liveness sweep's; gpuprov/engine/schedules.py builds them)."""

from __future__ import annotations

import argparse

from gpuprov.cli.common import Commands
from gpuprov.config import Settings
from gpuprov.engine.schedules import (
    LIVENESS_SCHEDULE_ID,
    SCHEDULE_ID,
    apply_schedules,
    describe,
    describe_liveness,
)
from gpuprov.engine.worker import connect
from gpuprov.sdk.client import GpuprovError


def add_parser(commands: Commands) -> None:
    parser = commands.add_parser(
        "schedules",
        help="Temporal Schedules gpuprov needs (the orphan reconciler, the liveness sweep)",
    )
    actions = parser.add_subparsers(dest="schedules_command", required=True)
    actions.add_parser(
        "apply",
        help="create or update the reconciler's and the liveness sweep's Schedules (idempotent)",
        description=(
            f"Create the Schedule {SCHEDULE_ID} that runs the orphan reconciler every "
            f"[reconcile] every_seconds, and {LIVENESS_SCHEDULE_ID} that sweeps worker liveness "
            "every [workers] sweep_every_seconds, on the task queue; or update them to match "
            "the settings."
        ),
    )
    parser.set_defaults(handler=command)


async def command(settings: Settings, args: argparse.Namespace) -> int:
    try:
        client = await connect(settings.temporal, codec=settings.codec)
    except RuntimeError as error:
        address = settings.temporal.address
        raise GpuprovError(f"cannot reach Temporal at {address}: {error}") from None
    reconciler, liveness = await apply_schedules(client, settings)
    print(describe(settings, reconciler))
    print(describe_liveness(settings, liveness))
    return 0
