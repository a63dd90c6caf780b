"""The scarcity model the scarcity scenario runs against (docs/performance.md, "Time to GPU
when GPUs are scarce"): four offerings, each with a stockout that comes and goes over time and
a boot time drawn from a distribution shaped after published figures, all scaled down so that
one modelled minute is one second.

- **Stockouts.** Each offering alternates between in stock and sold out. Sold-out spells last
  `sold_out_minutes` on average, in-stock ones long enough that the offering is sold out
  `sold_out_share` of the time; both exponential, drawn once per run from the seed, so every
  policy meets the same schedule. A create while sold out fails with Capacity.
- **Boots.** Most boots are log-normal around `boot_minutes` (a cloud launch takes about 2 to 6
  minutes); a share `slow_share` of them take `slow_minutes` (an 8x H100 machine has been seen
  to need 25 minutes to boot). Each create draws one.

The prices are the bench's own (ordered as on-demand prices usually are: the scarcest offering
the cheapest); no provider's price is claimed. Pure and seeded: nothing here does I/O.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import dataclass

SECONDS_PER_MODELLED_MINUTE = 1.0  # one modelled minute is this many seconds of the run
MODELLED_MINUTES_PER_HOUR = 60


@dataclass(frozen=True)
class Offering:
    region: str
    price: float  # USD/hour in the fake cloud's catalogue (the bench's own figure)
    sold_out_share: float  # long-run share of the time it is sold out
    sold_out_minutes: float  # mean length of a sold-out spell
    boot_minutes: float  # median of the usual boots
    boot_sigma: float  # log-normal sigma of the usual boots
    slow_share: float  # share of boots that are slow
    slow_minutes: tuple[float, float]  # a slow boot's length, uniform in this range


# Cheapest first, and the cheaper the scarcer and the longer its tail: the usual trade.
OFFERINGS: tuple[Offering, ...] = (
    Offering("r1", 10.0, 0.45, 15.0, 4.0, 0.25, 0.04, (20.0, 30.0)),
    Offering("r2", 11.0, 0.35, 12.0, 3.5, 0.25, 0.03, (15.0, 25.0)),
    Offering("r3", 12.0, 0.25, 10.0, 3.0, 0.25, 0.02, (10.0, 20.0)),
    Offering("r4", 14.0, 0.15, 8.0, 2.5, 0.20, 0.0, (0.0, 0.0)),
)


@dataclass(frozen=True)
class Spells:
    """When an offering's stock changes: `changes` ascending, in modelled minutes from the
    run's start; sold out in [changes[i], changes[i + 1]) when i is even and `starts_sold_out`,
    or when i is odd and not."""

    starts_sold_out: bool
    changes: tuple[float, ...]

    def sold_out(self, minute: float) -> bool:
        spell = bisect_right(self.changes, minute)  # spells passed so far
        return self.starts_sold_out == (spell % 2 == 0)

    def share_sold_out(self, until: float) -> float:
        """The share of [0, until) spent sold out."""
        sold, at, total = self.starts_sold_out, 0.0, 0.0
        for change in self.changes:
            end = min(change, until)
            total += end - at if sold else 0.0
            at, sold = end, not sold
            if at >= until:
                break
        total += until - at if sold and at < until else 0.0
        return total / until if until > 0 else 0.0


def spells(offering: Offering, seed: int, horizon_minutes: float) -> Spells:
    """The offering's stock over [0, horizon], from the seed (the same for every policy)."""
    rng = random.Random(f"{seed}/stock/{offering.region}")
    in_stock_minutes = offering.sold_out_minutes * (1 - offering.sold_out_share)
    in_stock_minutes /= max(offering.sold_out_share, 1e-9)
    sold = rng.random() < offering.sold_out_share
    starts, at, changes = sold, 0.0, []
    while at < horizon_minutes:
        mean = offering.sold_out_minutes if sold else in_stock_minutes
        at += rng.expovariate(1 / mean)
        changes.append(at)
        sold = not sold
    return Spells(starts, tuple(changes))


class BootTimes:
    """Draws each create's boot time, in modelled minutes, from its offering's distribution."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"{seed}/boots")

    def draw(self, offering: Offering) -> float:
        if self._rng.random() < offering.slow_share:
            low, high = offering.slow_minutes
            return self._rng.uniform(low, high)
        return offering.boot_minutes * math.exp(self._rng.gauss(0.0, offering.boot_sigma))


def by_region(offerings: tuple[Offering, ...] = OFFERINGS) -> dict[str, Offering]:
    return {offering.region: offering for offering in offerings}
