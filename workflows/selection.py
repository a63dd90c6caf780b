"""Choosing offers: cost cap, blocks, and the order they are tried in. Pure functions.

Cheapest known price first, ties broken by offer id. Only prices in one currency and unit
(USD per hour) are compared: an offer quoted in another currency or per another unit keeps its
quote but is ordered after every comparable one (among themselves: by currency, unit, amount),
because converting it would need an exchange rate we do not have (no invented prices, ever).
Offers without a price go last, and are rejected outright when the job sets a cost cap.

`placement.order: ready_time` ranks the offers within the cap by expected time to ready from
the offer statistics instead (`by_ready_time`), offerings with a recent Capacity failure after
the others, ties by the price order above.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpuprov.models import Block, OfferStats, offering_of
from providers.base import Capabilities, Offer

CAP_CURRENCY = "USD"
# A Capacity failure this recent pushes an offering back in the ready_time order.
RECENT_CAPACITY = timedelta(minutes=30)
# An offering that never made its nodes ready counts as this share (its expected time then
# grows by 1 / share, as if each try were a new attempt).
LEAST_SHARE = 0.05


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


def expected_seconds_to_ready(offer: Offer, stats: OfferStats | None, hints: Capabilities) -> float:
    """The median time to ready over the share of attempts that got there (half the provider's
    boot timeout for an offering without a ready attempt on record)."""
    median = stats.ready_p50_seconds if stats is not None else None
    if median is None:
        median = hints.boot_timeout / 2
    share = stats.success_share if stats is not None else None
    return median / max(share if share is not None else 1.0, LEAST_SHARE)


def by_ready_time(
    offers: list[Offer],
    stats: dict[str, OfferStats],
    capabilities: dict[str, Capabilities],
    now: datetime,
) -> list[Offer]:
    """`offers` (already within the cap) ordered by expected time to ready."""

    def key(offer: Offer) -> tuple[bool, float, tuple[int, str, str, float, str]]:
        record = stats.get(offering_of(offer))
        last = record.last_capacity_failure_at if record is not None else None
        recent = last is not None and now - last < RECENT_CAPACITY
        expected = expected_seconds_to_ready(offer, record, capabilities[offer.provider])
        return (recent, expected, offer_order(offer))

    return sorted(offers, key=key)


def hedge_delay(offer: Offer, stats: OfferStats | None, hints: Capabilities) -> float:
    """`hedge.after_seconds: auto`: the offering's p95 time to ready, or half its provider's
    boot timeout without one."""
    if stats is not None and stats.ready_p95_seconds is not None:
        return max(stats.ready_p95_seconds, 1.0)
    return hints.boot_timeout / 2
