"""What jobs cost, as the API shows it:

    GET /v1/cost                  every job the caller's team ran (every job, for an admin)
    GET /v1/cost?job=NAME         the same for one job, and each of its machines
    GET /v1/cost?team=T           one team's jobs, and its month so far against its budget

Viewers of the team and admins. The answer is `gpuprov.store.costs.CostReport`, read from the
database as `gpuprov cost` reads it: estimates, actuals summed per currency (never across
currencies), and the machines that have no actual and why (no quote, kept, not gone yet); with a
team, `budget` is its spend this month (gpuprov/store/teams.py) against its limits.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Query, Request

from gpuprov.api.auth import ROLE_REFUSALS, Caller, require_viewer
from gpuprov.api.scope import check_job, team_asked, teams_of
from gpuprov.models import TEAM_NAME_PATTERN
from gpuprov.store.costs import CostReport, cost_report
from gpuprov.store.records import Records
from gpuprov.store.runs import NO_SUCH_RUN, RUN_PATTERN, RunNotFound
from gpuprov.store.teams import TeamNotFound


def _records(request: Request) -> Records:
    return request.app.state.records


def add_routes(app: FastAPI) -> None:
    """The cost endpoint, on the app itself (its routes stay one flat list to inspect)."""

    @app.get("/v1/cost", responses={**ROLE_REFUSALS, **NO_SUCH_RUN})
    async def cost(
        request: Request,
        caller: Annotated[Caller, Depends(require_viewer)],
        records: Annotated[Records, Depends(_records)],
        job: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
        run: Annotated[str | None, Query(pattern=RUN_PATTERN)] = None,
        team: Annotated[str | None, Query(pattern=TEAM_NAME_PATTERN)] = None,
    ) -> CostReport:
        """Every job's costs, or one job's (its latest run, or the run `run` names), or one
        team's with its budget."""
        chosen = team_asked(caller, team, "the cost")
        if job is not None:
            job_team = await check_job(request, caller, job, run)
            if chosen is not None and job_team is not None and job_team != chosen:
                raise HTTPException(404, f"job {job!r} is not team {chosen!r}'s")
        try:
            report = await asyncio.to_thread(cost_report, records.db, job, run, chosen)
        except RunNotFound as unknown:
            raise HTTPException(404, str(unknown)) from None
        if chosen is not None:
            try:
                spend = await asyncio.to_thread(teams_of(request).spend, chosen)
            except TeamNotFound as unknown:
                raise HTTPException(404, str(unknown)) from None
            report = report.model_copy(update={"budget": spend})
        return report
