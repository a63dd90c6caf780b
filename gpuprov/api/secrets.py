"""The secrets vault over the API (gpuprov/store/secrets.py); values go in, never come out:

    GET    /v1/secrets[?team=T]             names a team sees (its own and the global ones)
    PUT    /v1/secrets/{name}[?team=T]      {value}: store or replace one
    DELETE /v1/secrets/{name}[?team=T]      forget one

Reading names needs a viewer of the team; setting and deleting a member of it. Without
`team`, a member's or viewer's key means its own team, and an admin's means the global secrets
(which every team's jobs see). No answer holds a value: the only one that does is the work a
node's agent fetches (gpuprov/api/work.py). Without a configured key (`[secrets]`), a set is
refused (503, saying what to configure) and nothing is stored.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from pydantic import Field

from gpuprov.api.auth import BODY_REFUSALS, ROLE_REFUSALS, Caller, require_member, require_viewer
from gpuprov.api.scope import team_asked
from gpuprov.models import SECRET_NAME_PATTERN, TEAM_NAME_PATTERN
from gpuprov.store.secrets import (
    GLOBAL,
    MAX_VALUE_BYTES,
    SecretRefused,
    SecretView,
    Vault,
    VaultLocked,
)
from providers.base import Model

SecretName = Annotated[str, Path(pattern=SECRET_NAME_PATTERN)]
TeamParam = Annotated[str | None, Query(pattern=TEAM_NAME_PATTERN)]
LOCKED = {503: {"description": "no secrets key is configured where the API runs"}}
NOT_FOUND = {404: {"description": "no such secret for the team"}}


class SecretValue(Model):
    value: str = Field(min_length=1, max_length=MAX_VALUE_BYTES)


def _vault(request: Request) -> Vault:
    return request.app.state.vault


def _changed_team(caller: Caller, team: str | None) -> str:
    """The team a set or delete is about: the one asked (the caller must be a member of it),
    the caller's own, or the global secrets for an admin who names none."""
    if team is None:
        if caller.admin:
            return GLOBAL
        team = caller.team or GLOBAL
    if team == GLOBAL:
        if not caller.admin:
            raise HTTPException(403, "only an admin's key changes the global secrets")
        return GLOBAL
    caller.check_acts_on(team, "the secrets")
    return team


def add_routes(app: FastAPI) -> None:
    @app.get("/v1/secrets", responses=ROLE_REFUSALS)
    async def secret_names(
        caller: Annotated[Caller, Depends(require_viewer)],
        vault: Annotated[Vault, Depends(_vault)],
        team: TeamParam = None,
    ) -> list[SecretView]:
        """The secrets a team sees, names and dates only (every one, for an admin)."""
        return await asyncio.to_thread(vault.names, team_asked(caller, team, "the secrets"))

    @app.put("/v1/secrets/{name}", responses={**ROLE_REFUSALS, **BODY_REFUSALS, **LOCKED, 422: {}})
    async def set_secret(
        name: SecretName,
        body: SecretValue,
        caller: Annotated[Caller, Depends(require_member)],
        vault: Annotated[Vault, Depends(_vault)],
        team: TeamParam = None,
    ) -> SecretView:
        """Store (or replace) a secret's value, encrypted; the answer names it, never its value."""
        chosen = _changed_team(caller, team)
        try:
            return await asyncio.to_thread(vault.set, chosen, name, body.value)
        except VaultLocked as locked:
            raise HTTPException(503, str(locked)) from None
        except SecretRefused as refused:
            raise HTTPException(422, str(refused)) from None

    @app.delete("/v1/secrets/{name}", responses={**ROLE_REFUSALS, **NOT_FOUND})
    async def delete_secret(
        name: SecretName,
        caller: Annotated[Caller, Depends(require_member)],
        vault: Annotated[Vault, Depends(_vault)],
        team: TeamParam = None,
    ) -> dict[str, str]:
        chosen = _changed_team(caller, team)
        if not await asyncio.to_thread(vault.delete, chosen, name):
            where = f"team {chosen!r}" if chosen else "the global secrets"
            raise HTTPException(404, f"no secret {name!r} in {where}")
        return {"deleted": name}
