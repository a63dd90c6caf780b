"""`gpuprov workers`: the registered machines, and what an operator does to them.

    gpuprov workers [--all] [--state S] [--job J]   origin, state, liveness, last seen, health,
                                                    capabilities, job (revoked ones with --all)
    gpuprov workers drain ID                        no new reservations; a running job keeps it
    gpuprov workers undrain ID                      reservations again
    gpuprov workers remove ID                       revoke it and its credential: its job is
                                                    told, its agent stops at its next heartbeat

With `[client] api_key` (GPUPROV_CLIENT__API_KEY or GPUPROV_API_KEY) each goes over the
control-plane API (`GET /v1/workers`, `POST /v1/workers/{id}/drain|undrain`,
`DELETE /v1/workers/{id}`; gpuprov/sdk/api_client.py) and the database is never opened; without
one the database is read and changed directly, as those endpoints do, and its schema must be at
this gpuprov's latest migration (gpuprov/store/schema.py).
"""

from __future__ import annotations

import argparse
from datetime import datetime

from gpuprov.api.workers import summary
from gpuprov.config import ConfigError, Settings
from gpuprov.models import WorkerSummary
from gpuprov.sdk.api_client import ApiClient
from gpuprov.store.db import WORKER_STATES, utcnow
from gpuprov.store.liveness import Liveness
from gpuprov.store.records import Records
from gpuprov.store.schema import open_current


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "workers",
        help="registered machines: liveness, health, drain, remove",
        description=(
            "List the workers, or drain, undrain or remove one: over the control-plane API "
            "where [client] api_key is set (GPUPROV_API_KEY), else in gpuprov's database."
        ),
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
    api = ApiClient.from_settings(settings)
    if args.workers_command is None:
        if api is not None:
            async with api:
                workers = await api.workers(state=args.state, job=args.job)
        else:
            workers = _listed(settings, args)
        if not args.all and args.state is None:
            workers = [worker for worker in workers if worker.state != "revoked"]
        print(workers_text(workers, utcnow()))
        return 0
    worker_id, draining = args.worker_id, args.workers_command == "drain"
    if api is not None:
        async with api:
            if args.workers_command == "remove":
                changed = await api.remove(worker_id)
            else:
                changed = await (api.drain if draining else api.undrain)(worker_id)
    else:
        changed = _changed(settings, args.workers_command, worker_id)
    print(f"worker {changed.id} {_done(args.workers_command, changed)}")
    return 0


def _listed(settings: Settings, args: argparse.Namespace) -> list[WorkerSummary]:
    database = open_current(settings.database_url)  # one line, not a traceback, when it is out
    try:
        return [summary(row) for row in Records(database).workers(state=args.state, job=args.job)]
    finally:
        database.dispose()


def _changed(settings: Settings, action: str, worker_id: str) -> WorkerSummary:
    database = open_current(settings.database_url)
    try:
        liveness = Liveness(database)
        if action == "remove":
            row = liveness.remove(worker_id)
        else:
            row = liveness.set_draining(worker_id, action == "drain")
    finally:
        database.dispose()
    if row is None:
        raise ConfigError(f"no worker {worker_id!r} that is not revoked")
    return summary(row)


def _done(action: str, worker: WorkerSummary) -> str:
    if action == "remove":
        done = "removed: revoked with its credential; its agent stops at its next heartbeat"
        if worker.job:
            done += f"; job {worker.job} is told at the next liveness sweep"
        return done
    return "draining: no new reservations" if worker.draining else "not draining"
