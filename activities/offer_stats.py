"""The offer statistics as activities: a job keeps each attempt's outcome and reads what the
kept outcomes say of the offerings it is about to rank (gpuprov/store/offer_stats.py)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from temporalio import activity

from gpuprov.models import AttemptRecord, OfferStats
from gpuprov.store.offer_stats import OfferStatsStore
from providers.base import Model


class OfferStatsQuery(Model):
    now: datetime  # the job's clock: the retention window ends here
    offerings: list[str] | None = None  # None: every offering with kept attempts


class OfferStatsActivities:
    def __init__(self, store: OfferStatsStore) -> None:
        self._store = store

    def all(self) -> list[Any]:
        return [self.record_attempt, self.offer_stats]

    @activity.defn(name="record_attempt")
    async def record_attempt(self, record: AttemptRecord) -> bool:
        """Keep one attempt's outcome (idempotent per job, run and attempt)."""
        return await asyncio.to_thread(self._store.record, record)

    @activity.defn(name="offer_stats")
    async def offer_stats(self, query: OfferStatsQuery) -> list[OfferStats]:
        return await asyncio.to_thread(self._store.stats, query.now, query.offerings)
