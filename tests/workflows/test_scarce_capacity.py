"""Getting GPUs when they are scarce (workflows/capacity_wait.py, workflows/hedge.py): a job
waits for a sold-out offering to come back, a hedged job races a second offer against a slow
first one and tears the loser down, and every attempt's outcome lands in the offer statistics.
Real Temporal dev server, the fake cloud, a real SQLite database."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client

from gpuprov.cli.render import status_text
from gpuprov.config import FaultRule, JobsSettings
from gpuprov.engine.worker import open_records
from gpuprov.models import AttemptOutcome, ErrorKind, JobState
from gpuprov.store.db import utcnow
from gpuprov.store.offer_stats import OfferStatsStore
from gpuprov.store.records import Records
from tests.helpers import (
    assert_nothing_left,
    assert_one_create_per_vm,
    eventually,
    fake_worker,
    fast_cloud,
    job,
    ready_then_release,
    until,
)
from workflows import capacity_wait

OFFER_A, OFFER_B = "fake/r1-a/gpu8", "fake/r1-b/gpu8"
# A stockout's block lasts a second here (two minutes, doubling, in production).
QUICK_BACKOFF = JobsSettings(capacity_backoff_seconds=1, capacity_backoff_max_seconds=1)


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Iterator[Records]:
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    yield records
    records.db.dispose()


def _stats(records: Records) -> dict[str, tuple[int, int, int]]:
    """(attempts, ready, sold out) per offering."""
    store = OfferStatsStore(records.db)
    return {s.offering: (s.attempts, s.ready, s.capacity_failures) for s in store.stats(utcnow())}


async def test_a_sold_out_job_waits_and_gets_its_gpus_when_capacity_comes_back(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    # Every create fails for capacity four times (each offer tried, then one tried again),
    # then the cloud has stock again. The backoff is a second here, so the wait is short.
    stockout = FaultRule(primitive="create", kind=ErrorKind.CAPACITY, times=4, message="sold out")
    async with fake_worker(
        client, task_queue, fast_cloud([stockout]), sqlite_records, jobs=QUICK_BACKOFF
    ) as (gp, cloud):
        handle = await gp.submit(job(job_name))
        waiting = await until(handle, lambda s: (s.waiting_for or "").startswith("capacity: "))
        assert "out of stock" in waiting.waiting_for and "next try fake/" in waiting.waiting_for
        at_ready, final = await ready_then_release(handle)
        assert at_ready.state is JobState.READY, at_ready.error
        outcomes = [(a.offer.id, a.outcome, a.kind) for a in at_ready.attempts]
        assert [o for o in outcomes if o[1] is AttemptOutcome.FAILED] == [
            (offer, AttemptOutcome.FAILED, ErrorKind.CAPACITY) for offer, _, _ in outcomes[:4]
        ]
        assert outcomes[-1][1] is AttemptOutcome.SUCCEEDED
        assert len({offer for offer, _, _ in outcomes}) < len(outcomes)  # one was tried again
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)
        stats = _stats(sqlite_records)
        assert sum(s[2] for s in stats.values()) == 4  # each stockout kept, once
        assert sum(s[1] for s in stats.values()) == 1


async def test_a_job_without_the_capacity_wait_fails_once_every_offer_sold_out(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    stockout = FaultRule(primitive="create", kind=ErrorKind.CAPACITY, times=3)
    async with fake_worker(client, task_queue, fast_cloud([stockout]), sqlite_records) as (gp, _):
        spec = job(job_name, placement={"capacity_wait": False})
        final = await asyncio.wait_for((await gp.submit(spec)).result(), 60)
        assert final.state is JobState.FAILED
        assert "every offer failed (3 tried)" in (final.error or "")


async def test_a_hedge_races_a_slow_first_offer_and_tears_the_loser_down(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    # The cheapest offer's machine never boots; the hedge starts the next offer a second later.
    hang = FaultRule(primitive="create", effect="boot_hang", offer=OFFER_A)
    async with fake_worker(client, task_queue, fast_cloud([hang]), sqlite_records) as (gp, cloud):
        spec = job(job_name, placement={"hedge": {"max_parallel": 2, "after_seconds": 1}})
        at_ready, final = await ready_then_release(await gp.submit(spec))
        assert at_ready.state is JobState.READY, at_ready.error
        first, second = at_ready.attempts
        assert (first.offer.id, first.outcome, first.hedge) == (
            OFFER_A,
            AttemptOutcome.LOST_RACE,
            False,
        )
        assert (second.offer.id, second.outcome, second.hedge) == (
            OFFER_B,
            AttemptOutcome.SUCCEEDED,
            True,
        )
        assert first.cost is not None and first.cost.unit == "total" and first.cost.amount > 0
        shown = status_text(at_ready)  # `gpuprov status`
        assert "(hedge)" in shown and f"cost {first.cost.amount:.2f} USD" in shown
        assert f"hedges: 1 started; the losing attempts cost {first.cost.amount:.2f} USD" in shown
        assert at_ready.blocks == [] or all(b.key != OFFER_A for b in at_ready.blocks)
        assert at_ready.nodes[-1].provider == "fake" and at_ready.nodes[-1].zone == "r1-b"
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)
        assert_one_create_per_vm(cloud)
        assert len(cloud.state.creates_per_vm()) == 2  # the loser was created, then deleted
        # Both zones are one offering; the loser's outcome is kept but says nothing of it.
        assert _stats(sqlite_records) == {"fake/r1/gpu8": (1, 1, 0)}


async def test_a_hedge_stops_at_its_extra_cost_bound(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    # Both r1 offers hang: the first hedge loses, and its cost spends the bound, so no third
    # attempt starts beside the second; the job's deadline ends it with nothing left.
    hangs = [FaultRule(primitive="create", effect="boot_hang", region="r1")]
    async with fake_worker(client, task_queue, fast_cloud(hangs), sqlite_records) as (gp, cloud):
        spec = job(
            job_name,
            provisioning_timeout_seconds=8,
            placement={
                "hedge": {"max_parallel": 2, "after_seconds": 1, "max_extra_cost": 0.000001}
            },
        )
        handle = await gp.submit(spec)
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.FAILED
        assert "provisioning timed out" in (final.error or "")
        started = [a.offer.id for a in final.attempts]
        assert len(started) == 2, started  # the leading attempt and one hedge, never a third
        assert_nothing_left(cloud)


async def test_a_cancel_mid_race_tears_every_attempt_down(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    hangs = [FaultRule(primitive="create", effect="boot_hang")]
    async with fake_worker(client, task_queue, fast_cloud(hangs), sqlite_records) as (gp, cloud):
        spec = job(job_name, placement={"hedge": {"max_parallel": 3, "after_seconds": 0.5}})
        handle = await gp.submit(spec)
        await eventually(lambda: len(cloud.live_instances()) == 3, "three attempts racing")
        await handle.cancel()
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.CANCELLED
        assert_nothing_left(cloud)
        assert_one_create_per_vm(cloud)


async def test_ready_time_order_prefers_the_offering_that_is_ready_sooner(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    # r1 (cheaper) keeps stocking out; after two jobs learn that, a ready_time job goes to r2
    # first while a price-ordered job still starts at r1.
    stockout = FaultRule(primitive="create", kind=ErrorKind.CAPACITY, region="r1")
    async with fake_worker(
        client, task_queue, fast_cloud([stockout]), sqlite_records, jobs=QUICK_BACKOFF
    ) as (gp, _cloud):
        for n in range(2):
            spec = job(f"{job_name[:30]}-l{n}", placement={"capacity_wait": False})
            at_ready, _ = await ready_then_release(await gp.submit(spec))
            assert at_ready.state is JobState.READY
        await asyncio.sleep(2.5)  # the stockouts' blocks lapse: ranking alone decides
        fast = job(
            f"{job_name[:30]}-fast", placement={"order": "ready_time", "capacity_wait": False}
        )
        at_ready, _ = await ready_then_release(await gp.submit(fast))
        assert [a.offer.region for a in at_ready.attempts] == ["r2"]
        cheap = job(f"{job_name[:30]}-cheap", placement={"capacity_wait": False})
        at_ready, _ = await ready_then_release(await gp.submit(cheap))
        assert at_ready.attempts[0].offer.region == "r1"


def test_the_loser_cost_is_rounded_by_the_provider_s_billing() -> None:
    from datetime import UTC, datetime

    from gpuprov.models import Attempt
    from providers.base import Billing, Offer, PriceQuote
    from workflows.hedge import loser_cost

    started = datetime(2026, 12, 3, tzinfo=UTC)
    price = PriceQuote(amount=36.0, currency="USD", unit="hour", source="api", observed_at=started)
    offer = Offer(
        id=OFFER_A, provider="fake", region="r1", zone="r1-a", instance_type="gpu8", price=price
    )
    attempt = Attempt(
        number=1, offer=offer, started_at=started, ended_at=started + timedelta(seconds=61)
    )
    cost = loser_cost(attempt, 2, Billing(granularity_seconds=60, minimum_seconds=60))
    assert cost is not None and (cost.amount, cost.unit) == (2.4, "total")  # 2 x 36/h x 120 s
    unpriced = attempt.model_copy(update={"offer": offer.model_copy(update={"price": None})})
    assert loser_cost(unpriced, 2, Billing()) is None


async def test_a_wait_too_long_for_one_run_fails_the_job_cleanly(
    client: Client,
    task_queue: str,
    job_name: str,
    sqlite_records: Records,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Temporal ends a run at 51,200 events; a wait stops well before, naming why. The bound is
    # lowered here so that a few seconds of waiting reach it.
    monkeypatch.setattr(capacity_wait, "MOST_EVENTS_WAITING", 150)
    stockout = FaultRule(primitive="create", kind=ErrorKind.CAPACITY, message="sold out")
    async with fake_worker(
        client, task_queue, fast_cloud([stockout]), sqlite_records, jobs=QUICK_BACKOFF
    ) as (gp, cloud):
        final = await asyncio.wait_for((await gp.submit(job(job_name))).result(), 60)
        assert final.state is JobState.FAILED
        assert "still out of capacity after" in (final.error or "")
        assert "submit it again to wait on" in (final.error or "")
        assert_nothing_left(cloud)


async def test_the_deadline_landing_while_a_race_s_losers_are_torn_down_unwinds_the_winner(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    # The hedge wins at about 2 s; the hung loser's delete takes 6 s, and the 4 s provisioning
    # deadline lands while it runs. The winner's machine was the job's by then: torn down too.
    faults = [
        FaultRule(primitive="create", effect="boot_hang", vm=f"{job_name}-a1-"),
        FaultRule(primitive="delete", effect="delay", delay_seconds=6, vm=f"{job_name}-a1-"),
    ]
    async with fake_worker(client, task_queue, fast_cloud(faults), sqlite_records) as (gp, cloud):
        spec = job(
            job_name,
            provisioning_timeout_seconds=4,
            placement={"hedge": {"max_parallel": 2, "after_seconds": 1}},
        )
        final = await asyncio.wait_for((await gp.submit(spec)).result(), 90)
        assert final.state is JobState.FAILED, final
        assert "provisioning timed out" in (final.error or "")
        assert [a.outcome for a in final.attempts] == [
            AttemptOutcome.LOST_RACE,
            AttemptOutcome.SUCCEEDED,
        ]
        assert_nothing_left(cloud)
        assert_one_create_per_vm(cloud)
