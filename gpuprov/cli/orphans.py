"""`gpuprov orphans [--all]`: machines the reconciler is (or was) cleaning up, from the
database, and those whose job is stuck or whose owner is unknown, from Temporal."""

from __future__ import annotations

import argparse

from gpuprov.cli.common import Commands, client_for
from gpuprov.cli.render import orphans_text, unheld_text
from gpuprov.config import Settings
from gpuprov.engine.worker import open_records
from gpuprov.sdk import owners
from gpuprov.sdk.client import GpuprovError


def add_parser(commands: Commands) -> None:
    orphans = commands.add_parser(
        "orphans",
        help="possible orphans, and machines whose job is stuck or whose owner is unknown",
    )
    orphans.add_argument("--all", action="store_true", help="resolved ones too")
    orphans.set_defaults(handler=_orphans)


async def _orphans(settings: Settings, args: argparse.Namespace) -> int:
    records = open_records(settings.database_url)
    try:
        orphans = records.orphans(include_resolved=args.all)
        unfinished = records.unfinished_vms()
    finally:
        records.db.dispose()
    print(orphans_text(orphans, include_resolved=args.all))
    by_job = await _situations(settings, {row.job for row in unfinished})
    print(unheld_text(owners.unheld_machines(unfinished, by_job)))
    return 0


async def _situations(settings: Settings, jobs: set[str]) -> dict[str, owners.JobSituation]:
    """What Temporal says about each job; "owner unknown" for all when it cannot be reached."""
    if not jobs:
        return {}
    try:
        client = await client_for(settings)
    except GpuprovError as error:
        return owners.unreachable(jobs, str(error))
    return await owners.situations(client.temporal, jobs)
