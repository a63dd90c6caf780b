"""Prices for offers, only from AWS: never invented, None where AWS does not say.

- On-demand: Price List `GetProducts` (endpoint in us-east-1), one query per (region, type),
  filtered to shared-tenancy Linux with no pre-installed software, capacity status "Used";
  the hourly USD price of the OnDemand term. Cached for `cache_seconds` (list prices change
  rarely, and the Price List API is rate-limited); a failed lookup is retried after 5 minutes.
- Spot: EC2 `DescribeSpotPriceHistory` for Linux/UNIX from now: the newest price per
  (type, zone). Read on every plan (spot prices move).

A lookup that fails leaves its offers unpriced (logged), and never fails the plan.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from providers.aws import parse
from providers.aws.client import Ec2Api
from providers.base import PriceQuote, price_quote
from providers.errors import ProviderError, redact

log = logging.getLogger(__name__)

ON_DEMAND_SOURCE = "aws:pricing/GetProducts"
SPOT_SOURCE = "aws:ec2/DescribeSpotPriceHistory"
FAILED_LOOKUP_TTL = 300.0
CONCURRENT_LOOKUPS = 4
# The one on-demand SKU a plain Linux instance is billed under.
_PRODUCT_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "licenseModel": "No License required",
}


class Prices:
    def __init__(
        self, api: Ec2Api, cache_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._api = api
        self._ttl = cache_seconds
        self._clock = clock
        self._on_demand: dict[tuple[str, str], tuple[float, PriceQuote | None]] = {}
        self._limit = asyncio.Semaphore(CONCURRENT_LOOKUPS)

    async def on_demand(self, region: str, types: list[str]) -> dict[str, PriceQuote | None]:
        """The on-demand quote of each type in `region` (None where unknown)."""
        quotes = await asyncio.gather(*(self._on_demand_one(region, t) for t in types))
        return dict(zip(types, quotes, strict=True))

    async def spot(self, region: str, types: list[str]) -> dict[tuple[str, str], PriceQuote]:
        """The current spot quote per (type, zone) in `region`; missing where unknown."""
        if not types:
            return {}
        try:
            history = await self._api.pages(
                region,
                "DescribeSpotPriceHistory",
                "SpotPriceHistory",
                InstanceTypes=types,
                ProductDescriptions=["Linux/UNIX"],
                StartTime=datetime.now(UTC),
            )
        except ProviderError as error:
            said = redact(error.message, self._api.secrets())
            log.warning("aws: no spot prices for %s: %s", region, said)
            return {}
        now = datetime.now(UTC)
        return {
            key: quote
            for key, amount in parse.spot_prices(history).items()
            if (quote := price_quote(amount, source=SPOT_SOURCE, observed_at=now)) is not None
        }

    async def _on_demand_one(self, region: str, instance_type: str) -> PriceQuote | None:
        key = (region, instance_type)
        cached = self._on_demand.get(key)
        if cached is not None and cached[0] > self._clock():
            return cached[1]
        async with self._limit:
            quote, ttl = await self._look_up(region, instance_type)
        self._on_demand[key] = (self._clock() + ttl, quote)
        return quote

    async def _look_up(self, region: str, instance_type: str) -> tuple[PriceQuote | None, float]:
        filters = {"instanceType": instance_type, "regionCode": region, **_PRODUCT_FILTERS}
        try:
            entries = await self._api.price_pages(
                ServiceCode="AmazonEC2",
                FormatVersion="aws_v1",
                Filters=[
                    {"Type": "TERM_MATCH", "Field": field, "Value": value}
                    for field, value in filters.items()
                ],
            )
        except ProviderError as error:
            said = redact(error.message, self._api.secrets())
            log.warning("aws: no on-demand price for %s in %s: %s", instance_type, region, said)
            return None, min(self._ttl, FAILED_LOOKUP_TTL)
        amount = parse.on_demand_price(entries, instance_type, region)
        if amount is None:
            return None, min(self._ttl, FAILED_LOOKUP_TTL)
        quote = price_quote(amount, source=ON_DEMAND_SOURCE, observed_at=datetime.now(UTC))
        return quote, self._ttl
