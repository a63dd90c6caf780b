"""`gpuprov logs NAME [--node N] [--follow] [--run R]`: a job's output, each line after its
node's rank.

With `[client] api_key` (GPUPROV_CLIENT__API_KEY or GPUPROV_API_KEY) the output is read over
the control-plane API (`GET /v1/jobs/{job}/logs`, page by page; gpuprov/sdk/api_client.py) and
the database is never opened, so a user needs no database credentials. Without one it is read
from gpuprov's database directly (the embedded default, or an operator on the box), whose
schema must be at this gpuprov's latest migration (gpuprov/store/schema.py says what to run).
Either way Temporal says whether the job still runs while following, and whether a job with no
output exists at all.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator

from sqlalchemy.exc import SQLAlchemyError

from gpuprov.cli.arguments import bounded_int, job_name, run_tag
from gpuprov.cli.common import EARLIER_RUN, Commands, client_for
from gpuprov.config import Settings
from gpuprov.sdk.api_client import ApiClient
from gpuprov.sdk.client import GpuprovError, JobNotFound
from gpuprov.store.db import unavailable
from gpuprov.store.logs import LogLine, prefixed, read_lines
from gpuprov.store.schema import open_current


def add_parser(commands: Commands) -> None:
    logs = commands.add_parser(
        "logs",
        help="a job's output, each line after its node's rank",
        description=(
            "Read what the job's nodes printed: over the control-plane API where [client] "
            "api_key is set (GPUPROV_API_KEY), else from gpuprov's database. Each node's lines "
            "in order, prefixed by its rank ([1] ...; after a restart [1 r2] ...). Their stdout "
            "goes to stdout, their stderr and gpuprov's notes to stderr. With --follow, read "
            "on while the job runs, and stop once it has ended."
        ),
    )
    logs.add_argument("name", type=job_name)
    logs.add_argument("--node", type=bounded_int(0, 1023), help="only this rank's output")
    logs.add_argument("--follow", "-f", action="store_true", help="until the job ends")
    logs.add_argument("--run", type=run_tag, help=EARLIER_RUN)
    logs.set_defaults(handler=_logs)


async def _logs(settings: Settings, args: argparse.Namespace) -> int:
    """--follow needs Temporal (to know when the job ends, and which run it is); without it,
    Temporal is asked only when no output was recorded, to tell a quiet job from no job at
    all."""
    job = (await client_for(settings)).job(args.name) if args.follow else None
    if job is not None and not await job.exists():
        raise JobNotFound(f"no job named {args.name!r}")
    run = args.run
    if job is not None and run is None:
        with contextlib.suppress(GpuprovError):  # the run Temporal has now, before any row
            run = (await job.status()).run
    running = job.running if job is not None else None
    api = ApiClient.from_settings(settings)
    if api is not None:
        async with api:
            shown = await _print(api.log_lines(args.name, args.node, running, run=run))
    else:
        open_current(settings.database_url).dispose()  # one line when it is behind or out
        try:
            lines = read_lines(settings.database_url, args.name, args.node, running, run=run)
            shown = await _print(lines)
        except SQLAlchemyError as error:
            raise unavailable(settings.database_url, error) from None
    if not shown and job is None:
        await _exists_or_fail(settings, args.name)
    return 0


async def _print(lines: AsyncIterator[LogLine]) -> int:
    shown = 0
    async for line in lines:
        where = sys.stdout if line.stream == "stdout" else sys.stderr
        print(prefixed(line), file=where, flush=True)
        shown += 1
    return shown


async def _exists_or_fail(settings: Settings, name: str) -> None:
    """No output recorded: JobNotFound unless Temporal knows the job."""
    try:
        known = await (await client_for(settings)).job(name).exists()
    except GpuprovError as error:
        raise GpuprovError(
            f"no output recorded for job {name!r}, and whether it exists is unknown: {error}"
        ) from None
    if not known:
        raise JobNotFound(f"no job named {name!r}")
