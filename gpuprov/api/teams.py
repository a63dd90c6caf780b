"""Teams and their month so far, over the API (gpuprov/store/teams.py):

    GET /v1/teams           every team (an admin), or the caller's own: limits and spend
    GET /v1/teams/{team}    one team (a viewer of it, or an admin)

Teams are created and their budgets set with `gpuprov team` where the database is (set-up, like
`gpuprov apikey`); the API shows them.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Path, Request

from gpuprov.api.auth import ROLE_REFUSALS, Caller, require_viewer
from gpuprov.api.scope import teams_of
from gpuprov.models import TEAM_NAME_PATTERN, TeamSpend
from gpuprov.store.teams import TeamNotFound

NOT_FOUND = {404: {"description": "no such team"}}


def add_routes(app: FastAPI) -> None:
    @app.get("/v1/teams", responses=ROLE_REFUSALS)
    async def list_teams(
        request: Request, caller: Annotated[Caller, Depends(require_viewer)]
    ) -> list[TeamSpend]:
        teams = teams_of(request)
        names = (
            [team.name for team in await asyncio.to_thread(teams.all)]
            if caller.admin
            else [caller.team or ""]
        )
        return [await asyncio.to_thread(teams.spend, name) for name in names if name]

    @app.get("/v1/teams/{team}", responses={**ROLE_REFUSALS, **NOT_FOUND})
    async def one_team(
        request: Request,
        caller: Annotated[Caller, Depends(require_viewer)],
        team: Annotated[str, Path(pattern=TEAM_NAME_PATTERN)],
    ) -> TeamSpend:
        caller.check_reads(team, "the budget")
        try:
            return await asyncio.to_thread(teams_of(request).spend, team)
        except TeamNotFound as unknown:
            raise HTTPException(404, str(unknown)) from None
