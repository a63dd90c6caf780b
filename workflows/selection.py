"""Choosing offers: cost cap, blocks, and the order they are tried in. Pure functions.

Cheapest known price first, ties broken by offer id; offers without a price go last, and are
rejected outright when the job sets a cost cap (no invented prices, ever).
"""

from __future__ import annotations

from gpuprov.models import Block
from providers.base import Offer

CAP_CURRENCY = "USD"


def cost_cap_reason(offer: Offer, nodes: int, max_hourly_cost: float | None) -> str | None:
    """Why the job's hourly cap rules out `offer` (price is per instance), or None."""
    if max_hourly_cost is None:
        return None
    if offer.price is None:
        return "no reliable price and the job has a cost cap"
    if offer.price.currency != CAP_CURRENCY or offer.price.unit != "hour":
        return f"priced in {offer.price.currency}/{offer.price.unit}; the cap is USD/hour"
    total = offer.price.amount * nodes
    if total > max_hourly_cost:
        return f"{total:.2f} USD/hour for {nodes} node(s) > cap {max_hourly_cost:.2f}"
    return None


def offer_order(offer: Offer) -> tuple[bool, float, str]:
    return (offer.price is None, offer.price.amount if offer.price else 0.0, offer.id)


def rank_offers(
    offers: list[Offer], nodes: int, max_hourly_cost: float | None
) -> tuple[list[Offer], list[str]]:
    """Offers in the order to try them, and "offer: reason" for those the cap rejects."""
    ranked: list[Offer] = []
    rejected: list[str] = []
    for offer in offers:
        reason = cost_cap_reason(offer, nodes, max_hourly_cost)
        if reason is None:
            ranked.append(offer)
        else:
            rejected.append(f"{offer.id}: {reason}")
    unique = {offer.id: offer for offer in ranked}
    return sorted(unique.values(), key=offer_order), rejected


def blocking(blocks: list[Block], offer: Offer) -> Block | None:
    return next((block for block in blocks if block.covers(offer)), None)
