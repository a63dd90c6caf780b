"""`gpuprov team`: teams and their budgets (gpuprov/store/teams.py). Set-up, like `gpuprov apikey`:
it opens the database itself, where an admin runs it.

    gpuprov team create NAME [--monthly-budget USD] [--max-gpus N] [--on-exceed release|warn]
    gpuprov team set NAME [--monthly-budget USD|none] [--max-gpus N|none] [--on-exceed ...]
    gpuprov team list                 each team: limits, spend this month, GPUs held

A job names its team in its spec (`team:`, default `default`); an API key of a member or viewer
belongs to one (`gpuprov apikey create --role member --team NAME`). docs/teams.md.
"""

from __future__ import annotations

import argparse

from gpuprov.cli.common import Commands
from gpuprov.config import ConfigError, Settings
from gpuprov.models import TeamSpend
from gpuprov.store.db import ON_EXCEED, open_database
from gpuprov.store.teams import TeamNotFound, TeamRefused, Teams

UNSET = object()  # `team set` without the flag: the limit stays as it is


def _limit(kind: type[float] | type[int]) -> object:
    def parse(text: str) -> float | int | None:
        if text.strip().lower() == "none":
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number or none") from None

    return parse


def add_parser(commands: Commands) -> None:
    parser = commands.add_parser("team", help="teams: who jobs and keys belong to, and budgets")
    actions = parser.add_subparsers(dest="team_command", required=True)
    create = actions.add_parser("create", help="a new team")
    change = actions.add_parser("set", help="change a team's limits")
    for action, default in ((create, None), (change, UNSET)):
        action.add_argument("name")
        action.add_argument(
            "--monthly-budget",
            type=_limit(float),
            default=default,
            metavar="USD",
            help="its jobs' spend per calendar month (UTC); none: no limit",
        )
        action.add_argument(
            "--max-gpus",
            type=_limit(int),
            default=default,
            metavar="N",
            help="GPUs its jobs hold at once; none: no limit",
        )
        action.add_argument(
            "--on-exceed",
            choices=ON_EXCEED,
            help="a running job that takes the team past its budget: released, or warned",
        )
    actions.add_parser("list", help="every team: limits, spend this month, GPUs held")
    parser.set_defaults(handler=command)


def spend_lines(spends: list[TeamSpend]) -> str:
    if not spends:
        return "no teams"
    lines = [f"{'TEAM':20}  {'BUDGET/MONTH':>14}  {'SPENT':>12}  {'LEFT':>12}  {'GPUS':>11}  ON"]
    for spend in spends:
        budget = "-" if spend.monthly_budget_usd is None else f"{spend.monthly_budget_usd:.2f}"
        left = "-" if spend.left_usd is None else f"{spend.left_usd:.2f}"
        gpus = f"{spend.gpus_held}/" + ("-" if spend.max_gpus is None else str(spend.max_gpus))
        lines.append(
            f"{spend.team[:20]:20}  {budget:>14}  {spend.spent_usd:>12.2f}  {left:>12}  "
            f"{gpus:>11}  {spend.on_exceed}"
        )
    return "\n".join(lines)


async def command(settings: Settings, args: argparse.Namespace) -> int:
    database = open_database(settings.database_url)
    try:
        teams = Teams(database)
        try:
            if args.team_command == "create":
                row = teams.create(
                    args.name,
                    monthly_budget_usd=args.monthly_budget,
                    max_gpus=args.max_gpus,
                    on_exceed=args.on_exceed or "release",
                )
                print(f"team {row.name!r} created")
            elif args.team_command == "set":
                budget, gpus = args.monthly_budget, args.max_gpus
                row = teams.update(
                    args.name,
                    monthly_budget_usd=None if budget is UNSET else budget,
                    max_gpus=None if gpus is UNSET else gpus,
                    on_exceed=args.on_exceed,
                    clear_budget=budget is None,
                    clear_gpus=gpus is None,
                )
                print(f"team {row.name!r} changed")
            else:
                print(spend_lines([teams.spend(team.name) for team in teams.all()]))
        except TeamRefused as refused:
            raise ConfigError(f"--{refused.argument}: {refused}") from None
        except TeamNotFound as unknown:
            raise ConfigError(str(unknown)) from None
        return 0
    finally:
        database.dispose()
