"""PlanOffers: what `gpuprov offers` shows, planned on the worker that holds the credentials.

Uses the same plan activity, compatibility filter and ranking as ProvisionJob, so the list a
user sees is the order a job would try; beside it, what the kept attempts say of each offering
(the offer statistics: how often it was ready, how fast, how often sold out).
"""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.cloud import CloudActivities, PlanInput
    from activities.errors import StepFailure
    from activities.offer_stats import OfferStatsActivities, OfferStatsQuery
    from gpuprov import contract
    from gpuprov.contract import OffersQuery, OffersResult
    from gpuprov.models import offering_of
    from providers.base import Offer
    from workflows.selection import rank_offers
    from workflows.steps import run_step


# Reading the offer statistics added an activity to a finished plan.
OFFER_STATS = "offer-stats"


@workflow.defn(name=contract.PLAN_OFFERS)
class PlanOffers:
    @workflow.run
    async def run(self, query: OffersQuery) -> OffersResult:
        # Asked before any command, so that its marker is always in the first workflow task.
        with_stats = workflow.patched(OFFER_STATS)
        capabilities, skipped = await asyncio.gather(
            run_step(CloudActivities.describe_providers),
            run_step(CloudActivities.skipped_providers),
        )
        allowed = query.request.providers
        providers = [p for p in sorted(capabilities) if allowed is None or p in allowed]
        result = OffersResult(
            skipped={p: why for p, why in skipped.items() if allowed is None or p in allowed}
        )
        plans = await asyncio.gather(
            *(self._plan(PlanInput(provider=p, request=query.request), result) for p in providers)
        )
        offers = [offer for plan in plans for offer in plan]
        ranked, rejected = rank_offers(offers, query.nodes, query.max_hourly_cost)
        result.offers = ranked
        result.rejected += rejected
        if ranked and with_stats:
            found = await run_step(
                OfferStatsActivities.offer_stats,
                OfferStatsQuery(
                    now=workflow.now(), offerings=sorted({offering_of(o) for o in ranked})
                ),
            )
            result.stats = {record.offering: record for record in found}
        return result

    async def _plan(self, request: PlanInput, result: OffersResult) -> list[Offer]:
        try:
            plan = await run_step(
                CloudActivities.plan, request, summary=f"plan on {request.provider}"
            )
        except StepFailure as failure:
            result.errors.append(f"{request.provider}: {failure}")
            return []
        result.rejected += plan.rejected
        return plan.offers
