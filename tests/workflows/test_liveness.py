"""The liveness sweep on the real dev server and a real database: WatchWorkers marks silent
workers lost and sends `workers_changed` to the job of every worker that changed, once per
change, skipping jobs that are closed; `job_workers` reads the truth; the Schedule
"gpuprov-liveness" is applied idempotently and runs the sweep."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, ScheduleActionStartWorkflow, ScheduleOverlapPolicy
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment

from activities.liveness import JobWorkersInput, LivenessActivities, SweepReport
from gpuprov.config import WorkersSettings
from gpuprov.contract import WatchInput
from gpuprov.engine.schedules import LIVENESS_SCHEDULE_ID, apply_liveness_schedule
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState, WorkerLiveness
from gpuprov.store.credentials import issue_worker_credential
from gpuprov.store.db import WorkerRecord, utcnow
from gpuprov.store.liveness import Liveness
from gpuprov.store.records import Records
from tests.gpuprov.test_api import CAPABILITIES
from tests.helpers import fake_worker, fast_cloud, job, until
from workflows.liveness import WatchWorkers


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Records:
    return open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")


def existing_worker(
    records: Records, label: str, job: str | None = None, run: str | None = None
) -> str:
    """A worker with eight healthy H100s, as a registration writes it: an idle existing one,
    or with `job`, a managed node reserved for that job (for its `run`)."""
    with records.db.session() as session:
        worker = records.register_worker(
            session,
            origin="managed" if job else "existing",
            provider=None,
            region=None,
            label=label,
            vm=None,
            job=job,
            capabilities=CAPABILITIES,
            state="reserved" if job else "idle",
        )
        if run is not None:  # a managed node's run is its machine's: here, no machine
            worker.run = run
        issue_worker_credential(session, worker.id)
        session.commit()
    return worker.id


async def sweep(client: Client, task_queue: str, lost_after: float = 90.0) -> SweepReport:
    return await client.execute_workflow(
        WatchWorkers.run,
        WatchInput(lost_after_seconds=lost_after),
        id=f"liveness-{uuid.uuid4().hex[:12]}",
        task_queue=task_queue,
        execution_timeout=timedelta(minutes=2),
    )


async def wake_ups(client: Client, job_name: str) -> int:
    """How many `workers_changed` signals the job's history holds."""
    history = await client.get_workflow_handle(f"job-{job_name}").fetch_history()
    return sum(
        event.workflow_execution_signaled_event_attributes.signal_name == "workers_changed"
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    )


async def test_a_change_wakes_its_job_once_and_a_closed_job_is_skipped(
    client, task_queue, job_name, sqlite_records
):
    worker_id = existing_worker(sqlite_records, "box-1")
    liveness = Liveness(sqlite_records.db)
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gpuprov, _):
        handle = await gpuprov.submit(job(job_name, placement={"provisioning": False}))
        ready = await until(handle, lambda s: s.state is JobState.READY)
        assert [w.worker_id for w in ready.existing_workers] == [worker_id]

        quiet = await sweep(client, task_queue)  # nothing changed: nobody is told
        assert (quiet.lost, quiet.signalled, quiet.skipped) == ([], [], [])
        liveness.heartbeat(worker_id, healthy=False, detail="GPU 00000000:A8:00.0 is lost")

        told = await sweep(client, task_queue)
        again = await sweep(client, task_queue)

        assert told.signalled == [job_name] and again.signalled == []
        assert await wake_ups(client, job_name) == 1
        row = sqlite_records.get_worker(worker_id)
        assert row is not None and row.notified_at == row.changed_at is not None

        # A managed worker of the job changes, and the job ends before any sweep: its row is
        # revoked and keeps the job's name; nobody is left to tell, and it is not tried again.
        node_id = existing_worker(sqlite_records, "node", job=job_name, run=ready.run)
        liveness.heartbeat(node_id, healthy=False, detail="Xid 48")
        await handle.release()
        await asyncio.wait_for(handle.result(), 60)
        node = sqlite_records.get_worker(node_id)
        assert node is not None and (node.state, node.job) == ("revoked", job_name)
        closed = await sweep(client, task_queue)
        assert (closed.signalled, closed.skipped) == ([], [job_name])
        assert (await sweep(client, task_queue)).skipped == []
        assert await wake_ups(client, job_name) == 1


async def test_a_silent_worker_is_marked_lost_and_its_job_told(
    client, task_queue, job_name, sqlite_records
):
    worker_id = existing_worker(sqlite_records, "box-2")
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gpuprov, _):
        handle = await gpuprov.submit(job(job_name, placement={"provisioning": False}))
        await until(handle, lambda s: s.state is JobState.READY)
        with sqlite_records.db.session() as session:  # its last sign of life, long ago
            row = session.get_one(WorkerRecord, worker_id)
            row.last_seen_at = utcnow() - timedelta(minutes=5)
            session.commit()

        report = await sweep(client, task_queue, lost_after=90)

        assert (report.lost, report.signalled) == ([worker_id], [job_name])
        assert await wake_ups(client, job_name) == 1
        env = ActivityEnvironment()
        truth = await env.run(
            LivenessActivities(sqlite_records, client).job_workers, JobWorkersInput(job=job_name)
        )
        assert [(w.worker_id, w.liveness, w.state, w.origin) for w in truth] == [
            (worker_id, "lost", "busy", "existing")
        ]
        assert isinstance(truth[0], WorkerLiveness) and truth[0].vm is None
        await handle.release()
        await asyncio.wait_for(handle.result(), 60)


async def delete_liveness_schedule(client: Client) -> None:
    with contextlib.suppress(RPCError):
        await client.get_schedule_handle(LIVENESS_SCHEDULE_ID).delete()


async def test_the_liveness_schedule_is_applied_idempotently_and_runs_the_sweep(
    client, task_queue, sqlite_records
):
    await delete_liveness_schedule(client)
    try:
        assert await apply_liveness_schedule(client, task_queue) == "created"
        assert await apply_liveness_schedule(client, task_queue) == "unchanged"
        handle = client.get_schedule_handle(LIVENESS_SCHEDULE_ID)
        schedule = (await handle.describe()).schedule
        action = schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert (action.workflow, action.task_queue) == ("WatchWorkers", task_queue)
        assert [i.every for i in schedule.spec.intervals] == [timedelta(seconds=30)]
        assert schedule.policy.overlap is ScheduleOverlapPolicy.SKIP

        await handle.pause(note="maintenance")
        faster = WorkersSettings(heartbeat_interval_seconds=1, lost_after_seconds=3)
        faster = faster.model_copy(update={"sweep_every_seconds": 2})
        assert await apply_liveness_schedule(client, task_queue, faster) == "updated"
        assert await apply_liveness_schedule(client, task_queue, faster) == "unchanged"
        described = await handle.describe()
        assert [i.every for i in described.schedule.spec.intervals] == [timedelta(seconds=2)]
        assert described.schedule.state.paused

        worker_id = existing_worker(sqlite_records, "box-3")
        with sqlite_records.db.session() as session:
            session.get_one(WorkerRecord, worker_id).last_seen_at = utcnow() - timedelta(hours=1)
            session.commit()
        async with fake_worker(client, task_queue, fast_cloud(), sqlite_records):
            await handle.trigger()
            deadline = asyncio.get_running_loop().time() + 30
            while (row := sqlite_records.get_worker(worker_id)) and row.liveness != "lost":
                assert asyncio.get_running_loop().time() < deadline, "no sweep ran"
                await asyncio.sleep(0.2)
    finally:
        await delete_liveness_schedule(client)
