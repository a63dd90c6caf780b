"""Observe coalescing through real jobs: 20 jobs booting in one region cost one list call per
poll interval in total, not one per job, and each job still sees only its own machine."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpuprov.config import FakeRegion
from gpuprov.models import JobState
from tests.helpers import assert_nothing_left, fake_worker, fast_cloud, job, until

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

JOBS = 20
POLL = 0.25


async def test_jobs_waiting_in_one_region_share_one_list_call_per_poll_interval(
    client, task_queue, job_name
):
    config = fast_cloud(
        regions=[FakeRegion(name="r1", zones=["r1-a"])],
        boot_delay_seconds=3,
        poll_interval=POLL,
    )
    async with fake_worker(client, task_queue, config) as (gpuprov, cloud):
        handles = [await gpuprov.submit(job(f"{job_name}-{i}")) for i in range(JOBS)]
        started = time.monotonic()
        ready = await asyncio.gather(
            *(until(h, lambda s: s.state is JobState.READY, 120) for h in handles)
        )
        elapsed = time.monotonic() - started
        calls = cloud.state.call_counts()
        assert all(status.state is JobState.READY for status in ready)
        # each job got its own machine, one create per VM
        ids = [status.nodes[0].instance_ids for status in ready]
        assert sorted(len(i) for i in ids) == [1] * JOBS and len({i[0] for i in ids}) == JOBS
        # waiting used the shared region list, never a per-VM observe (no create was retried)
        assert calls.get(("observe", "r1"), 0) == 0
        lists = calls[("list", "r1")]
        # at most one list per poll interval for the whole region (+1 for the first call);
        # without coalescing this would be about JOBS x (boot 3 s / POLL) = 240
        assert lists <= elapsed / POLL + 1, (lists, elapsed)
        assert lists < JOBS * 3 / POLL / 4
        for handle in handles:
            await handle.release()
        await asyncio.gather(*(h.result() for h in handles))
        assert_nothing_left(cloud)
