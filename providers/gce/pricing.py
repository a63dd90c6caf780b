"""Prices from the Cloud Billing Catalog, matched by SKU id, never by guessing.

`GET <billing_base_url>/services/6F81-5844-456A/skus?currencyCode=USD` lists every Compute
Engine SKU (paginated). A GCE machine is billed as several SKUs (the GPU, the series' vCPU
core and RAM, for N1 the attached GPU), and matching them by description text is fragile (names
and geographies differ by series and change), so this adapter does not guess: each catalogue
entry names its components (`price_skus`, `spot_price_skus`): a quantity and the SKU ids that
may bill it, typically one per geography. An offer's price is the sum over components of
quantity x list price, and it exists only when EVERY component has exactly one of its SKUs that

- is in the catalogue, priced in USD per hour (`h`) or per GiB-hour (`GiBy.h`) with one
  effective price and one first tier,
- lists the offer's region in `serviceRegions`, and
- has the usage type of the offer (`OnDemand`, or `Preemptible` for Spot).

Otherwise the offer's price is None. List prices only: no discounts, no sustained use, no
disk or network. The catalogue is cached per adapter for `price_cache_seconds`; when it cannot
be read (e.g. the Cloud Billing API is not enabled), offers are unpriced and a warning is logged.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from providers.base import PriceQuote, price_quote
from providers.errors import ProviderError, redact
from providers.gce.client import GceClient
from providers.gce.config import PriceComponent
from providers.gce.parse import Sku, SkuList, read

log = logging.getLogger(__name__)

COMPUTE_SERVICE = "6F81-5844-456A"  # Compute Engine's service id in the Billing Catalog
CURRENCY = "USD"
HOURLY_UNITS = frozenset({"h", "GiBy.h"})
PAGE_SIZE = 5000


class PriceBook:
    """The SKUs the catalogue names, read from the Billing Catalog and cached."""

    def __init__(self, client: GceClient, billing_base_url: str, ttl: float) -> None:
        self._client = client
        self._url = f"{billing_base_url.rstrip('/')}/services/{COMPUTE_SERVICE}/skus"
        self._ttl = ttl
        self._skus: dict[str, Sku] = {}
        self._read_at: float | None = None  # monotonic
        self._observed_at = datetime.now(UTC)

    @property
    def source(self) -> str:
        return f"cloudbilling.googleapis.com/v1/services/{COMPUTE_SERVICE}/skus"

    async def refresh(self, wanted: set[str]) -> None:
        """Read the catalogue when the cache is older than the TTL; keep the SKUs in `wanted`."""
        fresh = self._read_at is not None and time.monotonic() - self._read_at < self._ttl
        if not wanted or fresh:
            return
        found: dict[str, Sku] = {}
        action = "list Cloud Billing SKUs"
        try:
            async for page in self._client.pages(
                self._url, action, params={"currencyCode": CURRENCY, "pageSize": PAGE_SIZE}
            ):
                for sku in read(SkuList, page, action).skus:
                    if sku.skuId in wanted:
                        found[sku.skuId] = sku
        except ProviderError as error:
            said = redact(error.message, self._client.secrets())
            log.warning("GCE prices unavailable (offers stay unpriced): %s", said)
            return
        if missing := sorted(wanted - found.keys()):
            log.warning("GCE price SKUs not in the Billing Catalog: %s", ", ".join(missing))
        self._skus = found
        self._read_at = time.monotonic()
        self._observed_at = datetime.now(UTC)

    def quote(self, components: list[PriceComponent], region: str, spot: bool) -> PriceQuote | None:
        """Sum of quantity x hourly list price, or None unless every component matches."""
        if not components:
            return None
        usage_type = "Preemptible" if spot else "OnDemand"
        total = 0.0
        for component in components:
            rates = [
                rate
                for sku in component.skus
                if (rate := _hourly_rate(self._skus.get(sku), region, usage_type)) is not None
            ]
            if len(rates) != 1:  # none serves this region, or several do: no reliable price
                return None
            total += component.quantity * rates[0]
        return price_quote(
            round(total, 6),
            currency=CURRENCY,
            unit="hour",
            source=self.source,
            observed_at=self._observed_at,
        )


def _hourly_rate(sku: Sku | None, region: str, usage_type: str) -> float | None:
    if sku is None or region not in sku.serviceRegions:
        return None
    if sku.category is None or sku.category.usageType != usage_type:
        return None
    if len(sku.pricingInfo) != 1:  # several effective prices at once: not reliable
        return None
    expression = sku.pricingInfo[0].pricingExpression
    if expression.usageUnit not in HOURLY_UNITS:
        return None
    first = [t for t in expression.tieredRates if t.startUsageAmount == 0]
    if len(first) != 1 or first[0].unitPrice.currencyCode != CURRENCY:
        return None
    return first[0].unitPrice.amount
