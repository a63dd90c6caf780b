"""The `gpuprov` command line, built on gpuprov.client.

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
    gpuprov apikey create|list|revoke operator API keys for the control-plane API
    gpuprov codec-server              decrypts payloads for the Temporal UI ([codec] keys)
Connection settings come from gpuprov.toml (--config or GPUPROV_CONFIG) and the environment
(GPUPROV_TEMPORAL__ADDRESS, default localhost:7233); --address overrides both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import NoReturn

from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from temporalio.service import RPCError

from gpuprov import apikeys, owners, schedules, service, workers_cli
from gpuprov import demo as demo_module
from gpuprov import end as end_command
from gpuprov import setup as cluster_setup
from gpuprov.api import create_app, serving
from gpuprov.arguments import (
    Parser,
    bounded_float,
    bounded_int,
    bounded_text,
    job_name,
    job_or_machine_name,
    run_tag,
)
from gpuprov.client import GpuprovClient, GpuprovError, JobNotFound
from gpuprov.codec import codec_for
from gpuprov.codec_server import create_codec_app, endpoint_url, ui_origins
from gpuprov.config import (
    MAX_JOIN_TOKEN_TTL_SECONDS,
    ConfigError,
    Settings,
    check_address,
    load_settings,
)
from gpuprov.connection import connect_temporal
from gpuprov.costs import cost_report
from gpuprov.db import DatabaseUnavailable, unavailable
from gpuprov.dev import dev_stack, with_default_cloud
from gpuprov.engine import open_records, open_records_patiently
from gpuprov.logs import prefixed, read_lines
from gpuprov.models import (
    MAX_GPU_NAME_LENGTH,
    MAX_HOURLY_COST,
    MAX_IMAGE_LENGTH,
    MAX_PORTS,
    MAX_REGION_LENGTH,
    JobSpecError,
    JobState,
    WorkerCapabilities,
    format_validation_error,
    load_job_spec,
)
from gpuprov.node.credentials import PACKAGE_STATE_DIR, keep_credential, prepare_state_dir
from gpuprov.node.errors import AgentError
from gpuprov.node.http_client import register as register_node
from gpuprov.node.join_token import TOKEN_ENV, read_token
from gpuprov.node.probe import probe as probe_node
from gpuprov.render import (
    capabilities_text,
    cost_text,
    health_text,
    offers_text,
    orphans_text,
    progress_line,
    status_text,
    unheld_text,
    whole_provider_refusals,
)
from gpuprov.runs import RunNotFound
from providers import PROVIDER_IDS
from providers.base import ResourceRequest, Verdict
from workflows.offers import OffersQuery

EARLIER_RUN = "an earlier run of the name (as `gpuprov status` shows it); default: the latest"


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gpuprov", description="GPU provisioning on Temporal")
    parser.add_argument("--config", help="path to gpuprov.toml (default: $GPUPROV_CONFIG)")
    parser.add_argument("--address", help="Temporal frontend host:port")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the fake-cloud failover story end to end")
    demo.add_argument("--hold", action="store_true", help="keep the UI up until Enter")
    demo_ssh = commands.add_parser(
        "demo-ssh", help="a job bootstrapped over real SSH on this machine (a loopback sshd)"
    )
    demo_ssh.add_argument("--hold", action="store_true", help="keep the UI and sshd up until Enter")
    commands.add_parser("dev", help="dev server + UI + worker, until Ctrl-C")
    submit = commands.add_parser("submit", help="submit a job spec (TOML or YAML)")
    submit.add_argument("file")
    submit.add_argument(
        "--wait",
        action="store_true",
        help="follow the job until ready (a lease) or until it ends (a job with run)",
    )
    for name, text in (
        ("status", "show a job"),
        ("release", "release a ready job"),
        ("cancel", "cancel a job (its instances are torn down)"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("name", type=job_name)
    status = commands.choices["status"]
    status.add_argument("--json", action="store_true")
    status.add_argument("--run", type=run_tag, help=EARLIER_RUN)
    listing = commands.add_parser("list", help="list jobs")
    listing.add_argument("--state", choices=[s.value for s in JobState])
    listing.add_argument("--provider", choices=PROVIDER_IDS)
    health = commands.add_parser(
        "health", help="health of a job's machines or of one machine (gone/unhealthy/...)"
    )
    health.add_argument(
        "name",
        type=job_or_machine_name,
        help="a job name, or a VM name such as train-7b-a1-n0-ce4389",
    )
    health.add_argument("--json", action="store_true")
    logs = commands.add_parser(
        "logs",
        help="a job's output, each line after its node's rank",
        description=(
            "Read from gpuprov's database: what the job's nodes printed, each node's lines in "
            "order, prefixed by its rank ([1] ...; after a restart [1 r2] ...). Their stdout "
            "goes to stdout, their stderr and gpuprov's notes to stderr. With --follow, read "
            "on while the job runs, and stop once it has ended."
        ),
    )
    logs.add_argument("name", type=job_name)
    logs.add_argument("--node", type=bounded_int(0, 1023), help="only this rank's output")
    logs.add_argument("--follow", "-f", action="store_true", help="until the job ends")
    logs.add_argument("--run", type=run_tag, help=EARLIER_RUN)
    offers = commands.add_parser("offers", help="offers a job would try, cheapest first")
    # The same bounds as a job spec's fields (gpuprov/models.py).
    offers.add_argument("--gpu", type=bounded_text(MAX_GPU_NAME_LENGTH))
    offers.add_argument("--gpus-per-node", type=bounded_int(0, 64), default=1)
    offers.add_argument("--nodes", type=bounded_int(1, 256), default=1)
    offers.add_argument("--spot", action="store_true")
    offers.add_argument("--max-hourly-cost", type=bounded_float(0, MAX_HOURLY_COST, above=True))
    offers.add_argument("--provider", action="append", dest="providers", choices=PROVIDER_IDS)
    offers.add_argument(
        "--region", action="append", dest="regions", type=bounded_text(MAX_REGION_LENGTH)
    )
    # A job's image and ports: clouds that cannot honour them are refused, and say so.
    offers.add_argument("--image", type=bounded_text(MAX_IMAGE_LENGTH))
    offers.add_argument(
        "--port", action="append", dest="ports", type=bounded_int(1, 65535), default=[]
    )
    commands.add_parser("api", help="run the control-plane API until Ctrl-C")
    cluster_setup.add_parser(commands)
    schedules.add_parser(commands)
    orphans = commands.add_parser(
        "orphans",
        help="possible orphans, and machines whose job is stuck or whose owner is unknown",
    )
    orphans.add_argument("--all", action="store_true", help="resolved ones too")
    end_command.add_parser(commands)
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
    apikeys.add_parser(commands)
    workers_cli.add_parser(commands)
    commands.add_parser(
        "codec-server",
        help="serve /encode and /decode so the Temporal UI shows encrypted payloads",
        description=(
            "Run the remote codec server for the Temporal UI on [codec] host:port (default "
            "127.0.0.1:8081); start the UI with --ui-codec-endpoint pointing at it. Anyone who "
            "can reach it can decrypt payloads: keep it local or behind an authenticating proxy."
        ),
    )
    return parser


async def _client(settings: Settings) -> GpuprovClient:
    return await GpuprovClient.connect(codec=settings.codec, settings=settings.temporal)


# How long `submit --wait` follows a job that runs its work and sets no max_runtime_seconds.
RUN_WAIT_SECONDS = 30 * 24 * 3600


async def _submit(settings: Settings, args: argparse.Namespace) -> int:
    spec = load_job_spec(args.file)
    client = await _client(settings)
    handle = await client.submit(spec)
    print(f"submitted {spec.workflow_id} on task queue {client.task_queue}")
    if not args.wait:
        return 0
    if spec.run is None:  # a lease: until it is ready
        status = await handle.wait_for(
            lambda s: s.state is JobState.READY,
            timeout=spec.provisioning_timeout_seconds + 600,
            on_change=lambda s: print(progress_line(s)),
        )
        print(status_text(status))
        return 0 if status.state is JobState.READY else 1
    # A job that runs its work: until it ends (it passes through ready and running by itself).
    runtime = spec.max_runtime_seconds or RUN_WAIT_SECONDS
    status = await handle.wait_for(
        lambda s: s.state.terminal,
        timeout=spec.provisioning_timeout_seconds + runtime + 600,
        on_change=lambda s: print(progress_line(s)),
    )
    print(status_text(status))
    return 0 if status.state is JobState.COMPLETED else 1


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    client = await _client(settings)
    handle = (
        client.job(args.name) if args.run is None else await client.job_run(args.name, args.run)
    )
    status = await handle.status()
    print(status.model_dump_json(indent=2) if args.json else status_text(status))
    return 0


async def _list(settings: Settings, args: argparse.Namespace) -> int:
    state = JobState(args.state) if args.state else None
    jobs = await (await _client(settings)).list(state=state, provider=args.provider)
    for job in jobs:
        print(f"{job.name:40} {job.state.value:13} {job.provider or '-'}")
    return 0


async def _release(settings: Settings, args: argparse.Namespace) -> int:
    await (await _client(settings)).job(args.name).release()
    print(f"release requested for {args.name}")
    return 0


async def _cancel(settings: Settings, args: argparse.Namespace) -> int:
    await (await _client(settings)).job(args.name).cancel()
    print(f"cancellation requested for {args.name}; its instances will be torn down")
    return 0


async def _health(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0 when every machine is healthy, 1 when any is degraded, unhealthy or gone."""
    reports = await (await _client(settings)).health(args.name)
    if args.json:
        print(json.dumps([report.model_dump(mode="json") for report in reports], indent=2))
    else:
        print(health_text(reports))
    return 0 if all(report.verdict is Verdict.HEALTHY for report in reports) else 1


async def _logs(settings: Settings, args: argparse.Namespace) -> int:
    """--follow needs Temporal (to know when the job ends, and which run it is); without it,
    Temporal is asked only when the database holds no output, to tell a quiet job from no job
    at all."""
    job = (await _client(settings)).job(args.name) if args.follow else None
    if job is not None and not await job.exists():
        raise JobNotFound(f"no job named {args.name!r}")
    run = args.run
    if job is not None and run is None:
        with contextlib.suppress(GpuprovError):  # the run Temporal has now, before any row
            run = (await job.status()).run
    shown = 0
    try:
        running = job.running if job is not None else None
        lines = read_lines(settings.database_url, args.name, args.node, running, run=run)
        async for line in lines:
            where = sys.stdout if line.stream == "stdout" else sys.stderr
            print(prefixed(line), file=where, flush=True)
            shown += 1
    except SQLAlchemyError as error:
        raise unavailable(settings.database_url, error) from None
    if not shown and job is None:
        try:
            known = await (await _client(settings)).job(args.name).exists()
        except GpuprovError as error:
            raise GpuprovError(
                f"no output recorded for job {args.name!r}, and whether it exists is unknown: "
                f"{error}"
            ) from None
        if not known:
            raise JobNotFound(f"no job named {args.name!r}")
    return 0


async def _offers(settings: Settings, args: argparse.Namespace) -> int:
    request = ResourceRequest(
        gpu=args.gpu,
        gpus_per_node=args.gpus_per_node,
        spot=args.spot,
        providers=args.providers,
        regions=args.regions,
        image=args.image,
        ports=args.ports[:MAX_PORTS],
    )
    query = OffersQuery(request=request, nodes=args.nodes, max_hourly_cost=args.max_hourly_cost)
    result = await (await _client(settings)).offers(query)
    print(offers_text(result.offers))
    for refusal in whole_provider_refusals(result.rejected):
        print(f"refused {refusal}")
    for error in result.errors:
        print(f"plan failed: {error}")
    for provider, reason in sorted(result.skipped.items()):
        print(f"skipped {provider}: {reason}")
    return 0


async def _dev(settings: Settings, args: argparse.Namespace) -> int:
    settings = with_default_cloud(settings)
    async with dev_stack(settings) as stack:
        reconciler, liveness = await schedules.apply_schedules(stack.client, settings)
        print(f"Temporal dev server at {stack.address}, Web UI at {stack.ui_url}")
        print(schedules.describe(settings, reconciler))
        print(schedules.describe_liveness(settings, liveness))
        print(f"control-plane API at {stack.api_url}")
        if stack.codec_url:
            print(f"payloads encrypted; codec server for the UI at {stack.codec_url}")
        print(
            f"worker on task queue {settings.temporal.task_queue}; "
            f"providers: {', '.join(settings.providers.enabled_ids())}. Ctrl-C stops."
        )
        await _until_signalled()
    print("stopped")
    return 0


async def _api(settings: Settings, args: argparse.Namespace) -> int:
    stop = _stop_on_signals()
    records = await open_records_patiently(
        settings.database_url,
        settings.database.wait_seconds,
        lambda line: print(f"waiting for the database: {line}", file=sys.stderr),
        stop,
    )
    if records is None:
        return 130
    try:
        app = create_app(
            records,
            workers=settings.workers,
            jobs=settings.jobs,
            temporal=lambda: connect_temporal(settings.temporal, codec=settings.codec),
        )
        api = settings.api
        tls = {"tls_cert_file": api.tls_cert_file, "tls_key_file": api.tls_key_file}
        async with serving(app, api.host, api.port, **tls):
            scheme = "https" if api.https else "http"
            print(f"control-plane API at {scheme}://{api.host}:{api.port}")
            print(f"nodes are told to use {settings.api.url}. Ctrl-C stops.")
            await stop.wait()
    finally:
        records.db.dispose()
    print("stopped")
    return 0


async def _codec_server(settings: Settings, args: argparse.Namespace) -> int:
    codec = codec_for(settings.codec)
    if codec is None:
        raise ConfigError(
            "codec-server needs [codec] keys (GPUPROV_CODEC__KEYS); see docs/operations.md"
        )
    host, port = settings.codec.host, settings.codec.port
    origins = ui_origins(settings)
    async with serving(create_codec_app(codec, origins), host, port):
        url = endpoint_url(host, port)
        active = codec.active_key or "none, decode only"
        print(f"codec server at {url}; keys {', '.join(codec.key_ids)} (active: {active})")
        print(f"browsers allowed from {', '.join(origins)}")
        print(f"start the UI with --ui-codec-endpoint {url}. Ctrl-C stops.")
        await _until_signalled()
    print("stopped")
    return 0


async def _orphans(settings: Settings, args: argparse.Namespace) -> int:
    records = open_records(settings.database_url)
    try:
        orphans = records.orphans(include_resolved=args.all)
        unfinished = records.unfinished_vms()
    finally:
        records.db.dispose()
    print(orphans_text(orphans, include_resolved=args.all))
    by_job = await _situations(settings, {row.job for row in unfinished})
    print(unheld_text(owners.unheld_machines(unfinished, by_job)))
    return 0


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


async def _situations(settings: Settings, jobs: set[str]) -> dict[str, owners.JobSituation]:
    """What Temporal says about each job; "owner unknown" for all when it cannot be reached."""
    if not jobs:
        return {}
    try:
        client = await _client(settings)
    except GpuprovError as error:
        return owners.unreachable(jobs, str(error))
    return await owners.situations(client.temporal, jobs)


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return stop


async def _until_signalled() -> None:
    await _stop_on_signals().wait()


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


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], Awaitable[int]]] = {
    "submit": _submit,
    "status": _status,
    "list": _list,
    "release": _release,
    "cancel": _cancel,
    "offers": _offers,
    "health": _health,
    "logs": _logs,
    "dev": _dev,
    "api": _api,
    "setup": cluster_setup.command,
    "schedules": schedules.command,
    "orphans": _orphans,
    "end": end_command.command,
    "cost": _cost,
    "token": _token,
    "join": _join,
    "codec-server": _codec_server,
    "apikey": apikeys.command,
    "workers": workers_cli.command,
}


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
    args = _parser().parse_args(argv)
    settings: Settings | None = None
    try:
        if args.command == "demo":
            return demo_module.main(hold=args.hold)
        if args.command == "demo-ssh":
            from gpuprov import demo_ssh  # loaded only for this command

            return demo_ssh.main(hold=args.hold)
        settings = load_settings(args.config)
        if args.address:
            try:
                check_address(args.address)
            except ValueError as error:
                raise ConfigError(f"--address: {error}") from None
            temporal = settings.temporal.model_copy(update={"address": args.address})
            settings = settings.model_copy(update={"temporal": temporal})
        with contextlib.suppress(KeyboardInterrupt):
            return asyncio.run(COMMANDS[args.command](settings, args))
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
