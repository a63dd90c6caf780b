"""`gpuprov token create --label L [--ttl S]`: a single-use join token for a machine you own
(`gpuprov join` on it spends the token); the database keeps only its SHA-256."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

from gpuprov.cli.arguments import bounded_int, bounded_text
from gpuprov.cli.common import Commands
from gpuprov.config import MAX_JOIN_TOKEN_TTL_SECONDS, Settings
from gpuprov.engine.worker import open_records
from gpuprov.node.join_token import TOKEN_ENV


def add_parser(commands: Commands) -> None:
    token = commands.add_parser("token", help="join tokens for machines you own")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    create = token_commands.add_parser("create", help="mint a single-use join token (shown once)")
    create.add_argument(
        "--label",
        required=True,
        type=bounded_text(128),
        help="the reservation label of the worker",
    )
    create.add_argument(
        "--ttl",
        type=bounded_int(1, MAX_JOIN_TOKEN_TTL_SECONDS, "seconds"),
        help="seconds until it expires (default from config; at most 7 days)",
    )
    token.set_defaults(handler=_token)


async def _token(settings: Settings, args: argparse.Namespace) -> int:
    # Both bounded: --ttl by its parser, the default by [jobs] join_token_ttl_seconds.
    ttl = args.ttl if args.ttl is not None else settings.jobs.join_token_ttl_seconds
    records = open_records(settings.database_url)
    try:
        token = records.mint_token(label=args.label, ttl=timedelta(seconds=ttl))
    finally:
        records.db.dispose()
    # The plaintext exists only here: the database keeps its SHA-256. stdout is the token alone,
    # so `gpuprov token create --label x > token` works; the hint goes to stderr.
    print(token)
    print(
        f"single-use join token for label {args.label!r}, valid {ttl}s, shown only now. "
        f"On the GPU box: gpuprov join --url {settings.api.url} --token-file FILE "
        f"(or ${TOKEN_ENV}; both keep it out of `ps`)",
        file=sys.stderr,
    )
    return 0
