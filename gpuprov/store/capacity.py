"""Capacity that comes and goes, shared by every job: the backoff of a stockout's block and the
launch budget of an offering that keeps failing (columns of the `blocks` table).

- The backoff (`CapacityBackoff`): a Capacity block lasts `initial` doubled per strike, at most
  `longest`. A strike is a Capacity failure once the previous block on the key has lapsed
  (a failure that lands while the block is still active, from an attempt started before it,
  does not count again); a quiet spell of `forget_after` past the block's lapse, or a success,
  starts over at one strike. So a job that waits a day for a sold-out offering costs a few
  dozen tries, and a hundred jobs failing at once count as one strike.
- The launch budget (`LaunchBudget.claim`): once a block with strikes has lapsed, at most
  `probes` creates per `window` are granted on its key across every job; the others wait for
  the probe's outcome (a new block, or `came_back` when it made its nodes ready).
Every write is one conditional UPDATE, so two processes never both take the last probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import col, select

from gpuprov.store.db import BlockRecord, Database, UtcDateTime

OFFER_SCOPE = "offer"


def _update() -> sa.Update:
    return sa.update(BlockRecord).execution_options(synchronize_session=False)


def _at(moment: datetime) -> sa.BindParameter[datetime]:
    return sa.literal(moment, UtcDateTime())


@dataclass(frozen=True)
class CapacityBackoff:
    initial: timedelta = timedelta(minutes=2)
    longest: timedelta = timedelta(minutes=30)

    @property
    def forget_after(self) -> timedelta:
        """A lapsed block's strikes count this long after it lapsed."""
        return 2 * self.longest

    def ttl(self, strikes: int) -> timedelta:
        doubled = self.initial * (2 ** min(max(strikes, 1) - 1, 30))
        return min(doubled, max(self.longest, self.initial))

    def strikes_after_failure(self, row: BlockRecord | None, now: datetime) -> int:
        """The key's strikes once a Capacity failure at `now` is counted."""
        if row is None or row.strikes == 0:
            return 1
        if row.expires_at > now:  # still blocked: an attempt started before the block
            return row.strikes
        if now - row.expires_at > self.forget_after:
            return 1
        return row.strikes + 1


@dataclass(frozen=True)
class Grant:
    """A launch budget's answer: go ahead (`probe`: this create tests a key with strikes, and
    its outcome is the others' signal), or wait until `retry_at`."""

    granted: bool
    probe: bool = False
    retry_at: datetime | None = None


@dataclass(frozen=True)
class LaunchBudget:
    db: Database
    probes: int = 2
    window: timedelta = timedelta(minutes=1)

    def claim(self, key: str, now: datetime) -> Grant:
        """May a create start on offer `key` at `now`? Free where the key has no strikes."""
        lapsed = (
            col(BlockRecord.scope) == OFFER_SCOPE,
            col(BlockRecord.key) == key,
            col(BlockRecord.strikes) > 0,
            col(BlockRecord.expires_at) <= now,
        )
        open_window = col(BlockRecord.probe_window_start) > now - self.window
        with self.db.session() as session:
            taken = session.exec(  # type: ignore[call-overload]
                _update()
                .where(*lapsed, open_window, col(BlockRecord.probes) < self.probes)
                .values(probes=BlockRecord.probes + 1)
            ).rowcount
            if not taken:
                taken = session.exec(  # type: ignore[call-overload]
                    _update()
                    .where(
                        *lapsed, sa.or_(col(BlockRecord.probe_window_start).is_(None), ~open_window)
                    )
                    .values(probes=1, probe_window_start=_at(now))
                ).rowcount
            session.commit()
            if taken:
                return Grant(granted=True, probe=True)
            row = session.exec(
                select(BlockRecord).where(
                    col(BlockRecord.scope) == OFFER_SCOPE, col(BlockRecord.key) == key
                )
            ).one_or_none()
        if row is None or row.strikes == 0:
            return Grant(granted=True)
        if row.expires_at > now:  # a probe failed meanwhile: blocked again
            return Grant(granted=False, retry_at=row.expires_at)
        start = row.probe_window_start or now
        return Grant(granted=False, retry_at=start + self.window)

    def came_back(self, key: str) -> None:
        """A create on `key` made its nodes ready: its strikes and probes start over."""
        with self.db.session() as session:
            session.exec(  # type: ignore[call-overload]
                _update()
                .where(col(BlockRecord.scope) == OFFER_SCOPE, col(BlockRecord.key) == key)
                .values(strikes=0, probes=0, probe_window_start=None)
            )
            session.commit()
