"""`gpuprov join --url U`: on a GPU box you own, probe it, register it with the control plane as
an existing worker (spending a join token) and leave its agent running (join_service.py)."""

from __future__ import annotations

import argparse
import asyncio
import os

from pydantic import ValidationError

from gpuprov.cli import join_service as service
from gpuprov.cli.arguments import bounded_int
from gpuprov.cli.common import Commands
from gpuprov.config import ConfigError, Settings
from gpuprov.models import WorkerCapabilities, capabilities_text, format_validation_error
from gpuprov.node.credentials import PACKAGE_STATE_DIR, keep_credential, prepare_state_dir
from gpuprov.node.errors import AgentError
from gpuprov.node.http_client import register as register_node
from gpuprov.node.join_token import TOKEN_ENV, read_token
from gpuprov.node.probe import probe as probe_node


def add_parser(commands: Commands) -> None:
    join = commands.add_parser(
        "join",
        help="register this GPU box as an existing worker",
        description=(
            "Probe this machine (nvidia-smi, CPUs, memory, disk) and register it with the "
            f"control plane. Pass the join token in ${TOKEN_ENV} or with --token-file: "
            "--token puts it on the command line, where `ps` shows it to every user."
        ),
    )
    join.add_argument("--url", required=True, help="the control-plane API, e.g. http://cp:8080")
    join.add_argument("--token-file", help="file holding the join token (preferred)")
    join.add_argument("--token", help=f"the join token (prefer ${TOKEN_ENV}/--token-file)")
    join.add_argument("--label-claim", help="the label you expect (the token's label wins)")
    join.add_argument(
        "--tries", type=bounded_int(1, 100), default=5, help="attempts while the API is down"
    )
    join.add_argument("--ca-file", help="pin the CA of the API's certificate (https)")
    join.add_argument(
        "--state-dir",
        default=PACKAGE_STATE_DIR,
        help=f"where this worker's credential is kept (default {PACKAGE_STATE_DIR})",
    )
    join.add_argument(
        "--service",
        choices=("auto", "systemd", "none"),
        default="auto",
        help="leave the agent running: a systemd unit (auto: where systemd runs and we are "
        "root), or none: print the command to run it in the foreground",
    )
    join.set_defaults(handler=_join)


async def _join(settings: Settings, args: argparse.Namespace) -> int:
    token = args.token.strip() if args.token else read_token(args.token_file)
    capabilities = await asyncio.to_thread(probe_node)
    try:
        checked = WorkerCapabilities.model_validate(capabilities)
    except ValidationError as error:
        raise AgentError(f"probe result invalid: {format_validation_error(error)}") from None
    identity = {"label": args.label_claim} if args.label_claim else None
    state_dir = os.path.expanduser(args.state_dir)
    prepare_state_dir(state_dir)  # before the token is spent
    try:  # the agent left running: fetched from the API and pinned, before the token is spent
        fetched = await asyncio.to_thread(service.fetch_agent, args.url, args.ca_file, state_dir)
    except service.ServiceError as error:
        raise ConfigError(f"not joined: {error}") from None
    response = await asyncio.to_thread(
        register_node,
        args.url,
        token,
        capabilities,
        identity,
        tries=args.tries,
        ca_file=args.ca_file,
    )
    shown = keep_credential(state_dir, response, args.url, capabilities)
    origin, label = response.get("origin"), response.get("label")
    print(f"joined: worker {response['worker_id']} ({origin}, label {label}), idle")
    if "credential_file" in shown:
        print(f"worker credential kept in {shown['credential_file']} (mode 0600)")
    print(capabilities_text(checked))
    try:
        running = await asyncio.to_thread(
            service.leave_running, state_dir, args.ca_file, fetched, args.service
        )
    except service.ServiceError as error:
        raise ConfigError(f"joined, but the agent is not running: {error}") from None
    for line in running.lines():
        print(line)
    return 0
