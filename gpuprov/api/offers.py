"""The offer statistics, as the API shows them:

    GET /v1/offers/stats                      every offering with a kept attempt
    GET /v1/offers/stats?offering=KEY&...     the offerings named (provider/region/type[:spot])

Any operator key (a viewer's too): offerings belong to no team. The answer is each offering's
`gpuprov.models.OfferStats` (recent success share, stockouts, p50/p95 seconds from create to
every node ready), read from the database over the retention `[jobs]` sets, as `gpuprov offers`
shows them beside the prices.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Annotated

from fastapi import Depends, FastAPI, Query, Request
from pydantic import StringConstraints

from gpuprov.api.auth import ROLE_REFUSALS, require_viewer
from gpuprov.config import JobsSettings
from gpuprov.models import OfferStats
from gpuprov.store.db import utcnow
from gpuprov.store.offer_stats import OfferStatsStore

# provider/region/instance type, with ":spot" for spot: what offering_key writes.
OFFERING_PATTERN = r"^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+/[A-Za-z0-9._-]+(:spot)?$"
OfferingKey = Annotated[str, StringConstraints(pattern=OFFERING_PATTERN, max_length=256)]


def _store(request: Request) -> OfferStatsStore:
    retention, per_offering = request.app.state.offer_stats_bounds
    return OfferStatsStore(request.app.state.records.db, retention, per_offering)


def add_routes(app: FastAPI, jobs: JobsSettings) -> None:
    """The offer statistics endpoint, on the app itself."""
    retention = timedelta(days=jobs.offer_stats_retention_days)
    app.state.offer_stats_bounds = (retention, jobs.offer_stats_per_offering)

    @app.get("/v1/offers/stats", dependencies=[Depends(require_viewer)], responses=ROLE_REFUSALS)
    async def offer_stats(
        offers: Annotated[OfferStatsStore, Depends(_store)],
        offering: Annotated[list[OfferingKey] | None, Query(max_length=64)] = None,
    ) -> list[OfferStats]:
        """Each offering's recent attempts, summarised (those named, or every one kept)."""
        return await asyncio.to_thread(offers.stats, utcnow(), offering)
