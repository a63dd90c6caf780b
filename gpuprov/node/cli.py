"""The agent's command line: `probe`, `register`, `run`, `whoami` and `supervise`, parsed and
dispatched; every other module does the work. Exit 0 on success (and after a revoked
credential), 1 for what retrying may fix (the API unreachable), 2 for a refusal for good.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal

from .credentials import default_state_dir, keep_credential, prepare_state_dir, read_credential
from .errors import AgentError
from .heartbeat import Stopped, run, stop_on_sigterm
from .http_client import call_api, register
from .join_token import URL_ENV, read_join_secret
from .probe import LIBCUDA, capabilities_of, check_gpu_runtime
from .smi import SMI_TIMEOUT
from .supervisor import supervise

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuprov-agent", description="gpuprov node agent")
    commands = parser.add_subparsers(dest="command", required=True)
    probe_command = commands.add_parser("probe", help="print this machine's capabilities as JSON")
    reg = commands.add_parser(
        "register",
        help="probe, then register with the join token from stdin, --token-fd or --token-file",
    )
    daemon = commands.add_parser(
        "run",
        help="register once (unless a credential is kept), then heartbeat until revoked",
    )
    daemon.add_argument("--url", help=f"the API (default: {URL_ENV}= in FILE, or worker.json)")
    daemon_source = daemon.add_mutually_exclusive_group()
    daemon_source.add_argument("--token-file", help="file with the token, or an env file (0600)")
    daemon_source.add_argument("--token-fd", type=int, metavar="N", help="read the token from fd N")
    daemon.add_argument(
        "--delete-token-file", action="store_true", help="remove it once registered"
    )
    daemon.add_argument(
        "--notices",
        choices=("none", "ec2", "gce"),
        default="none",
        help="watch this cloud's instance metadata for reclaim and maintenance notices",
    )
    daemon.add_argument("--metadata-url", help=argparse.SUPPRESS)  # tests: a loopback server
    for command in (probe_command, reg, daemon):
        command.add_argument("--disk-path", default="/", help="filesystem reported as disk_gb")
        command.add_argument("--smi-timeout", type=float, default=SMI_TIMEOUT, metavar="SECONDS")
        command.add_argument(
            "--libcuda", default=LIBCUDA, help="library for the CUDA init check; 'none' skips it"
        )
    reg.add_argument("--url", help=f"the API, e.g. http://10.0.0.1:8080 (or {URL_ENV}= in FILE)")
    source = reg.add_mutually_exclusive_group()
    source.add_argument("--token-file", help="file with the token, or an env file (mode 0600)")
    source.add_argument("--token-fd", type=int, metavar="N", help="read the token from fd N")
    source.add_argument("--token", help=argparse.SUPPRESS)  # refused: see main()
    reg.add_argument("--delete-token-file", action="store_true", help="remove it once read")
    reg.add_argument("--tries", type=int, default=10, help="attempts while the API is down")
    supervisor = commands.add_parser("supervise", help="(started by `run`) lead a work's group")
    supervisor.add_argument("work_dir")
    whoami = commands.add_parser("whoami", help="ask the API about this worker (its credential)")
    whoami.add_argument("--url", required=True, help="the API, e.g. https://10.0.0.1:8080")
    whoami.add_argument("--tries", type=int, default=3, help="attempts while the API is down")
    for command in (reg, whoami, daemon):
        command.add_argument("--ca-file", help="pin the CA of the API's certificate (https)")
        command.add_argument(
            "--state-dir",
            help="where the worker credential is kept (default: agent.pyz's directory)",
        )
    return parser


def main(argv: list | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "supervise":
        return supervise(args.work_dir)
    logging.basicConfig(level=logging.INFO, format="gpuprov-agent: %(message)s")
    try:
        if args.command == "whoami":
            credential = read_credential(args.state_dir or default_state_dir())
            print(json.dumps(call_api(args.url, "/v1/workers/me", None, credential,
                                      args.ca_file, args.tries), indent=2))  # fmt: skip
            return 0
        libcuda = "" if args.libcuda.lower() == "none" else args.libcuda
        if args.command == "run":
            args.libcuda = libcuda
            signal.signal(signal.SIGTERM, stop_on_sigterm)
            return run(args)
        if args.command == "register":
            if args.token is not None:  # already exposed in ps and shell history: do not use it
                raise AgentError(
                    "--token is not accepted: the command line is visible to every user in ps. "
                    "Mint a new token and pipe it on stdin (or use --token-file)"
                )
            # First: a missing token fails before the probe, and the environment is scrubbed
            # of $GPUPROV_JOIN_TOKEN before anything is started.
            secret = read_join_secret(args.token_file, args.token_fd, args.delete_token_file)
            url = args.url or secret.api_url
            if not url:
                raise AgentError(f"no API URL: pass --url (or {URL_ENV}= in the token file)")
            state_dir = args.state_dir or default_state_dir()
            prepare_state_dir(state_dir)
        runtime = check_gpu_runtime(args.smi_timeout, libcuda)
        log.info("GPU runtime: %s: %s", runtime.verdict, runtime.message or "GPUs usable")
        capabilities = capabilities_of(runtime, args.disk_path)
        if args.command == "probe":
            print(json.dumps(capabilities, indent=2))
            return 0
        identity = {"vm": secret.vm[:128]} if secret.vm else None  # logged by the API if wrong
        response = register(
            url, secret.token, capabilities, identity, tries=args.tries, ca_file=args.ca_file
        )
        response = keep_credential(state_dir, response, url, capabilities)
    except AgentError as error:
        log.error("%s", error)
        return 1 if error.transient else 2
    except (Stopped, KeyboardInterrupt):
        log.info("stopped")
        return 0
    print(json.dumps(response, indent=2))
    return 0
