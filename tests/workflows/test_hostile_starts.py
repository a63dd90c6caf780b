"""Hostile and careless raw starts of ProvisionJob, as the `temporal` CLI or another SDK makes
them: bytes the worker cannot decode, wrong types, missing or extra fields, values no timer can
hold, and a workflow id that is not `job-<name>`.

Each case must end the same way: the workflow fails at once with an `InvalidJobSpec` error whose
message names the field, `GpuprovState` says `failed`, nothing was asked of the cloud and nothing
was written to the database, and the name is free for a valid job right after.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from gpuprov import contract
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState
from tests.helpers import assert_nothing_left, fake_worker, fast_cloud, job, until

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

JSON = {"encoding": b"json/plain"}


@dataclass(frozen=True)
class Start:
    """One raw start: the payloads sent, the workflow id's job name, and what the error names."""

    args: tuple[Any, ...]
    names: str  # a word the error message must contain
    workflow_name: str | None = None  # the job name in the workflow id (default: the test's)


def raw(data: bytes, encoding: bytes = b"json/plain") -> RawValue:
    return RawValue(Payload(metadata={"encoding": encoding}, data=data))


def spec_json(name: str, **fields: Any) -> RawValue:
    body = {"name": name, "resources": {"gpu": "H100"}, **fields}
    return raw(json.dumps(body).encode())


def cases(name: str) -> dict[str, Start]:
    """name -> the start; `name` is the job name the workflow id carries."""
    valid = {"name": name, "resources": {"gpu": "H100"}}
    text = json.dumps(valid)
    return {
        "no-input": Start((), "without a job spec"),
        "a-list": Start((raw(b"[1, 2]"),), "mapping"),
        "a-string": Start((raw(b'"train"'),), "mapping"),
        "a-number": Start((raw(b"7"),), "mapping"),
        "null": Start((raw(b"null"),), "mapping"),
        "empty-object": Start((raw(b"{}"),), "name"),
        "truncated-json": Start((raw(text[:-3].encode()),), "JSON"),
        "not-json": Start((raw(b"name: train"),), "JSON"),
        "binary-encoding": Start((raw(b"\x00\x01\x02", b"binary/plain"),), "mapping"),
        "non-utf8-name": Start((raw(b'{"name": "tr\xff\xfein"}'),), "JSON"),
        "nul-in-name": Start((spec_json(f"{name}\u0000x"),), "name"),
        "nan-cost": Start(
            (raw(text[:-1].encode() + b', "max_hourly_cost": NaN}'),), "max_hourly_cost"
        ),
        "infinite-timeout": Start(
            (raw(text[:-1].encode() + b', "provisioning_timeout_seconds": Infinity}'),),
            "provisioning_timeout_seconds",
        ),
        "missing-name": Start((raw(b'{"nodes": 1}'),), "name"),
        "nodes-a-word": Start((spec_json(name, nodes="many"),), "nodes"),
        "nodes-zero": Start((spec_json(name, nodes=0),), "nodes"),
        "nodes-negative": Start((spec_json(name, nodes=-3),), "nodes"),
        "nodes-past-the-limit": Start((spec_json(name, nodes=100_000),), "nodes"),
        "nodes-a-float": Start((spec_json(name, nodes=1.5),), "nodes"),
        "timeout-past-any-timer": Start(
            (spec_json(name, provisioning_timeout_seconds=1e19),), "provisioning_timeout_seconds"
        ),
        "health-interval-past-any-timer": Start(
            (spec_json(name, health_check_interval_seconds=1e19),),
            "health_check_interval_seconds",
        ),
        "negative-cost-cap": Start((spec_json(name, max_hourly_cost=-1),), "max_hourly_cost"),
        "unknown-field": Start((spec_json(name, nodez=2),), "nodez"),
        "unknown-release": Start((spec_json(name, release="never"),), "release"),
        "unknown-provider": Start(
            (spec_json(name, placement={"providers": ["nowhere"]}),), "providers"
        ),
        "gpu-3000-chars": Start(
            (raw(json.dumps({**valid, "resources": {"gpu": "H" * 3000}}).encode()),), "gpu"
        ),
        "resources-a-list": Start(
            (raw(json.dumps({**valid, "resources": []}).encode()),), "resources"
        ),
        "id-names-another-job": Start((spec_json("impostor"),), "job-"),
        "name-bad-characters": Start((spec_json("Train_7B!"),), "name"),
    }  # fmt: skip


CASES = sorted(cases("x"))


async def _state_attribute(client: Client, workflow_id: str) -> str | None:
    described = await client.get_workflow_handle(workflow_id).describe()
    return described.typed_search_attributes.get(contract.STATE)


def _tables(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return {
                table: connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
                for table in ("vms", "join_tokens", "cost_records", "blocks", "workers")
            }
    finally:
        engine.dispose()


@pytest.mark.parametrize("case", CASES)
async def test_a_hostile_raw_start_fails_at_once_naming_the_field(
    client: Client, task_queue: str, job_name: str, case: str
):
    start = cases(job_name)[case]
    workflow_id = f"job-{job_name}"
    with tempfile.TemporaryDirectory() as data_dir:
        url = f"sqlite:///{data_dir}/gpuprov.db"
        records = open_records(url)
        try:
            async with fake_worker(client, task_queue, fast_cloud(), records) as (_, cloud):
                handle = await client.start_workflow(
                    "ProvisionJob", args=list(start.args), id=workflow_id, task_queue=task_queue
                )
                with pytest.raises(WorkflowFailureError) as failed:
                    await asyncio.wait_for(handle.result(), 30)
                cause = failed.value.cause
                assert isinstance(cause, ApplicationError), cause
                assert cause.type == "InvalidJobSpec" and cause.non_retryable
                assert start.names in cause.message, cause.message
                assert await _state_attribute(client, workflow_id) == JobState.FAILED.value
                history = await handle.fetch_history()
                failed_tasks = [
                    e for e in history.events if e.HasField("workflow_task_failed_event_attributes")
                ]
                assert failed_tasks == []  # failed as a workflow, not stuck retrying a task
                assert not any(
                    e.HasField("activity_task_scheduled_event_attributes")
                    or e.HasField("marker_recorded_event_attributes")
                    for e in history.events
                ), "no step ran"
                assert cloud.state.creates_per_vm() == {}
                assert_nothing_left(cloud)
            assert set(_tables(url).values()) == {0}
        finally:
            records.db.dispose()


async def test_the_name_of_a_rejected_start_is_free_for_a_valid_job(
    client: Client, task_queue: str, job_name: str
):
    async with fake_worker(client, task_queue, fast_cloud()) as (gpuprov, cloud):
        bad = await client.start_workflow(
            "ProvisionJob",
            spec_json(job_name, nodes="many"),
            id=f"job-{job_name}",
            task_queue=task_queue,
        )
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(bad.result(), 30)
        handle = await gpuprov.submit(job(job_name))
        ready = await until(handle, lambda s: s.state is JobState.READY)
        assert ready.state is JobState.READY
        await handle.release()
        await asyncio.wait_for(handle.result(), 60)
        assert_nothing_left(cloud)


async def test_a_start_whose_id_is_not_job_name_never_touches_that_job(
    client: Client, task_queue: str, job_name: str
):
    """A raw start named after a ready job, under another workflow id, fails before any side
    effect: the ready job keeps its machine and its busy worker."""
    async with fake_worker(client, task_queue, fast_cloud()) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        await until(handle, lambda s: s.state is JobState.READY)
        impostor = await client.start_workflow(
            "ProvisionJob",
            spec_json(job_name),
            id=f"impostor-{job_name}",
            task_queue=task_queue,
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(impostor.result(), 30)
        assert f"job-{job_name}" in str(failed.value.cause)
        assert (await handle.status()).state is JobState.READY
        assert len(cloud.live_instances()) == 1
        await handle.release()
        await asyncio.wait_for(handle.result(), 60)
        assert_nothing_left(cloud)
