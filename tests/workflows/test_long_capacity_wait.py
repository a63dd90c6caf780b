"""A job that waits for GPUs for hours keeps a small history: on Temporal's time-skipping test
server, a job whose every offer is sold out waits on durable timers (the production backoff, 2
minutes doubling to 30, per offering), gets its GPUs when the cloud has stock again an hour
later, and a job left waiting for a whole day makes a few dozen tries, not a tight loop."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from temporalio.testing import WorkflowEnvironment

from gpuprov.config import FaultRule
from gpuprov.models import AttemptOutcome, ErrorKind, JobState
from tests.helpers import assert_nothing_left, fake_worker, fast_cloud, job, until
from tests.skipping import run_lengths

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

TWO_DAYS = 2 * 24 * 3600
# Three offers (zones r1-a and r1-b of fake/r1/gpu8, r2-a of fake/r2/gpu8); each offering backs
# off 2, 4, 8, 16, 30, 30, ... minutes: about 48 tries of each offer in a day, plus the first.
OFFERS = 3
MOST_TRIES_IN_A_DAY = OFFERS * (24 * 2 + 5)
# Measured: 153 tries, 3,280 events, 0.9 MB (a try is a create, its records and its status).
MOST_EVENTS_IN_A_DAY = 25 * MOST_TRIES_IN_A_DAY
MOST_BYTES_IN_A_DAY = 1_500_000


def _sold_out() -> FaultRule:
    return FaultRule(primitive="create", kind=ErrorKind.CAPACITY, message="sold out")


async def test_a_sold_out_job_gets_its_gpus_when_stock_returns_an_hour_later(
    skipping: WorkflowEnvironment, job_name: str
) -> None:
    client = skipping.client
    async with fake_worker(client, "capacity-hour", fast_cloud([_sold_out()])) as (gp, cloud):
        handle = await gp.submit(job(job_name, provisioning_timeout_seconds=TWO_DAYS))
        waiting = await until(handle, lambda s: (s.waiting_for or "").startswith("capacity: "))
        assert "3 offer(s) out of stock" in waiting.waiting_for, waiting.waiting_for
        await skipping.sleep(timedelta(hours=1))
        tried = (await handle.status()).attempts
        assert all(a.outcome is AttemptOutcome.FAILED for a in tried)
        assert len(tried) == OFFERS * 5, len(tried)  # at 0, 2, 6, 14 and 30 minutes
        cloud.config.faults.clear()  # the cloud has stock again
        # The next try comes when the longest backoff so far lapses (30 minutes at most).
        await skipping.sleep(timedelta(minutes=31))
        ready = await until(handle, lambda s: s.state is not JobState.PROVISIONING, 60)
        assert ready.state is JobState.READY, ready.error
        assert ready.attempts[-1].outcome is AttemptOutcome.SUCCEEDED
        assert ready.attempts[0].started_at is not None
        assert ready.attempts[-1].started_at is not None
        waited = ready.attempts[-1].started_at - ready.attempts[0].started_at
        assert timedelta(hours=1) <= waited <= timedelta(hours=1, minutes=32), waited
        await handle.release()
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)


async def test_a_day_of_waiting_costs_a_few_dozen_tries_and_a_small_history(
    skipping: WorkflowEnvironment, job_name: str
) -> None:
    client = skipping.client
    async with fake_worker(client, "capacity-day", fast_cloud([_sold_out()])) as (gp, cloud):
        handle = await gp.submit(job(job_name, provisioning_timeout_seconds=TWO_DAYS))
        await until(handle, lambda s: (s.waiting_for or "").startswith("capacity: "))
        for _ in range(24):  # an hour at a time: each skip is one RPC, bounded in time
            await skipping.sleep(timedelta(hours=1))
        status = await handle.status()
        assert status.state is JobState.PROVISIONING
        assert (status.waiting_for or "").startswith("capacity: "), status.waiting_for
        tries = len(status.attempts)
        assert OFFERS * 24 * 2 <= tries <= MOST_TRIES_IN_A_DAY, tries
        lengths = await run_lengths(client, f"job-{job_name}")
        history = await client.get_workflow_handle(f"job-{job_name}").fetch_history()
        size = sum(event.ByteSize() for event in history.events)
        assert size <= MOST_BYTES_IN_A_DAY, size
        assert sum(lengths) <= MOST_EVENTS_IN_A_DAY, (tries, lengths)
        await handle.cancel()
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.CANCELLED
        assert_nothing_left(cloud)
        print(f"a day of waiting: {tries} tries, history {lengths} events, {size} bytes")
