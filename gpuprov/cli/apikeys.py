"""`gpuprov apikey`: operator API keys for the control-plane API (gpuprov/store/credentials.py).

    gpuprov apikey create --name NAME [--role R --team T]   a new key on stdout, alone, once
    gpuprov apikey list [--all]         id, name, role, team, created (and revoked, with --all)
    gpuprov apikey revoke ID|NAME       that key, or every live key of that name

The database keeps only each key's SHA-256: a lost key cannot be shown again, only replaced.
Rotation is create, deploy the new key, revoke the old one (docs/operations.md). A key is an
`admin` (every team; the default, as keys were before roles), a `member` (submits, releases and
cancels its team's jobs, reads its team) or a `viewer` (reads its team): docs/teams.md. Like
`gpuprov team`, this is set-up: it opens the database itself.
"""

from __future__ import annotations

import argparse
import sys

from gpuprov.config import ConfigError, Settings
from gpuprov.store.credentials import Credentials, KeyRefused
from gpuprov.store.db import ROLES, OperatorKey, open_database


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("apikey", help="operator API keys for the control-plane API")
    actions = parser.add_subparsers(dest="apikey_command", required=True)
    create = actions.add_parser(
        "create",
        help="mint a key (shown once)",
        description="Mint an operator API key and print it alone on stdout; only its SHA-256 "
        "is stored. Callers send it as `Authorization: Bearer <key>`.",
    )
    create.add_argument("--name", required=True, help="who or what uses it, e.g. ci-deployer")
    create.add_argument(
        "--role",
        choices=ROLES,
        default="admin",
        help="admin: everything, every team; member: its team's jobs; viewer: reads its team",
    )
    create.add_argument("--team", help="the team a member's or viewer's key belongs to")
    listing = actions.add_parser("list", help="the keys (never their secrets)")
    listing.add_argument("--all", action="store_true", help="revoked keys too")
    revoke = actions.add_parser("revoke", help="revoke a key by id, or every live key by name")
    revoke.add_argument("key", metavar="ID|NAME")
    parser.set_defaults(handler=command)


def _rows(keys: list[OperatorKey], include_revoked: bool) -> str:
    if not keys:
        return "no operator API keys" + ("" if include_revoked else " (live)")
    header = f"{'ID':32}  {'NAME':24}  {'ROLE':6}  {'TEAM':16}  {'CREATED':25}"
    lines = [header + ("  REVOKED" if include_revoked else "")]
    for key in keys:
        created = key.created_at.isoformat(timespec="seconds")
        team = key.team or "(all)"
        line = f"{key.id:32}  {key.name[:24]:24}  {key.role:6}  {team[:16]:16}  {created:25}"
        if include_revoked:
            line += "  " + (key.revoked_at.isoformat(timespec="seconds") if key.revoked_at else "-")
        lines.append(line)
    return "\n".join(lines)


async def command(settings: Settings, args: argparse.Namespace) -> int:
    database = open_database(settings.database_url)
    try:
        credentials = Credentials(database)
        if args.apikey_command == "create":
            try:
                row, key = credentials.create_operator_key(
                    args.name, role=args.role, team=args.team
                )
            except KeyRefused as error:
                raise ConfigError(f"--{error.argument}: {error}") from None
            # stdout is the key alone (`gpuprov apikey create --name x > key`); the rest stderr.
            print(key)
            where = f"team {row.team!r}" if row.team else "every team"
            print(
                f"operator API key {row.name!r} (id {row.id}, {row.role}, {where}), shown only "
                "now; callers send "
                "`Authorization: Bearer <key>`. Revoke it with: gpuprov apikey revoke " + row.id,
                file=sys.stderr,
            )
            return 0
        if args.apikey_command == "list":
            print(_rows(credentials.operator_keys(include_revoked=args.all), args.all))
            return 0
        revoked = credentials.revoke_operator_keys(args.key)
        if not revoked:
            raise ConfigError(f"no live operator API key has the id or name {args.key!r}")
        for row in revoked:
            print(f"revoked {row.id} ({row.name})")
        return 0
    finally:
        database.dispose()
