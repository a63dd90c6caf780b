"""`gpuprov cost [JOB [--run R]] [--team T] [--json]`: what jobs cost.

With `[client] api_key` (GPUPROV_CLIENT__API_KEY or GPUPROV_API_KEY) the report is the API's
(`GET /v1/cost?job=&run=&team=`; gpuprov/sdk/api_client.py) and the database is never opened;
without one it is read from gpuprov's database directly, whose schema must be at this
gpuprov's latest migration (gpuprov/store/schema.py). Either way it is one
`gpuprov.store.costs.CostReport`, rendered by gpuprov/cli/render.py or printed as JSON.
"""

from __future__ import annotations

import argparse

from gpuprov.cli.arguments import run_tag
from gpuprov.cli.common import EARLIER_RUN, Commands
from gpuprov.cli.render import cost_text
from gpuprov.config import ConfigError, Settings
from gpuprov.sdk.api_client import ApiClient
from gpuprov.store.costs import CostReport, cost_report
from gpuprov.store.schema import open_current


def add_parser(commands: Commands) -> None:
    cost = commands.add_parser(
        "cost",
        help="what jobs cost: hourly estimates and actual costs (per machine with a job)",
        description=(
            "Over the control-plane API where [client] api_key is set (GPUPROV_API_KEY), else "
            "from gpuprov's database: per job and provider, the hourly estimates of its "
            "attempts and the actual cost of its machines gone so far, per currency. With a "
            "job, each machine: provider, region, instance type, quote, launched, gone, billed "
            "seconds, amount, or why it has none (no quote, kept, not gone yet)."
        ),
    )
    cost.add_argument("job", nargs="?", help="one job: each of its machines as well")
    cost.add_argument("--json", action="store_true")
    cost.add_argument("--run", type=run_tag, help=f"with a job: {EARLIER_RUN}")
    cost.add_argument("--team", help="one team's jobs (over the API: and its budget)")
    cost.set_defaults(handler=_cost)


async def _cost(settings: Settings, args: argparse.Namespace) -> int:
    if args.run is not None and args.job is None:
        raise ConfigError("cost: --run needs a job")
    api = ApiClient.from_settings(settings)
    if api is not None:
        async with api:
            report = await api.cost(args.job, args.run, args.team)
    else:
        report = _from_database(settings, args)
    print(report.model_dump_json(indent=2) if args.json else cost_text(report))
    return 0


def _from_database(settings: Settings, args: argparse.Namespace) -> CostReport:
    """The same report from the database (with --team, that team's jobs; its budget is the
    API's to add)."""
    database = open_current(settings.database_url)
    try:
        return cost_report(database, args.job, args.run, args.team)
    finally:
        database.dispose()
