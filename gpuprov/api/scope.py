"""Which team a route's subject belongs to, and the 403 for a caller of another team.

A job's team is its run's (`job_runs.team`, written at its admission; a run from before teams
is the default team's). A worker's is its job's; a worker that runs no job (an existing
worker, idle) belongs to the pool, which only admins see. An admin reaches every team; a
member or viewer only its own (gpuprov/api/auth.py `Caller`).
"""

from __future__ import annotations

import asyncio

from fastapi import HTTPException, Request

from gpuprov.api.auth import Caller
from gpuprov.store.db import WorkerRecord
from gpuprov.store.teams import Teams


def teams_of(request: Request) -> Teams:
    return request.app.state.teams


async def job_team(request: Request, job: str, run: str | None = None) -> str | None:
    """The team of `job`'s run (its latest without one); None: no such job."""
    return await asyncio.to_thread(teams_of(request).team_of, job, run or None)


async def check_job(
    request: Request, caller: Caller, job: str, run: str | None = None, *, act: bool = False
) -> str | None:
    """403 unless `caller` may read (or, with `act`, change) `job`; its team. An unknown job
    is 404 to anyone but an admin (who is answered as before: an empty page, a 404 run)."""
    team = await job_team(request, job, run)
    if team is None:
        if caller.admin:
            return None
        raise HTTPException(404, f"no job named {job!r} of team {caller.team!r}")
    if act:
        caller.check_acts_on(team, f"job {job!r}")
    else:
        caller.check_reads(team, f"job {job!r}")
    return team


async def worker_visible(request: Request, caller: Caller, worker: WorkerRecord) -> bool:
    """Whether `caller` may see `worker`: an admin every one, anyone else its team's jobs'."""
    if caller.admin:
        return True
    if not worker.job:
        return False
    team = await job_team(request, worker.job, worker.run or None)
    return team is not None and caller.reads(team)


def team_asked(caller: Caller, team: str | None, what: str) -> str | None:
    """The team a listing is about: the one asked (403 unless the caller reads it), or the
    caller's own when none is asked (None, every team, for an admin)."""
    if team is None:
        return None if caller.admin else caller.team
    caller.check_reads(team, what)
    return team
