"""`gpuprov logs NAME [--node N] [--follow] [--run R]`: a job's output from gpuprov's database,
each line after its node's rank."""

from __future__ import annotations

import argparse
import contextlib
import sys

from sqlalchemy.exc import SQLAlchemyError

from gpuprov.cli.arguments import bounded_int, job_name, run_tag
from gpuprov.cli.common import EARLIER_RUN, Commands, client_for
from gpuprov.config import Settings
from gpuprov.sdk.client import GpuprovError, JobNotFound
from gpuprov.store.db import unavailable
from gpuprov.store.logs import prefixed, read_lines


def add_parser(commands: Commands) -> None:
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
    logs.set_defaults(handler=_logs)


async def _logs(settings: Settings, args: argparse.Namespace) -> int:
    """--follow needs Temporal (to know when the job ends, and which run it is); without it,
    Temporal is asked only when the database holds no output, to tell a quiet job from no job
    at all."""
    job = (await client_for(settings)).job(args.name) if args.follow else None
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
            known = await (await client_for(settings)).job(args.name).exists()
        except GpuprovError as error:
            raise GpuprovError(
                f"no output recorded for job {args.name!r}, and whether it exists is unknown: "
                f"{error}"
            ) from None
        if not known:
            raise JobNotFound(f"no job named {args.name!r}")
    return 0
