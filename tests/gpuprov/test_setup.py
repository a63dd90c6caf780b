"""`gpuprov setup` against a bare Temporal dev server (no search attributes) and a fresh SQLite.

The session's shared server registers the attributes at start-up, which would hide exactly what
setup is for, so these tests start their own plain server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from google.protobuf.duration_pb2 import Duration
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from gpuprov import contract
from gpuprov.cli import main as cli
from gpuprov.cli.dev import free_port
from gpuprov.cli.setup import SetupError, setup_cluster
from gpuprov.config import DatabaseSettings, Settings, TemporalSettings
from gpuprov.engine.binaries import temporal_binary
from gpuprov.store.db import TABLES, Database, alembic_config

NAMES = [key.name for key in contract.SEARCH_ATTRIBUTES]


@pytest.fixture(scope="module")
async def bare_server() -> AsyncIterator[tuple[WorkflowEnvironment, str]]:
    port = free_port()
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), port=port
    )
    yield env, f"127.0.0.1:{port}"
    await env.shutdown()


def settings_for(address: str, namespace: str, tmp_path: Path) -> Settings:
    return Settings(
        temporal=TemporalSettings(address=address, namespace=namespace),
        database=DatabaseSettings(url=f"sqlite:///{tmp_path / 'gpuprov.db'}"),
    )


async def custom_attributes(client: Client, namespace: str) -> dict[str, int]:
    request = ListSearchAttributesRequest(namespace=namespace)
    response = await client.operator_service.list_search_attributes(request)
    return dict(response.custom_attributes)


def head() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def test_setup_registers_attributes_and_migrates_then_is_a_no_op(
    bare_server: tuple[WorkflowEnvironment, str], tmp_path: Path
) -> None:
    env, address = bare_server
    assert not set(NAMES) & set(await custom_attributes(env.client, "default"))
    settings = settings_for(address, "default", tmp_path)

    first = await setup_cluster(settings, wait_seconds=10)

    keyword = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
    registered = await custom_attributes(env.client, "default")
    assert {name: registered.get(name) for name in NAMES} == dict.fromkeys(NAMES, keyword)
    assert first.attributes_added == NAMES and first.attributes_present == []
    assert not first.namespace_created  # the dev server has "default"
    assert (first.revision_before, first.revision_after) == (None, head())
    database = Database(settings.database_url)
    try:
        assert database.current_revision() == head()
        tables = set(sa.inspect(database.engine).get_table_names())
        assert {table.name for table in TABLES} <= tables
    finally:
        database.dispose()
    assert first.changed

    second = await setup_cluster(settings, wait_seconds=10)

    assert second.attributes_added == [] and second.attributes_present == NAMES
    assert (second.revision_before, second.revision_after) == (head(), head())
    assert first.schedule == "created" and second.schedule == "unchanged"
    assert first.liveness_schedule == "created" and second.liveness_schedule == "unchanged"
    assert not second.namespace_created and not second.changed
    assert second.lines()[-1] == "nothing to do: already set up"
    assert await custom_attributes(env.client, "default") == registered


async def test_setup_creates_a_missing_namespace_with_the_attributes(
    bare_server: tuple[WorkflowEnvironment, str], tmp_path: Path
) -> None:
    env, address = bare_server
    report = await setup_cluster(settings_for(address, "gpuprov-prod", tmp_path), wait_seconds=10)

    assert report.namespace_created and report.attributes_added == NAMES
    assert set(NAMES) <= set(await custom_attributes(env.client, "gpuprov-prod"))
    again = await setup_cluster(settings_for(address, "gpuprov-prod", tmp_path), wait_seconds=10)
    assert not again.changed


async def test_setup_refuses_an_attribute_registered_with_another_type(
    bare_server: tuple[WorkflowEnvironment, str], tmp_path: Path
) -> None:
    env, address = bare_server
    period = Duration(seconds=86400)
    await env.client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace="gpuprov-typed", workflow_execution_retention_period=period
        )
    )
    text = IndexedValueType.INDEXED_VALUE_TYPE_TEXT
    await env.client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace="gpuprov-typed", search_attributes={"GpuprovGpu": text}
        )
    )

    with pytest.raises(SetupError, match="GpuprovGpu exists on namespace gpuprov-typed as Text"):
        await setup_cluster(settings_for(address, "gpuprov-typed", tmp_path), wait_seconds=10)
    # Nothing was added next to the conflicting one.
    assert set(await custom_attributes(env.client, "gpuprov-typed")) == {"GpuprovGpu"}


async def test_setup_names_an_unreachable_temporal(tmp_path: Path) -> None:
    settings = settings_for(f"127.0.0.1:{free_port()}", "default", tmp_path)
    with pytest.raises(SetupError, match="cannot reach Temporal at 127.0.0.1"):
        await setup_cluster(settings, wait_seconds=0)


def test_gpuprov_setup_command_prints_what_it_did(
    bare_server: tuple[WorkflowEnvironment, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, address = bare_server
    monkeypatch.delenv("GPUPROV_CONFIG", raising=False)
    monkeypatch.setenv("GPUPROV_TEMPORAL__NAMESPACE", "gpuprov-cli")
    monkeypatch.setenv("GPUPROV_DATABASE__URL", f"sqlite:///{tmp_path / 'cli.db'}")

    assert cli.main(["--address", address, "setup", "--wait", "10"]) == 0

    out = capsys.readouterr().out
    assert f"Temporal at {address}" in out
    assert f"database sqlite:///{tmp_path / 'cli.db'}: migrated empty -> {head()}" in out
    assert "namespace gpuprov-cli: created" in out
    assert f"search attributes added: {', '.join(NAMES)}; already present: none" in out
    assert "reconciler schedule gpuprov-reconcile: created" in out
    assert "liveness schedule gpuprov-liveness: created" in out
