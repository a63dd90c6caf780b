"""The Python SDK (gpuprov.sdk.client) on the session's real dev server and a fake-cloud worker:
connect, submit, status, waits, release, cancel, list by search attributes, and errors that say
what went wrong."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpuprov.cli.dev import free_port
from gpuprov.config import FaultRule
from gpuprov.models import AttemptOutcome, JobState, JobStatus
from gpuprov.sdk.client import (
    GpuprovClient,
    GpuprovError,
    JobAlreadyExists,
    JobHandle,
    JobNotFound,
    JobSummary,
)
from providers.errors import ErrorKind
from tests.helpers import OFFER_A, assert_nothing_left, fake_worker, fast_cloud, job

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


@pytest.fixture
async def sdk(client, task_queue) -> GpuprovClient:
    """An SDK client of its own, connected to the dev server's address as a service would."""
    address = client.service_client.config.target_host
    return await GpuprovClient.connect(address, client.namespace, task_queue)


async def listed(
    sdk: GpuprovClient, name: str, timeout: float = 60, **filters
) -> JobSummary | None:
    """The job's row in `list(**filters)`, polled briefly: visibility lags the job a moment."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [row for row in await sdk.list(**filters) if row.name == name]
        if rows or time.monotonic() >= deadline:
            return rows[0] if rows else None
        await asyncio.sleep(0.1)


async def test_submit_wait_ready_release_and_result_return_typed_statuses(
    client, task_queue, job_name, sdk
):
    async with fake_worker(client, task_queue, fast_cloud()) as (_, cloud):
        handle = await sdk.submit(job(job_name))
        assert isinstance(handle, JobHandle) and handle.name == job_name

        first = await handle.status()
        assert isinstance(first, JobStatus) and first.name == job_name
        assert first.state in (JobState.QUEUED, JobState.PROVISIONING, JobState.READY)

        seen: list[JobState] = []
        ready = await handle.wait_ready(60, on_change=lambda s: seen.append(s.state))
        assert ready.state is JobState.READY and seen[-1] is JobState.READY
        assert [n.status for n in ready.nodes] == ["running"]
        assert ready.nodes[0].ssh is not None
        assert ready.hourly_cost is not None and ready.hourly_cost.amount == 10.0
        assert sdk.job(job_name).name == job_name
        assert (await sdk.job(job_name).status()).state is JobState.READY

        await handle.release()
        final = await asyncio.wait_for(handle.result(), 60)
        assert isinstance(final, JobStatus) and final.state is JobState.COMPLETED
        assert [n.status for n in final.nodes] == ["terminated"]
        assert_nothing_left(cloud)


async def test_list_filters_by_state_and_provider_search_attributes(
    client, task_queue, job_name, sdk
):
    async with fake_worker(client, task_queue, fast_cloud()) as _:
        handle = await sdk.submit(job(job_name))
        await handle.wait_ready(60)

        row = await listed(sdk, job_name, state=JobState.READY, provider="fake")
        assert row is not None, "a ready job on fake is not listed"
        assert (row.state, row.provider, row.region, row.gpu) == (
            JobState.READY,
            "fake",
            "r1",
            "H100",
        )
        assert row.started_at is not None and row.closed_at is None
        assert await listed(sdk, job_name, 0, state=JobState.READY, provider="ssh") is None
        assert await listed(sdk, job_name, 0, state=JobState.FAILED) is None

        await handle.release()
        await asyncio.wait_for(handle.result(), 60)
        done = await listed(sdk, job_name, state=JobState.COMPLETED)
        assert done is not None and done.closed_at is not None


async def test_cancel_ends_the_job_cancelled_with_nothing_left(client, task_queue, job_name, sdk):
    async with fake_worker(client, task_queue, fast_cloud()) as (_, cloud):
        handle = await sdk.submit(job(job_name))
        await handle.wait_ready(60)
        await handle.cancel()
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.CANCELLED
        assert [n.status for n in final.nodes] == ["terminated"]
        assert_nothing_left(cloud)


async def test_submitting_a_running_job_name_again_raises_job_already_exists(
    client, task_queue, job_name, sdk
):
    async with fake_worker(client, task_queue, fast_cloud()) as _:
        handle = await sdk.submit(job(job_name))
        with pytest.raises(JobAlreadyExists, match=f"a job named '{job_name}' is already running"):
            await sdk.submit(job(job_name))
        await handle.cancel()
        await asyncio.wait_for(handle.result(), 60)


async def test_unknown_job_raises_job_not_found_naming_it(sdk):
    ghost = sdk.job("no-such-job-anywhere")
    with pytest.raises(JobNotFound, match="no job named 'no-such-job-anywhere'"):
        await ghost.status()
    with pytest.raises(JobNotFound, match="no job named 'no-such-job-anywhere'"):
        await ghost.result()
    with pytest.raises(JobNotFound, match="no running job named 'no-such-job-anywhere'"):
        await ghost.release()


async def test_connect_to_a_dead_address_names_the_address():
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(GpuprovError, match=f"cannot reach Temporal at {address}"):
        await GpuprovClient.connect(address)


async def test_wait_ready_on_a_job_that_fails_raises_with_the_jobs_error(
    client, task_queue, job_name, sdk
):
    invalid = FaultRule(
        primitive="create", kind=ErrorKind.INVALID_REQUEST, message="image not found: cuda-99"
    )
    async with fake_worker(client, task_queue, fast_cloud([invalid])) as (_, cloud):
        handle = await sdk.submit(job(job_name))
        with pytest.raises(GpuprovError) as raised:
            await handle.wait_ready(60)
        message = str(raised.value)
        assert f"job '{job_name}' ended failed" in message
        assert "InvalidRequest" in message and "image not found: cuda-99" in message
        assert OFFER_A in message  # the offer it tried

        final = await handle.result()
        assert final.state is JobState.FAILED
        assert final.attempts[0].outcome is AttemptOutcome.FAILED
        assert_nothing_left(cloud)


async def test_wait_ready_that_runs_out_raises_timeout_error_with_the_state(
    client, task_queue, job_name, sdk
):
    hang = FaultRule(primitive="create", effect="boot_hang")
    async with fake_worker(client, task_queue, fast_cloud([hang], boot_timeout=120)) as _:
        handle = await sdk.submit(job(job_name))
        with pytest.raises(TimeoutError, match=f"job '{job_name}' still provisioning after 1"):
            await handle.wait_ready(timeout=1)
        await handle.cancel()
        assert (await asyncio.wait_for(handle.result(), 60)).state is JobState.CANCELLED


async def test_release_or_cancel_of_a_finished_job_raises_job_not_found(
    client, task_queue, job_name, sdk
):
    async with fake_worker(client, task_queue, fast_cloud()) as _:
        handle = await sdk.submit(job(job_name))
        await handle.wait_ready(60)
        await handle.release()
        assert (await asyncio.wait_for(handle.result(), 60)).state is JobState.COMPLETED

        with pytest.raises(JobNotFound, match=f"no running job named '{job_name}'"):
            await handle.release()
        with pytest.raises(JobNotFound, match=f"no running job named '{job_name}'"):
            await handle.cancel()
        assert (await handle.status()).state is JobState.COMPLETED  # still readable
