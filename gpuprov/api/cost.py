"""What jobs cost, as the API shows it:

    GET /v1/cost            every job, per provider: hourly estimates and actual totals
    GET /v1/cost?job=NAME   the same for one job, and each of its machines

Operators only (an API key). The answer is `gpuprov.store.costs.CostReport`, read from the database
as `gpuprov cost` reads it: estimates, actuals summed per currency (never across currencies),
and the machines that have no actual and why (no quote, kept, not gone yet).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Query, Request

from gpuprov.api.auth import REFUSALS, require_operator
from gpuprov.store.costs import CostReport, cost_report
from gpuprov.store.records import Records
from gpuprov.store.runs import NO_SUCH_RUN, RUN_PATTERN, RunNotFound


def _records(request: Request) -> Records:
    return request.app.state.records


def add_routes(app: FastAPI) -> None:
    """The cost endpoint, on the app itself (its routes stay one flat list to inspect)."""

    @app.get(
        "/v1/cost",
        dependencies=[Depends(require_operator)],
        responses={**REFUSALS, **NO_SUCH_RUN},
    )
    async def cost(
        records: Annotated[Records, Depends(_records)],
        job: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
        run: Annotated[str | None, Query(pattern=RUN_PATTERN)] = None,
    ) -> CostReport:
        """Every job's costs, or one job's (its latest run, or the run `run` names)."""
        try:
            return await asyncio.to_thread(cost_report, records.db, job, run)
        except RunNotFound as unknown:
            raise HTTPException(404, str(unknown)) from None
