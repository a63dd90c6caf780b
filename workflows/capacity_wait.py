"""Waiting for capacity: when every offer a job may use has failed for capacity or quota, or is
blocked, the job sleeps on a durable timer until the first block on one of them lapses, then
plans again and retries it (workflows/provisioning.py), within `provisioning_timeout_seconds`.

The blocks back off per offering in the database (gpuprov/store/capacity.py), so a job that
waits a day costs a few dozen plans. Pure functions of the job's status; deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from gpuprov.models import Attempt, AttemptOutcome, Block, JobStatus, offering_of
from providers.base import Offer
from providers.errors import ErrorKind

# Failures that come and go by themselves: an offer that failed so is tried again once its
# block lapses. Any other failure rules the offer out for the rest of the job's provisioning.
WAITABLE = frozenset({ErrorKind.CAPACITY, ErrorKind.QUOTA})
LEAST_WAIT_SECONDS = 1.0
# A wait stops, failing the job, once its run's history is this long: well within Temporal's
# 51,200 events per run (a day of waiting on three offers measured 3,280 events).
MOST_EVENTS_WAITING = 40_000


def waitable(attempt: Attempt) -> bool:
    return attempt.outcome is AttemptOutcome.FAILED and attempt.kind in WAITABLE


@dataclass(frozen=True)
class NextTry:
    offer: Offer
    at: datetime

    def seconds_from(self, now: datetime) -> float:
        return max(LEAST_WAIT_SECONDS, math.ceil((self.at - now).total_seconds()))


def next_try(
    offers: list[Offer],
    blocks: list[Block],
    ruled_out: Callable[[Offer], bool],
    refused_until: dict[str, datetime],
) -> NextTry | None:
    """The offer whose blocks (each with an expiry) lapse first, and when; None when every
    offer left is ruled out or blocked for good (a block without expiry)."""
    best: NextTry | None = None
    for offer in offers:
        if ruled_out(offer):
            continue
        covering = [block for block in blocks if block.covers(offer)]
        if any(block.expires_at is None for block in covering):
            continue
        lapses = [block.expires_at for block in covering if block.expires_at is not None]
        if offer.id in refused_until:
            lapses.append(refused_until[offer.id])
        if not lapses:
            continue
        at = max(lapses)
        if best is None or (at, offer.id) < (best.at, best.offer.id):
            best = NextTry(offer, at)
    return best


def out_of_stock(offers: list[Offer], blocks: list[Block]) -> int:
    """How many of `offers` a Capacity or Quota block covers now."""
    return sum(1 for offer in offers if any(b.covers(offer) and b.kind in WAITABLE for b in blocks))


def in_words(seconds: float) -> str:
    """4m, 45s, 1h5m: a wait as the status says it."""
    whole = int(math.ceil(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs and minutes < 5 else f"{minutes}m"
    return f"{secs}s"


def waiting_message(
    offers: list[Offer], status: JobStatus, upcoming: NextTry, now: datetime
) -> str:
    stocked_out = out_of_stock(offers, status.blocks)
    tries = len(status.attempts)
    return (
        f"capacity: {stocked_out} offer(s) out of stock, {tries} tried so far, next try "
        f"{offering_of(upcoming.offer)} in {in_words(upcoming.seconds_from(now))}"
    )


def too_long_message(events: int, status: JobStatus, offers: list[Offer]) -> str:
    tries = len(status.attempts)
    return (
        f"still out of capacity after {tries} tries of {len(offers)} offer(s); the wait has "
        f"{events} history events, the most one run may hold while waiting "
        f"({MOST_EVENTS_WAITING}): submit it again to wait on"
    )
