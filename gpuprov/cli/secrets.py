"""`gpuprov secret`: the secrets vault, over the API (gpuprov/api/secrets.py), with an operator
API key (`[client]`): the value never passes through argv, a shell's history or Temporal.

    gpuprov secret set NAME [--team T] [--file F]   the value from F, else stdin (one trailing
                                                    newline dropped)
    gpuprov secret list [--team T]                  names, teams and dates: never values
    gpuprov secret delete NAME [--team T]

A member sets its own team's secrets (no --team needed); an admin without --team sets the
global ones, which every team's jobs see. A job refers to one in `env` as
`${{ secrets.NAME }}`: docs/secrets.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuprov.cli.arguments import bounded_text
from gpuprov.cli.common import Commands
from gpuprov.config import ConfigError, Settings
from gpuprov.models import read_bounded_text
from gpuprov.sdk.api_client import ApiClient
from gpuprov.store.secrets import MAX_VALUE_BYTES, SecretView


def add_parser(commands: Commands) -> None:
    parser = commands.add_parser(
        "secret", help="the secrets vault: values jobs refer to as ${{ secrets.NAME }}"
    )
    actions = parser.add_subparsers(dest="secret_command", required=True)
    setting = actions.add_parser(
        "set",
        help="store (or replace) a secret; its value from --file or stdin, never argv",
    )
    setting.add_argument("name")
    setting.add_argument("--file", type=Path, help="read the value from this file")
    listing = actions.add_parser("list", help="the secrets a team sees: names only")
    deleting = actions.add_parser("delete", help="forget a secret")
    deleting.add_argument("name")
    for action in (setting, listing, deleting):
        action.add_argument("--team", type=bounded_text(40), help="a team's (default: the key's)")
    parser.set_defaults(handler=command)


def _value(args: argparse.Namespace) -> str:
    if args.file is not None:
        try:
            text = read_bounded_text(args.file, MAX_VALUE_BYTES + 2)
        except OSError as error:
            raise ConfigError(f"--file: cannot read {args.file}: {error.strerror}") from None
    else:
        if sys.stdin.isatty():
            print("the secret's value, then Ctrl-D:", file=sys.stderr)
        text = sys.stdin.read(MAX_VALUE_BYTES + 2)
    return text[:-1] if text.endswith("\n") else text


def names_text(secrets: list[SecretView]) -> str:
    if not secrets:
        return "no secrets"
    lines = [f"{'NAME':32}  {'TEAM':20}  UPDATED"]
    for secret in secrets:
        team = secret.team or "(global)"
        updated = secret.updated_at.isoformat(timespec="seconds")
        lines.append(f"{secret.name[:32]:32}  {team[:20]:20}  {updated}")
    return "\n".join(lines)


async def command(settings: Settings, args: argparse.Namespace) -> int:
    client = ApiClient.from_settings(settings)
    if client is None:
        raise ConfigError(
            "gpuprov secret talks to the API: set [client] api_key (or GPUPROV_API_KEY) to an "
            "operator API key, and [client] api_url where the API is not "
            f"{settings.client_api_url}"
        )
    async with client:
        if args.secret_command == "set":
            row = await client.set_secret(args.name, _value(args), args.team)
            where = f"team {row.team!r}" if row.team else "every team (global)"
            print(f"secret {row.name!r} stored for {where}")
        elif args.secret_command == "list":
            print(names_text(await client.secret_names(args.team)))
        else:
            await client.delete_secret(args.name, args.team)
            print(f"secret {args.name!r} deleted")
    return 0
