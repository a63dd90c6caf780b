"""`gpuprov cost [JOB [--run R]] [--json]`: what jobs cost, read from gpuprov's database."""

from __future__ import annotations

import argparse

from gpuprov.cli.arguments import run_tag
from gpuprov.cli.common import EARLIER_RUN, Commands
from gpuprov.cli.render import cost_text
from gpuprov.config import ConfigError, Settings
from gpuprov.engine.worker import open_records
from gpuprov.store.costs import cost_report


def add_parser(commands: Commands) -> None:
    cost = commands.add_parser(
        "cost",
        help="what jobs cost: hourly estimates and actual costs (per machine with a job)",
        description=(
            "Read from gpuprov's database: per job and provider, the hourly estimates of its "
            "attempts and the actual cost of its machines gone so far, per currency. With a "
            "job, each machine: provider, region, instance type, quote, launched, gone, billed "
            "seconds, amount, or why it has none (no quote, kept, not gone yet)."
        ),
    )
    cost.add_argument("job", nargs="?", help="one job: each of its machines as well")
    cost.add_argument("--json", action="store_true")
    cost.add_argument("--run", type=run_tag, help=f"with a job: {EARLIER_RUN}")
    cost.set_defaults(handler=_cost)


async def _cost(settings: Settings, args: argparse.Namespace) -> int:
    records = open_records(settings.database_url)
    try:
        if args.run is not None and args.job is None:
            raise ConfigError("cost: --run needs a job")
        report = cost_report(records.db, args.job, args.run)
    finally:
        records.db.dispose()
    print(report.model_dump_json(indent=2) if args.json else cost_text(report))
    return 0
