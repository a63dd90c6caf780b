"""The offer statistics: every attempt's outcome kept per offering (`offer_attempts`), and what
they say of each offering: how often it made every node ready, how fast, how often it was sold
out. Plans order by it (`placement.order = "ready_time"`), a hedge's "auto" delay reads its p95,
and `gpuprov offers` shows it.

    OfferStatsStore(db, retention, per_offering)
      .record(record)            one attempt's outcome (again for the same attempt: no-op)
      .stats(now, offerings)     OfferStats per offering over the retention window
      .prune(now, offering)      drop rows past the retention or past `per_offering`

An attempt that lost a race or was abandoned is kept (it shows what hedging cost) but says
nothing of the offering: it neither counts as an attempt nor gives a time to ready.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import col, select

from gpuprov.models import AttemptRecord, ErrorKind, OfferStats
from gpuprov.store.db import NO_RUN, Database, OfferAttempt, dialect_insert, new_id

# Failures that say an offering is sold out, not broken.
_OUT_OF_STOCK = {ErrorKind.CAPACITY.value, ErrorKind.QUOTA.value}
# Outcomes that say something about the offering itself.
_JUDGED = {"ready", "failed"}


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile of `values` (`share` in 0..1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class OfferStatsStore:
    db: Database
    retention: timedelta = timedelta(days=14)
    per_offering: int = 500

    def record(self, record: AttemptRecord) -> bool:
        """Keep one attempt's outcome, and prune its offering; False when this attempt of this
        run was already kept (a retried activity)."""
        insert = dialect_insert(self.db.dialect)
        values = record.model_dump(mode="python")
        values["run"] = record.run or NO_RUN
        values["kind"] = record.kind.value if record.kind else None
        statement = insert(OfferAttempt).values(id=new_id(), **values)
        statement = statement.on_conflict_do_nothing(
            index_elements=["job", "run", "attempt"]
        ).returning(OfferAttempt.id)
        with self.db.session() as session:
            written = session.execute(statement).first() is not None
            session.commit()
        if written:
            self.prune(record.ended_at, record.offering)
        return bool(written)

    def stats(self, now: datetime, offerings: Iterable[str] | None = None) -> list[OfferStats]:
        """What the kept attempts since `now - retention` say of each offering (every offering
        with a row, or those named), newest `per_offering` attempts of each."""
        since = now - self.retention
        query = select(OfferAttempt).where(col(OfferAttempt.ended_at) >= since)
        if offerings is not None:
            wanted = sorted(set(offerings))
            if not wanted:
                return []
            query = query.where(col(OfferAttempt.offering).in_(wanted))
        query = query.order_by(col(OfferAttempt.offering), col(OfferAttempt.ended_at).desc())
        with self.db.session() as session:
            rows = list(session.exec(query))
        grouped: dict[str, list[OfferAttempt]] = {}
        for row in rows:
            kept = grouped.setdefault(row.offering, [])
            if len(kept) < self.per_offering:
                kept.append(row)
        return [_summarise(offering, kept) for offering, kept in sorted(grouped.items())]

    def prune(self, now: datetime, offering: str | None = None) -> int:
        """Drop rows older than the retention, then each offering's beyond the newest
        `per_offering` (every offering's, or `offering`'s); the number of rows dropped."""
        dropped = 0
        scope = [] if offering is None else [OfferAttempt.offering == offering]
        with self.db.session() as session:
            stale = sa.delete(OfferAttempt).where(
                col(OfferAttempt.ended_at) < now - self.retention, *scope
            )
            dropped += session.execute(stale).rowcount
            crowded = session.exec(
                select(OfferAttempt.offering)
                .where(*scope)
                .group_by(col(OfferAttempt.offering))
                .having(sa.func.count() > self.per_offering)
            ).all()
            for offering in crowded:
                keep = (
                    select(OfferAttempt.id)
                    .where(OfferAttempt.offering == offering)
                    .order_by(col(OfferAttempt.ended_at).desc(), col(OfferAttempt.id))
                    .limit(self.per_offering)
                )
                dropped += session.execute(
                    sa.delete(OfferAttempt).where(
                        OfferAttempt.offering == offering,
                        col(OfferAttempt.id).not_in(keep.scalar_subquery()),
                    )
                ).rowcount
            session.commit()
        return dropped


def _summarise(offering: str, rows: list[OfferAttempt]) -> OfferStats:
    newest = rows[0]
    judged = [row for row in rows if row.outcome in _JUDGED]
    ready = [row for row in judged if row.outcome == "ready"]
    failed = [row for row in judged if row.outcome == "failed"]
    stocked_out = [row for row in failed if row.kind in _OUT_OF_STOCK]
    times = [row.seconds_to_ready for row in ready if row.seconds_to_ready is not None]
    return OfferStats(
        offering=offering,
        provider=newest.provider,
        region=newest.region,
        instance_type=newest.instance_type,
        spot=newest.spot,
        attempts=len(judged),
        ready=len(ready),
        capacity_failures=len(stocked_out),
        other_failures=len(failed) - len(stocked_out),
        success_share=len(ready) / len(judged) if judged else None,
        ready_p50_seconds=percentile(times, 0.5),
        ready_p95_seconds=percentile(times, 0.95),
        last_capacity_failure_at=max((row.ended_at for row in stocked_out), default=None),
        last_attempt_at=max((row.ended_at for row in judged), default=None),
    )
