"""The `gpuprov` command line, built on gpuprov.sdk.client.

    gpuprov demo                      the whole story on the fake cloud, then a clean shutdown
    gpuprov demo-ssh                  a job bootstrapped over real SSH (a loopback sshd; root)
    gpuprov dev                       Temporal dev server + UI + worker, until Ctrl-C
    gpuprov submit job.yaml [--wait]  start a job (workflow id job-<name>)
    gpuprov status NAME [--run R] | list | release NAME | cancel NAME | offers --gpu H100
    gpuprov health NAME               verdict per machine of a job (or one VM): diagnosis + SSH
    gpuprov logs NAME [--node N] [--follow] [--run R]  a job's output, each line after its
                                      node's rank
    gpuprov api                       the control-plane API (nodes register here)
    gpuprov setup                     once per cluster: migrations, namespace, search attributes,
                                      the reconciler's and the liveness sweep's Schedules
    gpuprov schedules apply           create or update those Schedules (idempotent)
    gpuprov orphans [--all]           machines the reconciler is (or was) cleaning up, and
                                      those whose job is stuck or whose owner is unknown
    gpuprov end NAME [--yes]          end a stuck job: terminate it, delete its machines
    gpuprov cost [JOB [--run R]] [--json]  per job and provider: hourly estimate and actual
                                      cost; with JOB, each machine: quote, launched, gone, billed
A name submitted again is a new run of it: status, logs and cost show its latest run, and an
earlier one with --run (the run `gpuprov status` shows).
    gpuprov workers [drain|undrain|remove ID]  registered machines: liveness, health, drain
    gpuprov token create --label L    a single-use join token for a box you own
    gpuprov join --url U              on that box: register it as an existing worker and leave
                                      its agent running (a systemd service where it can)
    gpuprov apikey create|list|revoke operator API keys for the control-plane API (a role, a team)
    gpuprov team create|set|list      teams and their budgets (monthly spend, GPUs held at once)
    gpuprov secret set|list|delete    the secrets vault, over the API: ${{ secrets.NAME }} in env
    gpuprov codec-server              decrypts payloads for the Temporal UI ([codec] keys)
Connection settings come from gpuprov.toml (--config or GPUPROV_CONFIG) and the environment
(GPUPROV_TEMPORAL__ADDRESS, default localhost:7233); --address overrides both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from types import ModuleType
from typing import NoReturn

from sqlalchemy.exc import DBAPIError
from temporalio.service import RPCError

from gpuprov.cli import (
    apikeys,
    codec_server,
    cost,
    demo,
    demo_ssh,
    dev,
    end,
    jobs,
    join,
    logs,
    offers,
    orphans,
    schedules,
    secrets,
    serve_api,
    setup,
    teams,
    token,
    workers,
)
from gpuprov.cli.arguments import Parser
from gpuprov.config import ConfigError, Settings, check_address, load_settings
from gpuprov.models import JobSpecError
from gpuprov.node.errors import AgentError
from gpuprov.sdk.client import GpuprovError
from gpuprov.store.db import DatabaseUnavailable, unavailable
from gpuprov.store.runs import RunNotFound

# Every command group, in the order `gpuprov --help` lists them. Each is one module whose
# `add_parser(commands)` adds its commands with their flags and registers each one's handler:
# `handler` (async, given the settings) or, for a command that brings its own stack and
# settings (the demos), `standalone` (given only the flags).
COMMAND_GROUPS: tuple[ModuleType, ...] = (
    demo,
    demo_ssh,
    dev,
    jobs,  # submit, status, release, cancel, list, health
    logs,
    offers,
    serve_api,  # api
    setup,
    schedules,
    orphans,
    end,
    cost,
    token,
    join,
    apikeys,  # apikey
    teams,  # team
    secrets,  # secret
    workers,
    codec_server,  # codec-server
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gpuprov", description="GPU provisioning on Temporal")
    parser.add_argument("--config", help="path to gpuprov.toml (default: $GPUPROV_CONFIG)")
    parser.add_argument("--address", help="Temporal frontend host:port")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.add_parser(commands)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    settings = load_settings(args.config)
    if args.address:
        try:
            check_address(args.address)
        except ValueError as error:
            raise ConfigError(f"--address: {error}") from None
        temporal = settings.temporal.model_copy(update={"address": args.address})
        settings = settings.model_copy(update={"temporal": temporal})
    return settings


# Errors a user can act on: each is printed as one line, `error: ...`, with exit code 2.
USER_ERRORS = (
    JobSpecError,
    RunNotFound,
    ConfigError,
    GpuprovError,
    DatabaseUnavailable,
    TimeoutError,
    AgentError,
)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings: Settings | None = None
    try:
        standalone = getattr(args, "standalone", None)
        if standalone is not None:
            return standalone(args)
        settings = _settings(args)
        with contextlib.suppress(KeyboardInterrupt):
            return asyncio.run(args.handler(settings, args))
        return 130
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RPCError as error:  # a call the Temporal server refused that no command expected
        print(f"error: Temporal refused the call: {error.message}", file=sys.stderr)
        return 2
    except DBAPIError as error:
        if settings is None:
            raise
        # The database went away under a command that had opened it: one line, naming it
        # with its password masked, never a driver's traceback.
        print(f"error: {unavailable(settings.database_url, error)}", file=sys.stderr)
        return 2


def _quiet_broken_pipe() -> None:
    """The reader of stdout went away (`gpuprov list | head`): nothing left to say to it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def entry() -> NoReturn:
    """Console-script entry: run, flush, and skip interpreter finalization.

    The Temporal client's Rust threads can outlive the event loop and crash CPython's
    finalization ("PyGILState_Release ... must be current", temporalio/sdk-python#300), which
    turned a successful command into exit -11 now and then. Nothing is left to clean up here.
    """
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_broken_pipe()
        code = 0
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
