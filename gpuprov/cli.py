"""The `gpuprov` command line, built on gpuprov.client.

    gpuprov demo                      the whole story on the fake cloud, then a clean shutdown
    gpuprov dev                       Temporal dev server + UI + worker, until Ctrl-C
    gpuprov submit job.yaml [--wait]  start a job (workflow id job-<name>)
    gpuprov status NAME | list | release NAME | cancel NAME | offers --gpu H100
Connection settings come from gpuprov.toml (--config or GPUPROV_CONFIG) and the environment
(GPUPROV_TEMPORAL__ADDRESS, default localhost:7233); --address overrides both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn

from gpuprov import demo as demo_module
from gpuprov.client import GpuprovClient, GpuprovError
from gpuprov.config import ConfigError, Settings, load_settings
from gpuprov.dev import dev_stack, with_default_cloud
from gpuprov.models import JobSpecError, JobState, load_job_spec
from gpuprov.render import offers_text, progress_line, status_text
from providers.base import ResourceRequest
from workflows.offers import OffersQuery


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuprov", description="GPU provisioning on Temporal")
    parser.add_argument("--config", help="path to gpuprov.toml (default: $GPUPROV_CONFIG)")
    parser.add_argument("--address", help="Temporal frontend host:port")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the fake-cloud failover story end to end")
    demo.add_argument("--hold", action="store_true", help="keep the UI up until Enter")
    commands.add_parser("dev", help="dev server + UI + worker, until Ctrl-C")
    submit = commands.add_parser("submit", help="submit a job spec (TOML or YAML)")
    submit.add_argument("file")
    submit.add_argument("--wait", action="store_true", help="follow the job until ready or ended")
    for name, text in (
        ("status", "show a job"),
        ("release", "release a ready job"),
        ("cancel", "cancel a job (its instances are torn down)"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("name")
    status = commands.choices["status"]
    status.add_argument("--json", action="store_true")
    listing = commands.add_parser("list", help="list jobs")
    listing.add_argument("--state", choices=[s.value for s in JobState])
    listing.add_argument("--provider")
    offers = commands.add_parser("offers", help="offers a job would try, cheapest first")
    offers.add_argument("--gpu")
    offers.add_argument("--gpus-per-node", type=int, default=1)
    offers.add_argument("--nodes", type=int, default=1)
    offers.add_argument("--spot", action="store_true")
    offers.add_argument("--max-hourly-cost", type=float)
    offers.add_argument("--provider", action="append", dest="providers")
    offers.add_argument("--region", action="append", dest="regions")
    return parser


async def _client(settings: Settings) -> GpuprovClient:
    temporal = settings.temporal
    return await GpuprovClient.connect(temporal.address, temporal.namespace, temporal.task_queue)


async def _submit(settings: Settings, args: argparse.Namespace) -> int:
    spec = load_job_spec(args.file)
    client = await _client(settings)
    handle = await client.submit(spec)
    print(f"submitted {spec.workflow_id} on task queue {client.task_queue}")
    if not args.wait:
        return 0
    status = await handle.wait_for(
        lambda s: s.state is JobState.READY,
        timeout=spec.provisioning_timeout_seconds + 600,
        on_change=lambda s: print(progress_line(s)),
    )
    print(status_text(status))
    return 0 if status.state is JobState.READY else 1


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    status = await (await _client(settings)).job(args.name).status()
    print(status.model_dump_json(indent=2) if args.json else status_text(status))
    return 0


async def _list(settings: Settings, args: argparse.Namespace) -> int:
    state = JobState(args.state) if args.state else None
    jobs = await (await _client(settings)).list(state=state, provider=args.provider)
    for name, job_state, provider in jobs:
        print(f"{name:40} {job_state.value:13} {provider or '-'}")
    return 0


async def _release(settings: Settings, args: argparse.Namespace) -> int:
    await (await _client(settings)).job(args.name).release()
    print(f"release requested for {args.name}")
    return 0


async def _cancel(settings: Settings, args: argparse.Namespace) -> int:
    await (await _client(settings)).job(args.name).cancel()
    print(f"cancellation requested for {args.name}; its instances will be torn down")
    return 0


async def _offers(settings: Settings, args: argparse.Namespace) -> int:
    request = ResourceRequest(
        gpu=args.gpu,
        gpus_per_node=args.gpus_per_node,
        spot=args.spot,
        providers=args.providers,
        regions=args.regions,
    )
    query = OffersQuery(request=request, nodes=args.nodes, max_hourly_cost=args.max_hourly_cost)
    result = await (await _client(settings)).offers(query)
    print(offers_text(result.offers))
    for error in result.errors:
        print(f"plan failed: {error}")
    return 0


async def _dev(settings: Settings, args: argparse.Namespace) -> int:
    settings = with_default_cloud(settings)
    async with dev_stack(settings) as stack:
        print(f"Temporal dev server at {stack.address}, Web UI at {stack.ui_url}")
        print(
            f"worker on task queue {settings.temporal.task_queue}; "
            f"providers: {', '.join(settings.providers.enabled_ids())}. Ctrl-C stops."
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    print("stopped")
    return 0


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], Awaitable[int]]] = {
    "submit": _submit,
    "status": _status,
    "list": _list,
    "release": _release,
    "cancel": _cancel,
    "offers": _offers,
    "dev": _dev,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return demo_module.main(hold=args.hold)
        settings = load_settings(args.config)
        if args.address:
            temporal = settings.temporal.model_copy(update={"address": args.address})
            settings = settings.model_copy(update={"temporal": temporal})
        with contextlib.suppress(KeyboardInterrupt):
            return asyncio.run(COMMANDS[args.command](settings, args))
        return 130
    except (JobSpecError, ConfigError, GpuprovError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def entry() -> NoReturn:
    """Console-script entry: run, flush, and skip interpreter finalization.

    The Temporal client's Rust threads can outlive the event loop and crash CPython's
    finalization ("PyGILState_Release ... must be current", temporalio/sdk-python#300), which
    turned a successful command into exit -11 now and then. Nothing is left to clean up here.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
