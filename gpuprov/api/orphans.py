"""The rows `gpuprov orphans` shows, as the API shows them:

    GET /v1/orphans            the open possible orphans, and every unfinished VM row
    GET /v1/orphans?all=true   resolved orphans too

Admins only (`require_admin`): a possible orphan is a machine of any team, and the unfinished
rows name every team's jobs. The answer is `gpuprov.store.orphans.OrphansReport`, read from the
database as `gpuprov orphans` reads it without an API key; which of those machines' jobs are
stuck, or whose owner is unknown, the command asks Temporal itself (gpuprov/sdk/owners.py).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, FastAPI, Query, Request

from gpuprov.api.auth import ROLE_REFUSALS, require_admin
from gpuprov.store.orphans import OrphansReport, orphans_report
from gpuprov.store.records import Records


def _records(request: Request) -> Records:
    return request.app.state.records


def add_routes(app: FastAPI) -> None:
    """The orphans endpoint, on the app itself (its routes stay one flat list to inspect)."""

    @app.get("/v1/orphans", dependencies=[Depends(require_admin)], responses=ROLE_REFUSALS)
    async def orphans(
        records: Annotated[Records, Depends(_records)],
        include_resolved: Annotated[bool, Query(alias="all")] = False,
    ) -> OrphansReport:
        """Possible orphans (resolved ones too with `all`) and the unfinished machines."""
        return await asyncio.to_thread(orphans_report, records, include_resolved=include_resolved)
