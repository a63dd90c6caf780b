"""Jobs that run: the work given to every node, its end (completed or failed), a lost node's
recovery, release and cancel while running, and `max_runtime_seconds`, on the real dev server,
the fake cloud (whose simulated agents register through the real API) and a real database.

The nodes' side of the work is played here by `Nodes`: it takes each node's assignment from
the database, reports it started, ends it as the test says, and wakes the job with the
`workers_changed` signal, as a node's agent reporting through the API does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sqlmodel import select
from temporalio.client import Client

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState, WorkState
from gpuprov.store.db import WorkRecord
from gpuprov.store.records import Records
from gpuprov.store.work import WorkRecords
from tests.helpers import OFFER_A, OFFER_B, assert_nothing_left, fake_worker, fast_cloud, job, until

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

# rank, epoch -> the exit code to end with now, or None to keep running
Behaviour = Callable[[int, int], int | None]


class Nodes:
    """The agents' side of the job's work, driven through the database."""

    def __init__(self, client: Client, records: Records, job_name: str, behaviour: Behaviour):
        self.client, self.job_name, self.behaviour = client, job_name, behaviour
        self.work = WorkRecords(records.db)
        self.started: list[tuple[int, int]] = []  # (epoch, rank), in the order they started
        self.running: set[str] = set()  # work ids started and not ended
        self.max_concurrent = 0

    def rows(self) -> list[WorkRecord]:
        with self.work.db.session() as session:
            return list(session.exec(select(WorkRecord).where(WorkRecord.job == self.job_name)))

    async def run(self) -> None:
        while True:
            changed = False
            for row in self.rows():
                changed |= self._step(row)
            self.max_concurrent = max(self.max_concurrent, len(self.running))
            if changed:
                await self.client.get_workflow_handle(f"job-{self.job_name}").signal(
                    "workers_changed"
                )
            await asyncio.sleep(0.05)

    def _step(self, row: WorkRecord) -> bool:
        if row.state == WorkState.ASSIGNED.value:
            assert self.work.report_started(row.id, row.worker_id)
            self.started.append((row.epoch, row.node_rank))
            self.running.add(row.id)
            return True
        if row.state == WorkState.STOP_REQUESTED.value:
            self.running.discard(row.id)
            return self.work.report_exit(row.id, row.worker_id, -15, "terminated")
        if row.state == WorkState.ABANDONED.value:
            self.running.discard(row.id)
            return False
        if row.state == WorkState.STARTED.value:
            code = self.behaviour(row.node_rank, row.epoch)
            if code is not None:
                self.running.discard(row.id)
                tail = f"rank {row.node_rank} says goodbye\n"
                return self.work.report_exit(row.id, row.worker_id, code, tail)
        return False


@pytest.fixture
def records(tmp_path: Path) -> Records:
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    yield records
    records.db.dispose()


@contextlib.asynccontextmanager
async def nodes_running(
    client: Client, records: Records, job_name: str, behaviour: Behaviour
) -> AsyncIterator[Nodes]:
    nodes = Nodes(client, records, job_name, behaviour)
    task = asyncio.create_task(nodes.run())
    try:
        yield nodes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def worker_with_api(client, task_queue, records, **cloud) -> AsyncIterator:
    port = free_port()
    # With a Temporal client the API wakes a job at once when a node reports its work ended.
    async with serving(create_app(records, temporal=client), "127.0.0.1", port):
        settings = {"simulate_agent": True, "run_work": False, **cloud}  # `Nodes` runs it
        config = fast_cloud(**settings)
        url = f"http://127.0.0.1:{port}"
        async with fake_worker(client, task_queue, config, records, url) as (gpuprov, fake):
            yield gpuprov, fake


def exits(code: int) -> Behaviour:
    return lambda rank, epoch: code


async def test_a_two_node_run_completes_on_its_own_and_leaves_nothing(
    client, task_queue, job_name, records
):
    async with (
        worker_with_api(client, task_queue, records) as (gpuprov, cloud),
        nodes_running(client, records, job_name, exits(0)) as nodes,
    ):
        handle = await gpuprov.submit(job(job_name, 2, run="echo rank $GPUPROV_NODE_RANK"))
        final = await asyncio.wait_for(handle.result(), 60)
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED, final.error
    assert sorted(nodes.started) == [(0, 0), (0, 1)]
    assert [w.state for w in final.work] == [WorkState.EXITED, WorkState.EXITED]
    assert [w.exit_code for w in final.work] == [0, 0]
    rows = sorted(nodes.rows(), key=lambda r: r.node_rank)
    envs = [row.command["env"] for row in rows]
    assert [env["GPUPROV_NODE_RANK"] for env in envs] == ["0", "1"]
    assert {env["GPUPROV_NUM_NODES"] for env in envs} == {"2"}
    assert {env["GPUPROV_JOB_NAME"] for env in envs} == {job_name}
    ips = envs[0]["GPUPROV_NODE_IPS"].split("\n")
    assert len(ips) == 2 and envs[0]["GPUPROV_MASTER_ADDR"] == ips[0]
    assert rows[0].command["run"] == "echo rank $GPUPROV_NODE_RANK"


async def test_a_node_exiting_3_fails_the_job_naming_the_node_and_code(
    client, task_queue, job_name, records
):
    def rank_one_fails(rank: int, epoch: int) -> int | None:
        return 3 if rank == 1 else None  # rank 0 keeps running: it is stopped

    async with (
        worker_with_api(client, task_queue, records) as (gpuprov, cloud),
        nodes_running(client, records, job_name, rank_one_fails) as nodes,
    ):
        handle = await gpuprov.submit(job(job_name, 2, run="exit 3"))
        final = await asyncio.wait_for(handle.result(), 60)
        assert_nothing_left(cloud)
    assert final.state is JobState.FAILED
    assert final.error is not None
    assert "node 1" in final.error and "code 3" in final.error, final.error
    assert "rank 1 says goodbye" in final.error
    states = {w.rank: w.state for w in final.work}
    assert states == {0: WorkState.STOPPED, 1: WorkState.EXITED}
    assert sorted(nodes.started) == [(0, 0), (0, 1)]


async def test_a_preempted_node_restarts_the_work_on_another_offer_never_twice_at_once(
    client, task_queue, job_name, records
):
    def finish_in_the_second_epoch(rank: int, epoch: int) -> int | None:
        return 0 if epoch == 1 else None

    async with (
        worker_with_api(client, task_queue, records) as (gpuprov, cloud),
        nodes_running(client, records, job_name, finish_in_the_second_epoch) as nodes,
    ):
        spec = job(
            job_name,
            1,
            run="sleep 3600",
            health_check_interval_seconds=1,
            recovery={"max_restarts": 1},
        )
        handle = await gpuprov.submit(spec)
        running = await until(handle, lambda s: s.state is JobState.RUNNING)
        assert running.attempts[-1].offer.id == OFFER_A
        await until(handle, lambda s: bool(nodes.started))
        [instance] = cloud.live_instances()
        cloud.state.preempt(instance.id)
        final = await asyncio.wait_for(handle.result(), 90)
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED, final.error
    assert [a.offer.id for a in final.attempts] == [OFFER_A, OFFER_B]
    assert len(final.restarts) == 1 and "preempted" in final.restarts[0].cause
    assert nodes.started == [(0, 0), (1, 0)]  # started twice in all
    assert nodes.max_concurrent == 1  # never two at once
    assert any(b.key == OFFER_A for b in final.blocks)


async def test_cancel_while_running_stops_the_work_and_leaves_nothing(
    client, task_queue, job_name, records
):
    async with (
        worker_with_api(client, task_queue, records) as (gpuprov, cloud),
        nodes_running(client, records, job_name, lambda rank, epoch: None) as nodes,
    ):
        handle = await gpuprov.submit(job(job_name, 2, run="sleep 3600"))
        await until(handle, lambda s: len(nodes.started) == 2)
        await handle.cancel()
        final = await asyncio.wait_for(handle.result(), 60)
        assert_nothing_left(cloud)
    assert final.state is JobState.CANCELLED
    assert {w.state for w in final.work} == {WorkState.STOPPED}


async def test_max_runtime_releases_a_job_whose_work_never_ends(
    client, task_queue, job_name, records
):
    async with (
        worker_with_api(client, task_queue, records) as (gpuprov, cloud),
        nodes_running(client, records, job_name, lambda rank, epoch: None),
    ):
        handle = await gpuprov.submit(job(job_name, run="sleep 3600", max_runtime_seconds=3))
        final = await asyncio.wait_for(handle.result(), 60)
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED
    assert {w.state for w in final.work} == {WorkState.STOPPED}


async def test_max_runtime_releases_a_lease_too(client, task_queue, job_name):
    async with fake_worker(client, task_queue, fast_cloud()) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, max_runtime_seconds=2))
        final = await asyncio.wait_for(handle.result(), 60)
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED
