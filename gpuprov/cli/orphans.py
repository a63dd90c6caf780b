"""`gpuprov orphans [--all]`: machines the reconciler is (or was) cleaning up, and those whose
job is stuck or whose owner is unknown.

The rows (possible orphans, and the unfinished VM rows) come over the control-plane API with
`[client] api_key` (GPUPROV_CLIENT__API_KEY or GPUPROV_API_KEY; `GET /v1/orphans[?all=true]`, an
admin's key; gpuprov/sdk/api_client.py), never opening the database; without one from gpuprov's
database directly, whose schema must be at this gpuprov's latest migration
(gpuprov/store/schema.py). Either way they are one `gpuprov.store.orphans.OrphansReport`, and
what each job's situation is (stuck, ended, owner unknown) is asked of Temporal here.
"""

from __future__ import annotations

import argparse

from gpuprov.cli.common import Commands, client_for
from gpuprov.cli.render import orphans_text, unheld_text
from gpuprov.config import Settings
from gpuprov.sdk import owners
from gpuprov.sdk.api_client import ApiClient
from gpuprov.sdk.client import GpuprovError
from gpuprov.store.orphans import OrphansReport, orphans_report
from gpuprov.store.records import Records
from gpuprov.store.schema import open_current


def add_parser(commands: Commands) -> None:
    orphans = commands.add_parser(
        "orphans",
        help="possible orphans, and machines whose job is stuck or whose owner is unknown",
        description=(
            "The rows over the control-plane API where [client] api_key is set (an admin's "
            "key; GPUPROV_API_KEY), else from gpuprov's database; the jobs' situations from "
            "Temporal."
        ),
    )
    orphans.add_argument("--all", action="store_true", help="resolved ones too")
    orphans.set_defaults(handler=_orphans)


async def _orphans(settings: Settings, args: argparse.Namespace) -> int:
    api = ApiClient.from_settings(settings)
    if api is not None:
        async with api:
            report = await api.orphans(include_resolved=args.all)
    else:
        report = _from_database(settings, include_resolved=args.all)
    orphans, unfinished = report.rows()
    print(orphans_text(orphans, include_resolved=args.all))
    by_job = await _situations(settings, {row.job for row in unfinished})
    print(unheld_text(owners.unheld_machines(unfinished, by_job)))
    return 0


def _from_database(settings: Settings, *, include_resolved: bool) -> OrphansReport:
    database = open_current(settings.database_url)
    try:
        return orphans_report(Records(database), include_resolved=include_resolved)
    finally:
        database.dispose()


async def _situations(settings: Settings, jobs: set[str]) -> dict[str, owners.JobSituation]:
    """What Temporal says about each job; "owner unknown" for all when it cannot be reached."""
    if not jobs:
        return {}
    try:
        client = await client_for(settings)
    except GpuprovError as error:
        return owners.unreachable(jobs, str(error))
    return await owners.situations(client.temporal, jobs)
