"""Shipping a workflow change without breaking running jobs (docs/architecture.md, "Changing
workflow code safely"): a job started by today's code finishes on a worker whose ProvisionJob
has changed, when the change is behind `workflow.patched`; the same change without the gate
breaks the running job (so this test can fail)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import RawValue

from gpuprov.engine.worker import WORKFLOWS, build_worker, open_records
from gpuprov.models import JobState, JobStatus
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.records import Records
from providers.fake import FakeCloud
from tests.helpers import assert_nothing_left, fast_cloud, job, until
from workflows.intake import NO_INPUT
from workflows.job import ProvisionJob

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

CHANGE = "gpuprov-test-extra-timer"


@workflow.defn(name="ProvisionJob")
class ProvisionJobPatched(ProvisionJob):
    """Tomorrow's code: one more command (a timer) at the start of every job, behind a gate."""

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> JobStatus:
        if workflow.patched(CHANGE):
            await workflow.sleep(0.1)
        return await super().run(raw)


@workflow.defn(name="ProvisionJob")
class ProvisionJobUngated(ProvisionJob):
    """The same change shipped without the gate."""

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> JobStatus:
        await workflow.sleep(0.1)
        return await super().run(raw)


def _others() -> list[type]:
    return [cls for cls in WORKFLOWS if cls is not ProvisionJob]


@asynccontextmanager
async def worker_with(
    client: Client, task_queue: str, cloud: FakeCloud, records: Records, job_class: type
) -> AsyncIterator[GpuprovClient]:
    # Unsandboxed: the sandbox would re-import this test module to validate the classes above.
    worker = build_worker(
        client, task_queue, {"fake": cloud}, records, api_url="http://127.0.0.1:9",
        workflows=[job_class, *_others()], sandboxed=False,
    )  # fmt: skip
    async with worker:
        yield GpuprovClient(client, task_queue)


async def _ready_on_todays_code(
    client: Client, task_queue: str, cloud: FakeCloud, records: Records, name: str
) -> None:
    async with worker_with(client, task_queue, cloud, records, ProvisionJob) as gpuprov:
        handle = await gpuprov.submit(job(name))
        await until(handle, lambda s: s.state is JobState.READY)


async def test_a_running_job_finishes_on_a_worker_with_gated_new_code(
    client: Client, task_queue: str, job_name: str
) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        records = open_records(f"sqlite:///{data_dir}/gpuprov.db")
        cloud = FakeCloud(fast_cloud())
        try:
            await _ready_on_todays_code(client, task_queue, cloud, records, job_name)
            async with worker_with(
                client, task_queue, cloud, records, ProvisionJobPatched
            ) as gpuprov:
                handle = gpuprov.job(job_name)
                await handle.release()
                final = await asyncio.wait_for(handle.result(), 60)
            assert final.state is JobState.COMPLETED
            assert_nothing_left(cloud)
            history = await client.get_workflow_handle(f"job-{job_name}").fetch_history()
            types = [event.event_type for event in history.events]
            assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in types
            assert EventType.EVENT_TYPE_MARKER_RECORDED not in types or all(
                CHANGE not in str(event) for event in history.events
            )  # the old job took the old branch: no marker for the change
            # A job started on the new code takes the new branch.
            async with worker_with(
                client, task_queue, cloud, records, ProvisionJobPatched
            ) as gpuprov:
                fresh = await gpuprov.submit(job(f"{job_name}-new"))
                await until(fresh, lambda s: s.state is JobState.READY)
                await fresh.release()
                await asyncio.wait_for(fresh.result(), 60)
            new = await client.get_workflow_handle(f"job-{job_name}-new").fetch_history()
            assert any(CHANGE in str(event) for event in new.events)
        finally:
            await cloud.aclose()
            records.db.dispose()


async def test_the_same_change_without_the_gate_breaks_the_running_job(
    client: Client, task_queue: str, job_name: str
) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        records = open_records(f"sqlite:///{data_dir}/gpuprov.db")
        cloud = FakeCloud(fast_cloud())
        try:
            await _ready_on_todays_code(client, task_queue, cloud, records, job_name)
            async with worker_with(
                client, task_queue, cloud, records, ProvisionJobUngated
            ) as gpuprov:
                handle = gpuprov.job(job_name)
                await handle.release()
                raw = client.get_workflow_handle(f"job-{job_name}")
                failed = await _first_failed_task(raw)
            assert "Nondeterminism" in failed or "TMPRL1100" in failed, failed
            assert (await raw.describe()).status is not None
            await raw.terminate("test over")  # the broken job is ended by hand here
        finally:
            await cloud.aclose()
            records.db.dispose()


async def _first_failed_task(handle: object, timeout: float = 60) -> str:
    """The failure message of the first failed workflow task in the history."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        history = await handle.fetch_history()  # type: ignore[attr-defined]
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                return str(event.workflow_task_failed_event_attributes.failure.message)
        await asyncio.sleep(0.2)
    raise AssertionError("no workflow task failed")
