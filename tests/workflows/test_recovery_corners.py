"""The run phase's recovery corners, as jobs with `run` whose nodes are played through the
database (tests/workflows/test_running.py's `Nodes`; the simulated agents heartbeat):

- restarts used up: the job fails with "no restart left", naming the node and every cause;
- continue-as-new while the work runs (a dev server that suggests it after a few dozen events):
  the work is not started again, and its end still ends the job;
- `max_runtime_seconds` across a continue-as-new: released at the limit counted from the first
  ready, never earlier, with the reason in the status;
- a GPU that turns unhealthy mid-run: one restart naming it.
A node lost by heartbeat silence while the cloud still lists it running is
tests/workflows/test_partitions.py's cut link (the real agent, its machine still up)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlmodel import select
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from gpuprov import contract
from gpuprov.config import FaultRule
from gpuprov.engine.binaries import temporal_binary
from gpuprov.models import AttemptOutcome, JobState, WorkState
from gpuprov.sdk.converter import PYDANTIC_DATA_CONVERTER
from gpuprov.store.db import WorkRecord
from tests.helpers import OFFER_A, OFFER_B, assert_nothing_left, job, until
from tests.workflows.test_running import nodes_running, records, worker_with_api

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

__all__ = ["records"]  # the fixture, shared

SUGGEST_AFTER = 40  # events: the dev server suggests continue-as-new past this many


@pytest.fixture
async def suggesting() -> AsyncIterator[Client]:
    """A dev server of its own that suggests continue-as-new after SUGGEST_AFTER events."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=PYDANTIC_DATA_CONVERTER,
        search_attributes=list(contract.SEARCH_ATTRIBUTES),
        dev_server_extra_args=[
            "--dynamic-config-value",
            f"limit.historyCount.suggestContinueAsNew={SUGGEST_AFTER}",
        ],
    )
    try:
        yield env.client
    finally:
        await env.shutdown()


async def runs_of(client: Client, job_name: str) -> int:
    """How many runs the job's workflow has had (1: it never continued as new)."""
    count = 0
    async for _ in client.list_workflows(f"WorkflowId = 'job-{job_name}'"):
        count += 1
    return count


async def test_restarts_used_up_fail_the_job_naming_the_node_and_every_cause(
    client, task_queue, job_name, records
):
    async with (
        worker_with_api(client, task_queue, records) as (gpuprov, cloud),
        nodes_running(client, records, job_name, lambda rank, epoch: None) as nodes,
    ):
        spec = job(job_name, 1, run="sleep 3600", health_check_interval_seconds=1,
                   recovery={"max_restarts": 1})  # fmt: skip
        handle = await gpuprov.submit(spec)
        for epoch in (0, 1):  # the node of each attempt is preempted once its work runs
            await until(handle, lambda s, e=epoch: (e, 0) in nodes.started, 60)
            [instance] = cloud.live_instances()
            cloud.state.preempt(instance.id)
        final = await asyncio.wait_for(handle.result(), 90)
        assert_nothing_left(cloud)
    assert final.state is JobState.FAILED
    assert final.error is not None
    assert "no restart left (recovery.max_restarts 1)" in final.error
    [first, second] = [node.vm for node in final.nodes]
    assert f"node 0 ({second})" in final.error  # the node lost last
    assert f"restart 1: node 0 ({first})" in final.error  # and the earlier restart's cause
    assert final.error.count("preempted") == 2
    assert [a.offer.id for a in final.attempts] == [OFFER_A, OFFER_B]
    assert [a.outcome for a in final.attempts] == [AttemptOutcome.FAILED] * 2  # both lost
    assert len(final.restarts) == 1 and final.leaks == []
    assert nodes.started == [(0, 0), (1, 0)]


async def test_continue_as_new_while_the_work_runs_neither_restarts_it_nor_loses_its_end(
    suggesting, task_queue, job_name, records
):
    done = asyncio.Event()
    async with (
        worker_with_api(suggesting, task_queue, records) as (gpuprov, cloud),
        nodes_running(suggesting, records, job_name, lambda r, e: 0 if done.is_set() else None)
        as nodes,
    ):  # fmt: skip
        spec = job(job_name, 1, run="train", health_check_interval_seconds=1)
        handle = await gpuprov.submit(spec)
        await until(handle, lambda s: s.state is JobState.RUNNING, 60)
        for _ in range(240):  # until it continued as new twice while the work ran
            if await runs_of(suggesting, job_name) >= 3:
                break
            await asyncio.sleep(0.5)
        else:
            pytest.fail("the job never continued as new")
        status = await handle.status()
        assert status.state is JobState.RUNNING and [w.state for w in status.work] == [
            WorkState.STARTED
        ]
        done.set()  # the work ends now: its end must end the job
        final = await asyncio.wait_for(handle.result(), 60)
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED, final.error
    assert final.ended_because == "the work ended on every node"
    assert nodes.started == [(0, 0)]  # started once, across every run
    assert final.restarts == [] and len(final.attempts) == 1


async def test_max_runtime_counts_from_the_first_ready_across_continue_as_new(
    suggesting, task_queue, job_name, records
):
    limit = 12
    async with (
        worker_with_api(suggesting, task_queue, records) as (gpuprov, cloud),
        nodes_running(suggesting, records, job_name, lambda rank, epoch: None),
    ):
        spec = job(job_name, 1, run="sleep 3600", health_check_interval_seconds=1,
                   max_runtime_seconds=limit)  # fmt: skip
        handle = await gpuprov.submit(spec)
        final = await asyncio.wait_for(handle.result(), 120)
        assert_nothing_left(cloud)
        runs = await runs_of(suggesting, job_name)
    assert runs >= 2, "the limit was reached in a continued run"
    assert final.state is JobState.COMPLETED, final.error
    assert final.ready_at is not None and final.ended_because is not None
    assert f"max_runtime_seconds ({limit}s) reached" in final.ended_because
    assert final.ready_at.isoformat() in final.ended_because  # counted from the first ready
    with records.db.session() as session:
        [row] = session.exec(select(WorkRecord).where(WorkRecord.job == job_name)).all()
    assert row.state == WorkState.STOPPED.value and row.ended_at is not None
    # never released early: the stop came at the limit or after it
    assert row.ended_at >= final.ready_at + timedelta(seconds=limit)


async def test_a_gpu_that_turns_unhealthy_mid_run_restarts_the_job_once_naming_it(
    client, task_queue, job_name, records
):
    broken = FaultRule(primitive="create", effect="gpu_lost", times=1, delay_seconds=3)
    async with (
        worker_with_api(client, task_queue, records, faults=[broken]) as (gpuprov, cloud),
        nodes_running(client, records, job_name, lambda r, epoch: 0 if epoch else None)
        as nodes,
    ):  # fmt: skip
        spec = job(job_name, 1, run="train", recovery={"max_restarts": 1})
        handle = await gpuprov.submit(spec)
        final = await asyncio.wait_for(handle.result(), 120)
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED, final.error
    [restart] = final.restarts
    assert "unhealthy" in restart.cause and "fallen off the bus, Xid 79" in restart.cause
    assert nodes.started == [(0, 0), (1, 0)]
    assert [a.offer.id for a in final.attempts] == [OFFER_A, OFFER_B]
