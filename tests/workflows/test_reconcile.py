"""The orphan reconciler on the real dev server, the fake cloud and a real database.

A machine is deleted only when no live job owns it (database and Temporal agree) and it is
older than the grace period; kept machines are never touched; failed terminations are retried
with backoff until resolved; the Schedule that runs it is applied idempotently."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, select
from temporalio.client import Client, ScheduleActionStartWorkflow, ScheduleOverlapPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from activities import reconcile as reconcile_activities
from gpuprov.cli import main as cli
from gpuprov.cli.render import orphans_text
from gpuprov.config import FaultRule, ReconcileSettings
from gpuprov.contract import ReconcileInput, ReconcileReport
from gpuprov.engine.schedules import SCHEDULE_ID, apply_reconcile_schedule
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState
from gpuprov.store.db import OrphanRecord
from gpuprov.store.records import Records
from providers.base import InstanceSpec, ResourceRequest
from providers.errors import ErrorKind
from providers.fake import FakeCloud
from tests.helpers import (
    assert_nothing_left,
    fake_worker,
    fast_cloud,
    job,
    ready_then_release,
    start_unanswered_job,
    until,
)
from workflows.reconcile import Reconcile

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

# retire deletes, waits until observe shows nothing, marks the row terminated, then cleans up.
TEARDOWN_STEPS = ["retire", "resolve_orphan"]


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Records:
    return open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")


async def plant(cloud: FakeCloud, vm: str, region: str = "r1") -> list[str]:
    """A machine carrying the gpuprov identity that no job owns: prepared (a firewall side
    resource) and created straight through the cloud, with no VM row."""
    offers = [o for o in await cloud.plan(ResourceRequest()) if o.region == region]
    spec = InstanceSpec(vm=vm, job="ghost", node_index=0, attempt=1)
    prepared = await cloud.prepare(offers[0], spec)
    return await cloud.create(offers[0], prepared, spec)


async def reconcile(
    client: Client, task_queue: str, grace_seconds: float = 0, workflow_id: str | None = None
) -> ReconcileReport:
    return await client.execute_workflow(
        Reconcile.run,
        ReconcileInput(grace_seconds=grace_seconds),
        id=workflow_id or f"reconcile-{uuid.uuid4().hex[:12]}",
        task_queue=task_queue,
        execution_timeout=timedelta(minutes=2),
    )


async def activity_types(client: Client, workflow_id: str) -> list[str]:
    """Every step the workflow ran, in order: activities, and local activities (a marker)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [name for event in history.events if (name := step_name(event)) is not None]


def step_name(event: Any) -> str | None:
    if event.HasField("activity_task_scheduled_event_attributes"):
        return event.activity_task_scheduled_event_attributes.activity_type.name
    if event.HasField("marker_recorded_event_attributes"):
        marker = event.marker_recorded_event_attributes
        if marker.marker_name == "core_local_activity":
            [payload] = marker.details["data"].payloads
            return json.loads(payload.data)["activity_type"]
    return None


def age_orphan(records: Records, vm: str, by: timedelta) -> None:
    """Move an open orphan's clock back, as waiting `by` would."""
    with records.db.session() as session:
        query = select(OrphanRecord).where(
            OrphanRecord.vm == vm, col(OrphanRecord.resolved_at).is_(None)
        )
        for orphan in session.exec(query).all():
            orphan.first_seen -= by
            orphan.last_seen -= by
            session.add(orphan)
        session.commit()


async def first_scheduled_pass(client: Client, timeout: float = 30) -> str:
    """The workflow id of the first Reconcile the Schedule started."""
    handle = client.get_schedule_handle(SCHEDULE_ID)
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        info = (await handle.describe()).info
        actions = [*info.recent_actions, *info.running_actions]
        if actions:
            first = actions[0]
            result = getattr(first, "action", first)
            return result.workflow_id
        assert asyncio.get_running_loop().time() < deadline, "the schedule never started a pass"
        await asyncio.sleep(0.2)


async def delete_schedule(client: Client) -> None:
    for schedule_id in (SCHEDULE_ID, "gpuprov-liveness"):
        with contextlib.suppress(RPCError):  # absent: nothing to delete
            await client.get_schedule_handle(schedule_id).delete()


async def delete_schedule_at(address: str) -> None:
    await delete_schedule(await Client.connect(address, data_converter=pydantic_data_converter))


async def test_a_planted_orphan_is_deleted_confirmed_gone_cleaned_up_and_resolved(
    client, task_queue, records
):
    """On SQLite and on PostgreSQL (the `records` fixture runs both)."""
    vm = f"ghost-a1-n0-{uuid.uuid4().hex[:6]}"
    workflow_id = f"reconcile-{uuid.uuid4().hex[:12]}"
    async with fake_worker(client, task_queue, fast_cloud(), records) as (_, cloud):
        [instance_id] = await plant(cloud, vm)
        assert [row.id for row in cloud.live_instances()] == [instance_id]
        assert len(cloud.state.live_side_resources()) == 1

        report = await reconcile(client, task_queue, grace_seconds=0, workflow_id=workflow_id)

        assert report.errors == [], report
        assert_nothing_left(cloud)  # instance gone (observe confirms), firewall deleted
        [row] = cloud.state.instances(vm=vm)
        assert row.deleted_at is not None
    assert (report.found, report.deleted, report.resolved, report.still_open) == (1, 1, 1, 0)
    assert report.errors == []
    [orphan] = records.orphans(include_resolved=True)
    assert (orphan.vm, orphan.provider, orphan.region) == (vm, "fake", "r1")
    assert orphan.instance_ids == [instance_id]
    assert orphan.resolved_at is not None and orphan.last_error.startswith("unowned")
    assert records.open_orphans() == []
    # The job's own teardown steps, in order: nothing is marked done before observe says gone.
    steps = await activity_types(client, workflow_id)
    assert steps == ["reconcile_survey", "describe_providers", *TEARDOWN_STEPS]


async def test_a_live_jobs_machines_are_not_touched(client, task_queue, job_name, sqlite_records):
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        at_ready = await until(handle, lambda s: s.state is JobState.READY)

        report = await reconcile(client, task_queue, grace_seconds=0)

        assert (report.found, report.deleted, report.still_open) == (0, 0, 0), report
        assert [row.vm for row in cloud.live_instances()] == [at_ready.nodes[0].vm]
        assert sqlite_records.open_orphans() == []
        await handle.release()
        final = await handle.result()
        assert final.state is JobState.COMPLETED and not final.leaks
        assert_nothing_left(cloud)


async def test_a_row_whose_job_does_not_hold_the_machine_is_an_orphan(
    client, task_queue, job_name, sqlite_records
):
    """The database says a machine is a job's, but the job's workflow does not list it among
    its live nodes (a stale attempt), or there is no such workflow at all: database and Temporal
    must agree, so both are deleted; the running job's own machine stays."""
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        at_ready = await until(handle, lambda s: s.state is JobState.READY)
        stale, jobless = f"{job_name}-a9-n0-abcdef", f"{job_name}-gone-a1-n0-abcdef"
        for owner, vm in ((job_name, stale), (f"{job_name}-gone", jobless)):
            sqlite_records.record_vm(
                job=owner, node_index=0, attempt=1, vm=vm, provider="fake", region="r1", zone=None
            )
            await plant(cloud, vm)

        report = await reconcile(client, task_queue, grace_seconds=0)

        assert (report.found, report.deleted, report.resolved) == (2, 2, 2), report
        assert [row.vm for row in cloud.live_instances()] == [at_ready.nodes[0].vm]
        assert sqlite_records.get_vm(stale).status == "terminated"
        assert sqlite_records.get_vm(jobless).status == "terminated"
        assert sqlite_records.get_vm(at_ready.nodes[0].vm).status == "running"
        _, final = await ready_then_release(handle)
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)


async def test_a_machine_is_left_alone_while_temporal_cannot_say_who_owns_it(
    client, task_queue, job_name, sqlite_records, monkeypatch: pytest.MonkeyPatch
):
    """The job's workflow runs, but nothing answers its status query (no worker polls its
    queue): the owner is unknown, so the machine is not deleted."""
    monkeypatch.setattr(reconcile_activities, "TEMPORAL_RPC_TIMEOUT", timedelta(seconds=2))
    unanswered = await start_unanswered_job(client, job_name)
    vm = f"{job_name}-a1-n0-abcdef"
    try:
        async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (_, cloud):
            sqlite_records.record_vm(
                job=job_name,
                node_index=0,
                attempt=1,
                vm=vm,
                provider="fake",
                region="r1",
                zone=None,
            )
            await plant(cloud, vm)

            report = await reconcile(client, task_queue, grace_seconds=0)

            assert (report.found, report.deleted, report.still_open) == (0, 0, 1), report
            assert "owner unknown" in report.errors[0]
            assert [row.vm for row in cloud.live_instances()] == [vm]
            assert sqlite_records.orphans(include_resolved=True) == []
    finally:
        await unanswered.terminate()


async def test_a_failed_termination_is_retried_with_backoff_until_resolved(
    client, task_queue, job_name, sqlite_records
):
    """Credentials on delete aborts the job's teardown (a recorded orphan); the reconciler's
    first retry is refused too (attempts 2), the next pass backs off, a later one resolves it."""
    denied = FaultRule(
        primitive="delete", kind=ErrorKind.CREDENTIALS, vm=f"{job_name}-a1-", times=2
    )
    async with fake_worker(client, task_queue, fast_cloud([denied]), sqlite_records) as (
        gpuprov,
        cloud,
    ):
        _, final = await ready_then_release(await gpuprov.submit(job(job_name)))
        assert final.state is JobState.COMPLETED and final.leaks
        [orphan] = sqlite_records.open_orphans()
        assert orphan.attempts == 1 and "Credentials" in orphan.last_error
        assert len(cloud.live_instances()) == 1  # leaked

        failed = await reconcile(client, task_queue, grace_seconds=0)
        assert (failed.found, failed.deleted, failed.resolved, failed.still_open) == (0, 0, 0, 1)
        assert "Credentials" in failed.errors[0]
        [orphan] = sqlite_records.open_orphans()
        assert orphan.attempts == 2

        backing_off = await reconcile(client, task_queue, grace_seconds=0)
        assert (backing_off.deleted, backing_off.still_open) == (0, 1)
        assert "backing off after 2 attempts" in backing_off.left_open[0]

        age_orphan(sqlite_records, orphan.vm, timedelta(minutes=5))  # the backoff has passed
        resolved = await reconcile(client, task_queue, grace_seconds=0)
        assert (resolved.found, resolved.deleted, resolved.resolved) == (0, 1, 1), resolved
        assert resolved.still_open == 0
        assert_nothing_left(cloud)
    assert sqlite_records.open_orphans() == []
    [closed] = sqlite_records.orphans(include_resolved=True)
    assert closed.resolved_at is not None and closed.attempts == 2
    assert sqlite_records.get_vm(orphan.vm).status == "terminated"


async def test_an_unowned_machine_younger_than_the_grace_period_is_left_alone(
    client, task_queue, sqlite_records
):
    vm = f"ghost-a1-n0-{uuid.uuid4().hex[:6]}"
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (_, cloud):
        await plant(cloud, vm, region="r2")

        first = await reconcile(client, task_queue, grace_seconds=3600)
        again = await reconcile(client, task_queue, grace_seconds=3600)

        assert (first.found, first.deleted, first.still_open) == (1, 0, 1)
        assert "younger than the grace period" in first.left_open[0]
        assert (again.found, again.deleted, again.still_open) == (0, 0, 1)
        assert len(cloud.live_instances()) == 1
        [orphan] = sqlite_records.open_orphans()  # its first sighting starts the clock ...
        assert orphan.attempts == 1 and orphan.last_error.startswith("unowned")
        assert orphan.region == "r2"

        age_orphan(sqlite_records, vm, timedelta(hours=2))  # ... and a later pass deletes it
        later = await reconcile(client, task_queue, grace_seconds=3600)
        assert (later.found, later.deleted, later.resolved) == (0, 1, 1)
        assert_nothing_left(cloud)


async def test_a_kept_machine_is_never_deleted(client, task_queue, job_name, sqlite_records):
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gpuprov, cloud):
        _, final = await ready_then_release(await gpuprov.submit(job(job_name, release="keep")))
        assert [n.status for n in final.nodes] == ["kept"]

        report = await reconcile(client, task_queue, grace_seconds=0)

        assert (report.found, report.deleted, report.still_open) == (0, 0, 0)
        assert [row.vm for row in cloud.live_instances()] == [final.nodes[0].vm]
        assert [v.status for v in sqlite_records.vms_for_job(job_name)] == ["kept"]
        assert sqlite_records.orphans(include_resolved=True) == []


async def test_the_schedule_is_applied_idempotently_and_runs_the_reconciler(
    client, task_queue, sqlite_records
):
    await delete_schedule(client)
    try:
        assert await apply_reconcile_schedule(client, task_queue) == "created"
        assert await apply_reconcile_schedule(client, task_queue) == "unchanged"
        handle = client.get_schedule_handle(SCHEDULE_ID)
        schedule = (await handle.describe()).schedule
        action = schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert (action.workflow, action.task_queue) == ("Reconcile", task_queue)
        assert [i.every for i in schedule.spec.intervals] == [timedelta(minutes=5)]
        assert schedule.policy.overlap is ScheduleOverlapPolicy.SKIP

        # Changed settings update it; an operator's pause survives the update.
        await handle.pause(note="maintenance")
        faster = ReconcileSettings(every_seconds=60, grace_seconds=30)
        assert await apply_reconcile_schedule(client, task_queue, faster) == "updated"
        assert await apply_reconcile_schedule(client, task_queue, faster) == "unchanged"
        described = await handle.describe()
        assert [i.every for i in described.schedule.spec.intervals] == [timedelta(seconds=60)]
        assert described.schedule.state.paused

        # Triggered, it starts a Reconcile pass that a gpuprov worker runs.
        async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (_, cloud):
            await plant(cloud, f"ghost-a1-n0-{uuid.uuid4().hex[:6]}")
            await handle.trigger()
            workflow_id = await first_scheduled_pass(client)
            scheduled = client.get_workflow_handle(workflow_id, result_type=ReconcileReport)
            report = await scheduled.result()
            assert (report.found, report.still_open) == (1, 1)  # grace 30s: recorded, kept
    finally:
        await delete_schedule(client)


def test_gpuprov_schedules_apply_and_orphans_commands(
    temporal_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    address = temporal_env.client.service_client.config.target_host
    database = tmp_path / "cli.db"
    monkeypatch.delenv("GPUPROV_CONFIG", raising=False)
    monkeypatch.setenv("GPUPROV_DATABASE__URL", f"sqlite:///{database}")
    monkeypatch.setenv("GPUPROV_TEMPORAL__TASK_QUEUE", f"test-{uuid.uuid4().hex[:12]}")
    asyncio.run(delete_schedule_at(address))
    try:
        assert cli.main(["--address", address, "schedules", "apply"]) == 0
        assert cli.main(["--address", address, "schedules", "apply"]) == 0
    finally:
        asyncio.run(delete_schedule_at(address))
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"reconciler schedule {SCHEDULE_ID}: created (every 300s")
    assert out[1].startswith("liveness schedule gpuprov-liveness: created (every 30s")
    assert out[2].startswith(f"reconciler schedule {SCHEDULE_ID}: unchanged")
    assert out[3].startswith("liveness schedule gpuprov-liveness: unchanged")

    records = open_records(f"sqlite:///{database}")
    try:
        for region, vm, ids, error in (
            ("r1", "lost-a1-n0", ["i-1"], "x"),
            ("r2", "done-a1-n0", [], "y"),
        ):
            records.record_orphan(
                provider="fake", region=region, zone=None, vm=vm, instance_ids=ids, error=error
            )
        records.resolve_orphan("done-a1-n0")
    finally:
        records.db.dispose()
    assert cli.main(["orphans"]) == 0
    listed = capsys.readouterr().out
    assert "fake/r1 lost-a1-n0 [i-1] first seen" in listed and "attempts 1, OPEN" in listed
    assert "done-a1-n0" not in listed
    assert cli.main(["orphans", "--all"]) == 0
    everything = capsys.readouterr().out
    assert "fake/r2 done-a1-n0 [no ids]" in everything and ", resolved 20" in everything
    assert "    last error: y" in everything


def test_orphans_text_says_when_there_are_none() -> None:
    assert orphans_text([]) == "no open orphans"
    assert orphans_text([], include_resolved=True) == "no orphans"


def test_retry_backoff_doubles_from_the_second_attempt_and_is_capped() -> None:
    retry_delay = reconcile_activities.retry_delay
    minutes = [retry_delay(n) / timedelta(minutes=1) for n in range(1, 8)]
    assert minutes == [0, 4, 8, 16, 32, 60, 60]
