"""Choosing offers: cost cap, blocks, and the order they are tried in. Pure functions.

Cheapest known price first, ties broken by offer id. Only prices in one currency and unit
(USD per hour) are compared: an offer quoted in another currency or per another unit keeps its
quote but is ordered after every comparable one (among themselves: by currency, unit, amount),
because converting it would need an exchange rate we do not have (no invented prices, ever).
Offers without a price go last, and are rejected outright when the job sets a cost cap.
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


def offer_order(offer: Offer) -> tuple[int, str, str, float, str]:
    """Comparable (USD/hour) prices first, then other currencies or units, then no price."""
    price = offer.price
    if price is None:
        return (2, "", "", 0.0, offer.id)
    if price.currency != CAP_CURRENCY or price.unit != "hour":
        return (1, price.currency, price.unit, price.amount, offer.id)
    return (0, price.currency, price.unit, price.amount, offer.id)


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
