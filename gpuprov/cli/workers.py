"""`gpuprov workers`: the registered machines, read from the database, and what an operator does
to them.

    gpuprov workers [--all] [--state S] [--job J]   origin, state, liveness, last seen, health,
                                                    capabilities, job (revoked ones with --all)
    gpuprov workers drain ID                        no new reservations; a running job keeps it
    gpuprov workers undrain ID                      reservations again
    gpuprov workers remove ID                       revoke it and its credential: its job is
                                                    told, its agent stops at its next heartbeat

The same as the API's operator endpoints and the SDK's `WorkersClient` (gpuprov/sdk/client.py).
"""

from __future__ import annotations

import argparse
from datetime import datetime

from gpuprov.api.workers import summary
from gpuprov.config import ConfigError, Settings
from gpuprov.models import WorkerSummary
from gpuprov.store.db import WORKER_STATES, open_database, utcnow
from gpuprov.store.liveness import Liveness
from gpuprov.store.records import Records


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "workers",
        help="registered machines: liveness, health, drain, remove",
        description="List the workers (the database's view), or drain, undrain or remove one.",
    )
    parser.add_argument("--all", action="store_true", help="revoked workers too")
    parser.add_argument("--state", choices=WORKER_STATES)
    parser.add_argument("--job", help="only this job's workers")
    actions = parser.add_subparsers(dest="workers_command")
    for action, text in (
        ("drain", "stop new reservations of a worker (a running job keeps it)"),
        ("undrain", "let a drained worker be reserved again"),
        ("remove", "revoke a worker and its credential; its job is told, its agent stops"),
    ):
        actions.add_parser(action, help=text).add_argument("worker_id", metavar="ID")
    parser.set_defaults(handler=command)


def _ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    seconds = max(0, int((now - moment).total_seconds()))
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h ago"


def workers_text(workers: list[WorkerSummary], now: datetime) -> str:
    """Two lines per worker (three when unhealthy): who, liveness and job; what it has."""
    if not workers:
        return "no workers"
    lines = []
    for worker in workers:
        liveness = worker.liveness + (", draining" if worker.draining else "")
        seen = _ago(worker.last_seen_at, now)
        lines.append(
            f"{worker.id}  {worker.origin}, {worker.state}, {liveness}, last seen {seen} "
            f"({worker.heartbeats} heartbeats), {worker.health}, job {worker.job or '-'}"
        )
        where = worker.vm or worker.label or "-"
        place = f" [{worker.provider}/{worker.region}]" if worker.provider else ""
        lines.append(f"    {where}{place}: {worker.capabilities}")
        if worker.health != "healthy" and worker.health_detail:
            lines.append(f"    {worker.health}: {worker.health_detail}")
    return "\n".join(lines)


async def command(settings: Settings, args: argparse.Namespace) -> int:
    database = open_database(settings.database_url)  # one line, not a traceback, when it is out
    try:
        if args.workers_command is None:
            rows = Records(database).workers(state=args.state, job=args.job)
            if not args.all and args.state is None:
                rows = [row for row in rows if row.state != "revoked"]
            print(workers_text([summary(row) for row in rows], utcnow()))
            return 0
        liveness, worker_id = Liveness(database), args.worker_id
        if args.workers_command == "remove":
            row = liveness.remove(worker_id)
            done = "removed: revoked with its credential; its agent stops at its next heartbeat"
            if row is not None and row.job:
                done += f"; job {row.job} is told at the next liveness sweep"
        else:
            row = liveness.set_draining(worker_id, args.workers_command == "drain")
            done = "draining: no new reservations" if row and row.draining else "not draining"
        if row is None:
            raise ConfigError(f"no worker {worker_id!r} that is not revoked")
        print(f"worker {row.id} {done}")
        return 0
    finally:
        database.dispose()
