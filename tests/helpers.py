"""Test helpers: a fast fake cloud, a worker on a per-test task queue, job waits."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import json
import os
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from gpuprov.config import (
    FakeInstanceType,
    FakeProviderConfig,
    FakeRegion,
    FaultRule,
    JobsSettings,
)
from gpuprov.engine.worker import build_worker, open_records
from gpuprov.models import JobSpec, JobState, JobStatus
from gpuprov.sdk.client import GpuprovClient, JobHandle
from gpuprov.store.records import Records
from providers.fake import FakeCloud, FakeCloudState

# Two regions; r1 has two zones at the same price, r2 is dearer. Offers, in the order a job
# tries them: fake/r1-a/gpu8 (10), fake/r1-b/gpu8 (10), fake/r2-a/gpu8 (12).
OFFER_A = "fake/r1-a/gpu8"
OFFER_B = "fake/r1-b/gpu8"
OFFER_C = "fake/r2-a/gpu8"
# A seed for `fake_worker(..., shuffle_offers=SHUFFLED)`: the fake's plan then answers C, B, A
# (dearest first, the tie the wrong way round), so only the workflow's ranking tries A first.
SHUFFLED = 4


def fast_cloud(faults: list[FaultRule] | None = None, **overrides: Any) -> FakeProviderConfig:
    gpu8 = dict(name="gpu8", gpu="H100", gpu_count=8, vcpus=64, memory_gb=512, disk_gb=1000)
    settings: dict[str, Any] = dict(
        regions=[
            FakeRegion(name="r1", zones=["r1-a", "r1-b"]),
            FakeRegion(name="r2", zones=["r2-a"]),
        ],
        instance_types=[
            FakeInstanceType(price=10.0, regions=["r1"], **gpu8),
            FakeInstanceType(price=12.0, regions=["r2"], **gpu8),
        ],
        boot_delay_seconds=0.2,
        delete_delay_seconds=0.1,
        poll_interval=0.05,
        boot_timeout=10,
        delete_timeout=10,
        faults=faults or [],
    )
    settings.update(overrides)
    return FakeProviderConfig(**settings)


def job(name: str, nodes: int = 1, **overrides: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": name,
        "nodes": nodes,
        "resources": {"gpu": "H100", "gpus_per_node": 8},
        "provisioning_timeout_seconds": 120,
    }
    data.update(overrides)
    return JobSpec.model_validate(data)


@asynccontextmanager
async def fake_worker(
    client: Client,
    task_queue: str,
    config: FakeProviderConfig,
    records: Records | None = None,
    api_url: str = "http://127.0.0.1:9",  # nothing listens: only agent tests need the API
    shuffle_offers: int | None = None,  # the fake's plan order: a seeded shuffle
    *,
    sandboxed: bool = True,
    cloud_type: type[FakeCloud] = FakeCloud,  # a test's own variant of the fake cloud
    jobs: JobsSettings | None = None,  # [jobs]: block and backoff times, launch budget
) -> AsyncIterator[tuple[GpuprovClient, FakeCloud]]:
    """A worker with the fake cloud and a real database (a fresh SQLite file unless given)."""
    with tempfile.TemporaryDirectory(prefix="gpuprov-test-") as data_dir:
        own_records = records or open_records(f"sqlite:///{data_dir}/gpuprov.db")
        cloud = cloud_type(config, shuffle_offers=shuffle_offers)
        worker = build_worker(
            client,
            task_queue,
            {"fake": cloud},
            own_records,
            api_url=api_url,
            sandboxed=sandboxed,
            jobs=jobs,
        )
        try:
            async with worker:
                yield GpuprovClient(client, task_queue), cloud
        finally:
            await cloud.aclose()
            if records is None:
                own_records.db.dispose()


async def until(handle: JobHandle, predicate: Any, timeout: float = 60) -> JobStatus:
    return await handle.wait_for(predicate, timeout=timeout, poll_interval=0.1)


async def ready_then_release(
    handle: JobHandle, timeout: float = 60, on_ready: Callable[[JobStatus], None] | None = None
) -> tuple[JobStatus, JobStatus]:
    """Wait for ready (or an end), release if ready, and return (at ready, final).
    `on_ready` sees the status at that moment, before the release (or the end) goes on."""
    at_ready = await until(handle, lambda s: s.state is JobState.READY, timeout)
    if on_ready is not None:
        on_ready(at_ready)
    if at_ready.state is JobState.READY:
        await handle.release()
    final = await asyncio.wait_for(handle.result(), timeout)
    return at_ready, final


async def eventually(
    check: Callable[[], Any], what: str, timeout: float = 60, interval: float = 0.02
) -> Any:
    """Poll `check` (plain or async) until it returns something truthy, and return that; after
    `timeout` seconds, fail naming `what` was waited for. A test waits for the state it needs
    this way, never by sleeping and hoping the state was reached."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        assert time.monotonic() < deadline, f"never reached: {what}"
        await asyncio.sleep(interval)


def assert_nothing_left(cloud: FakeCloud) -> None:
    assert cloud.live_instances() == [], "instances left running"
    assert cloud.state.live_side_resources() == [], "side resources left behind"


def node_of(vm: str) -> str:
    """`<job>-a<n>-n<i>` of a VM identity, without the run tag the workflow appends."""
    return vm.rsplit("-", 1)[0]


def creates_by_node(state: FakeCloudState) -> dict[str, int]:
    """Instances ever created, per `<job>-a<n>-n<i>` (run tags stripped)."""
    creates: dict[str, int] = {}
    for vm, count in state.creates_per_vm().items():
        creates[node_of(vm)] = creates.get(node_of(vm), 0) + count
    return creates


def assert_one_create_per_vm(cloud: FakeCloud) -> None:
    """No VM identity was created twice (vacuous when nothing was created: a caller that
    expects machines shows them another way)."""
    creates = cloud.state.creates_per_vm()
    assert all(count == 1 for count in creates.values()), creates


def decoded_history(history: Any) -> str:
    """The history as JSON with every payload's base64 data decoded next to it."""
    document = history.to_json_dict()
    texts = [json.dumps(document)]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "data" and isinstance(value, str):
                    texts.append(base64.b64decode(value).decode("utf-8", "replace"))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(document)
    return "\n".join(texts)


async def start_unanswered_job(client: Client, name: str) -> WorkflowHandle[Any, Any]:
    """A running ProvisionJob for `name` on a queue no worker polls: its status query never
    answers, as a stuck job's does. The caller terminates it."""
    return await client.start_workflow(
        "ProvisionJob",
        job(name),
        id=f"job-{name}",
        task_queue=f"nobody-{uuid.uuid4().hex[:8]}",
    )


def kill_recorded_pids(folder: Path) -> None:
    """SIGKILL each process whose pid a file in `folder` holds (what a test's work left
    running and recorded there), where it is still alive."""
    for pid_file in folder.iterdir():
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
