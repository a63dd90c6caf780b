"""`gpuprov submit | status | release | cancel | list | health`: one job through Temporal (the
SDK, gpuprov/sdk/client.py): start it, read it, release or cancel it, list them, check its
machines."""

from __future__ import annotations

import argparse
import json

from gpuprov.cli.arguments import job_name, job_or_machine_name, run_tag
from gpuprov.cli.common import EARLIER_RUN, Commands, client_for
from gpuprov.cli.render import health_text, progress_line, status_text
from gpuprov.config import Settings
from gpuprov.models import JobSpec, JobSpecError, JobState, load_job_spec
from gpuprov.sdk.api_client import ApiClient
from gpuprov.store.secrets import unknown_secret
from providers import PROVIDER_IDS
from providers.base import Verdict


def add_parser(commands: Commands) -> None:
    submit = commands.add_parser("submit", help="submit a job spec (TOML or YAML)")
    submit.add_argument("file")
    submit.add_argument(
        "--wait",
        action="store_true",
        help="follow the job until ready (a lease) or until it ends (a job with run)",
    )
    submit.set_defaults(handler=_submit)
    for name, text, handler in (
        ("status", "show a job", _status),
        ("release", "release a ready job", _release),
        ("cancel", "cancel a job (its instances are torn down)", _cancel),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("name", type=job_name)
        sub.set_defaults(handler=handler)
    status = commands.choices["status"]
    status.add_argument("--json", action="store_true")
    status.add_argument("--run", type=run_tag, help=EARLIER_RUN)
    listing = commands.add_parser("list", help="list jobs")
    listing.add_argument("--state", choices=[s.value for s in JobState])
    listing.add_argument("--provider", choices=PROVIDER_IDS)
    listing.set_defaults(handler=_list)
    health = commands.add_parser(
        "health", help="health of a job's machines or of one machine (gone/unhealthy/...)"
    )
    health.add_argument(
        "name",
        type=job_or_machine_name,
        help="a job name, or a VM name such as train-7b-a1-n0-ce4389",
    )
    health.add_argument("--json", action="store_true")
    health.set_defaults(handler=_health)


# How long `submit --wait` follows a job that runs its work and sets no max_runtime_seconds.
RUN_WAIT_SECONDS = 30 * 24 * 3600


async def _submit(settings: Settings, args: argparse.Namespace) -> int:
    spec = load_job_spec(args.file)
    await _check_secrets(settings, spec)
    client = await client_for(settings)
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


async def _check_secrets(settings: Settings, spec: JobSpec) -> None:
    """With an API key configured, a reference to a secret the job's team cannot see is
    refused before the job starts, naming the variable; without one, the job's admission
    refuses it as it starts (so does a job started any other way)."""
    references = spec.secret_references()
    api = ApiClient.from_settings(settings) if references else None
    if api is None:
        return
    async with api:
        known = {secret.name for secret in await api.secret_names(spec.team)}
    for variable, names in references.items():
        missing = sorted(set(names) - known)
        if missing:
            raise JobSpecError(unknown_secret(variable, missing[0], spec.team))


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    client = await client_for(settings)
    handle = (
        client.job(args.name) if args.run is None else await client.job_run(args.name, args.run)
    )
    status = await handle.status()
    print(status.model_dump_json(indent=2) if args.json else status_text(status))
    return 0


async def _list(settings: Settings, args: argparse.Namespace) -> int:
    state = JobState(args.state) if args.state else None
    jobs = await (await client_for(settings)).list(state=state, provider=args.provider)
    for job in jobs:
        print(f"{job.name:40} {job.state.value:13} {job.provider or '-'}")
    return 0


async def _release(settings: Settings, args: argparse.Namespace) -> int:
    await (await client_for(settings)).job(args.name).release()
    print(f"release requested for {args.name}")
    return 0


async def _cancel(settings: Settings, args: argparse.Namespace) -> int:
    await (await client_for(settings)).job(args.name).cancel()
    print(f"cancellation requested for {args.name}; its instances will be torn down")
    return 0


async def _health(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0 when every machine is healthy, 1 when any is degraded, unhealthy or gone."""
    reports = await (await client_for(settings)).health(args.name)
    if args.json:
        print(json.dumps([report.model_dump(mode="json") for report in reports], indent=2))
    else:
        print(health_text(reports))
    return 0 if all(report.verdict is Verdict.HEALTHY for report in reports) else 1
