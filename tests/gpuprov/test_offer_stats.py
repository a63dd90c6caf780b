"""The offer statistics (gpuprov/store/offer_stats.py) on a real database: SQLite and
PostgreSQL 15 (conftest's `database` fixture runs each test on both)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from gpuprov.api.app import create_app
from gpuprov.models import AttemptRecord, ErrorKind, OfferStats, offering_key
from gpuprov.store.credentials import Credentials
from gpuprov.store.db import Database
from gpuprov.store.offer_stats import OfferStatsStore, percentile
from gpuprov.store.records import Records

pytestmark = pytest.mark.slow  # PostgreSQL too: docs/testing.md, "The fast lane"

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
EAST = offering_key("fake", "us-east-1", "gpu8", False)
WEST = offering_key("fake", "us-west-2", "gpu8", False)


def _record(attempt: int, outcome: str, *, offering: str = EAST, job: str = "train", **extra):
    provider, region, instance_type = offering.split("/")
    ended = extra.pop("ended_at", T0 + timedelta(minutes=attempt))
    return AttemptRecord(
        offering=offering,
        provider=provider,
        region=region,
        instance_type=instance_type,
        job=job,
        run="abc123",
        attempt=attempt,
        outcome=outcome,
        started_at=ended - timedelta(seconds=extra.get("seconds_to_ready") or 5),
        ended_at=ended,
        **extra,
    )


def test_percentile_is_the_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([30.0], 0.95) == 30.0
    assert percentile([float(v) for v in range(1, 101)], 0.95) == 95.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0


def test_an_offering_s_record_counts_ready_sold_out_and_broken_apart(database: Database):
    store = OfferStatsStore(database)
    for attempt, seconds in enumerate([60.0, 90.0, 120.0, 600.0]):
        store.record(_record(attempt, "ready", seconds_to_ready=seconds))
    store.record(_record(10, "failed", kind=ErrorKind.CAPACITY, step="create"))
    store.record(_record(11, "failed", kind=ErrorKind.QUOTA, step="create"))
    store.record(_record(12, "failed", kind=ErrorKind.UNAVAILABLE, step="observe"))
    store.record(_record(13, "lost_race"))  # beaten by a hedge: says nothing of the offering
    store.record(_record(14, "abandoned"))
    store.record(_record(20, "ready", offering=WEST, seconds_to_ready=30.0))

    east, west = store.stats(T0 + timedelta(hours=1))

    assert (east.offering, west.offering) == (EAST, WEST)
    assert (east.attempts, east.ready, east.capacity_failures, east.other_failures) == (7, 4, 2, 1)
    assert east.success_share == pytest.approx(4 / 7)
    assert (east.ready_p50_seconds, east.ready_p95_seconds) == (90.0, 600.0)
    assert east.last_capacity_failure_at == T0 + timedelta(minutes=11)
    assert east.last_attempt_at == T0 + timedelta(minutes=12)
    assert (west.attempts, west.ready_p50_seconds, west.success_share) == (1, 30.0, 1.0)
    assert store.stats(T0 + timedelta(hours=1), [WEST]) == [west]
    assert store.stats(T0, []) == []


def test_the_same_attempt_is_kept_once(database: Database):
    store = OfferStatsStore(database)
    assert store.record(_record(1, "ready", seconds_to_ready=50.0))
    # A retried activity, or a reset that replays the attempt's end: still one row.
    assert not store.record(_record(1, "ready", seconds_to_ready=50.0))
    another_job = _record(1, "failed", job="other", kind=ErrorKind.CAPACITY)
    assert store.record(another_job)
    (stats,) = store.stats(T0 + timedelta(hours=1))
    assert (stats.attempts, stats.ready, stats.capacity_failures) == (2, 1, 1)


def test_old_attempts_lapse_and_each_offering_keeps_its_newest(database: Database):
    store = OfferStatsStore(database, retention=timedelta(days=1), per_offering=3)
    store.record(_record(0, "failed", kind=ErrorKind.CAPACITY, ended_at=T0 - timedelta(days=2)))
    for attempt in range(1, 6):
        store.record(_record(attempt, "ready", seconds_to_ready=float(attempt)))
    store.record(_record(1, "ready", offering=WEST, seconds_to_ready=9.0))

    east, west = store.stats(T0 + timedelta(hours=1))

    # Pruned on write: the two-day-old sold-out attempt and the two oldest ready ones.
    assert (east.attempts, east.capacity_failures, east.ready_p50_seconds) == (3, 0, 4.0)
    assert west.attempts == 1
    assert store.prune(T0 + timedelta(days=3)) == 4  # every row is past the day now
    assert store.stats(T0 + timedelta(days=3)) == []


async def test_an_operator_reads_the_statistics_over_the_api(records: Records, database: Database):
    store = OfferStatsStore(database)
    store.record(_record(1, "ready", seconds_to_ready=40))
    store.record(_record(2, "failed", kind=ErrorKind.CAPACITY, step="create"))
    store.record(_record(1, "ready", offering=WEST, job="eval", seconds_to_ready=90))
    _, key = Credentials(database).create_operator_key("ops")
    transport = httpx.ASGITransport(app=create_app(records))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
        headers = {"Authorization": f"Bearer {key}"}
        everything = await api.get("/v1/offers/stats", headers=headers)
        east = await api.get("/v1/offers/stats", params={"offering": EAST}, headers=headers)
        refused = await api.get("/v1/offers/stats")
        malformed = await api.get("/v1/offers/stats", params={"offering": "x"}, headers=headers)

    assert everything.status_code == 200, everything.text
    stats = [OfferStats.model_validate(item) for item in everything.json()]
    assert [(s.offering, s.attempts, s.ready, s.capacity_failures) for s in stats] == [
        (EAST, 2, 1, 1),
        (WEST, 1, 1, 0),
    ]
    assert [OfferStats.model_validate(item).offering for item in east.json()] == [EAST]
    assert refused.status_code == 401
    assert malformed.status_code == 422 and "offering" in malformed.text
