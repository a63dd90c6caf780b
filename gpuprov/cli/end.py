"""`gpuprov end JOB [--reason TEXT] [--yes]`: the operator's way to end a job that cannot end
itself (stuck: its workflow task keeps failing, so a cancel never reaches its code) and tear its
machines down.

It terminates the workflow `job-<JOB>` if it still runs, then runs one reconcile pass over that
job's machines with no grace period and waits for it (`GpuprovClient.end_job`). It prints what
was deleted and what is left, and why; exit 0 when nothing of the job is left live, else 1.
Without --yes it shows the job's situation and machines and asks, on a terminal only.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from gpuprov.cli.arguments import bounded_text, job_name
from gpuprov.cli.render import end_text
from gpuprov.config import Settings
from gpuprov.engine.worker import open_records
from gpuprov.sdk.client import GpuprovClient, GpuprovError
from gpuprov.sdk.owners import Standing, job_situation
from gpuprov.store.db import VmRecord

DEFAULT_REASON = "ended by an operator with `gpuprov end`"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    end = commands.add_parser(
        "end",
        help="end a job that cannot end itself: terminate it, delete its machines",
        description=(
            "Terminate the job's workflow if it still runs (none of its code runs, so its own "
            "teardown does not), then delete its machines with one reconcile pass, with no "
            "grace period. Kept machines and those a running job holds are never touched. "
            "Exit 0 when nothing of the job is left live, 1 otherwise."
        ),
    )
    end.add_argument("name", type=job_name, help="the job name (workflow job-<name>)")
    end.add_argument(
        "--reason",
        type=bounded_text(1000),
        default=DEFAULT_REASON,
        help="recorded with the termination",
    )
    end.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    end.set_defaults(handler=command)


async def command(settings: Settings, args: argparse.Namespace) -> int:
    if not args.yes and not sys.stdin.isatty():
        raise GpuprovError(
            f"not ending job {args.name!r}: stdin is not a terminal to confirm on; pass --yes"
        )
    client = await GpuprovClient.connect(codec=settings.codec, settings=settings.temporal)
    if not args.yes:
        await _confirm(settings, client, args.name)
    report = await client.end_job(args.name, args.reason)
    print(end_text(report))
    return 0 if report.nothing_left else 1


async def _confirm(settings: Settings, client: GpuprovClient, job: str) -> None:
    situation = await job_situation(client.temporal, job)
    detail = f": {situation.detail}" if situation.detail else ""
    print(f"job {job} is {situation.standing.value}{detail}")
    if situation.standing is Standing.RUNNING:
        print(f"  (it answers: `gpuprov cancel {job}` ends it with its own teardown)")
    machines = _unfinished(settings, job)
    print(f"machines recorded and not yet terminated: {len(machines)}")
    for row in machines:
        kept = " (kept on purpose: not touched)" if row.status == "kept" else ""
        print(f"    {row.provider}/{row.region} {row.vm}: {row.status}{kept}")
    print(
        "This terminates its workflow if it still runs (none of its code runs, so its own "
        "teardown does not) and deletes its machines now, with no grace period."
    )
    answer = await asyncio.to_thread(input, f"End job {job}? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise GpuprovError(f"job {job!r} not ended: not confirmed")


def _unfinished(settings: Settings, job: str) -> list[VmRecord]:
    records = open_records(settings.database_url)
    try:
        return [row for row in records.vms_for_job(job) if row.status != "terminated"]
    finally:
        records.db.dispose()
