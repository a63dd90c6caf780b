"""The defects the chaos harness found (docs/reliability.md, "What the harness found"), each
reproduced deterministically on the real dev server and the fake cloud, and now fixed:

1. a cleanup that fails for good is recorded as an orphan, and the reconciler cleans up;
2. a failed attempt terminates every node whose create started, whichever node's kind decides;
3. a cancel (or the provisioning timeout) during a bookkeeping or plan step is a cancellation,
   never a failure, and blocks nothing;
4. cloud calls heartbeat, so a dead worker is noticed in seconds;
5. the worker waits for Temporal at start-up instead of exiting.
"""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import Client

from gpuprov.config import FaultRule, Settings, TemporalSettings
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState
from gpuprov.store.records import Records
from providers.errors import ErrorKind
from tests.helpers import (
    OFFER_A,
    assert_nothing_left,
    eventually,
    fake_worker,
    fast_cloud,
    job,
    node_of,
    ready_then_release,
    until,
)
from tests.workflows.test_reconcile import reconcile
from worker import connect_patiently

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Records:
    return open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")


async def test_a_cleanup_that_fails_for_good_is_an_orphan_the_reconciler_cleans_up(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    faults = [FaultRule(primitive="cleanup", kind=ErrorKind.CREDENTIALS, times=1)]
    async with fake_worker(client, task_queue, fast_cloud(faults), sqlite_records) as (gp, cloud):
        _, final = await ready_then_release(await gp.submit(job(job_name)))
        assert final.state is JobState.COMPLETED
        assert any("Credentials at cleanup" in leak for leak in final.leaks), final.leaks
        assert cloud.live_instances() == []
        assert len(cloud.state.live_side_resources()) == 1  # the firewall, left by the fault
        [orphan] = sqlite_records.open_orphans()
        assert orphan.vm.startswith(f"{job_name}-a1-n0-")
        assert orphan.last_error.startswith("cleanup: Credentials at cleanup")

        report = await reconcile(client, task_queue)
        assert report.resolved == 1, report
        assert_nothing_left(cloud)
        assert sqlite_records.open_orphans() == []


async def test_a_lost_create_is_terminated_whichever_node_decides_the_failure(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    # Node 0's create is Unavailable (nothing made); node 1's create lands, its answer lost.
    faults = [
        FaultRule(primitive="create", kind=ErrorKind.UNAVAILABLE, vm=f"{job_name}-a1-n0-", times=1),
        FaultRule(
            primitive="create",
            kind=ErrorKind.FAILED,
            effect="lost_response",
            vm=f"{job_name}-a1-n1-",
            times=1,
        ),
    ]
    async with fake_worker(client, task_queue, fast_cloud(faults), sqlite_records) as (gp, cloud):
        handle = await gp.submit(job(job_name, nodes=2))
        at_ready = await until(handle, lambda s: s.state is JobState.READY)
        assert at_ready.state is JobState.READY
        assert at_ready.attempts[0].kind is ErrorKind.UNAVAILABLE
        live = {node_of(row.vm) for row in cloud.live_instances()}
        assert live == {f"{job_name}-a2-n0", f"{job_name}-a2-n1"}  # a1-n1 was terminated
        await handle.release()
        final = await handle.result()
        assert final.state is JobState.COMPLETED and final.leaks == []
        assert_nothing_left(cloud)
        assert sqlite_records.open_orphans() == []


async def test_a_cancel_during_planning_ends_the_job_cancelled_and_blocks_nothing(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    faults = [FaultRule(primitive="plan", effect="delay", delay_seconds=3)]
    async with fake_worker(client, task_queue, fast_cloud(faults), sqlite_records) as (gp, cloud):
        handle = await gp.submit(job(job_name))
        await until(handle, lambda s: "offers" in (s.waiting_for or ""))
        # the plan activity is running now: the cloud is inside its slow plan call
        await eventually(lambda: cloud.fired(faults[0]) == 1, "the slow plan call under way")
        await handle.cancel()
        final = await handle.result()
        assert final.state is JobState.CANCELLED, final
        assert final.error is None
        assert final.blocks == []
        assert sqlite_records.active_blocks(datetime.now(UTC)) == []
        assert_nothing_left(cloud)


async def test_a_provisioning_timeout_during_planning_blocks_no_provider(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    faults = [FaultRule(primitive="plan", effect="delay", delay_seconds=4)]
    async with fake_worker(client, task_queue, fast_cloud(faults), sqlite_records) as (gp, _):
        handle = await gp.submit(job(job_name, provisioning_timeout_seconds=1))
        final = await handle.result()
        assert final.state is JobState.FAILED
        assert "provisioning timed out" in (final.error or "")
        assert final.blocks == []
        assert sqlite_records.active_blocks(datetime.now(UTC)) == []


async def test_cloud_calls_are_scheduled_with_a_heartbeat_timeout(
    client: Client, task_queue: str, job_name: str
) -> None:
    async with fake_worker(client, task_queue, fast_cloud()) as (gp, _):
        handle = await gp.submit(job(job_name))
        await ready_then_release(handle)
    history = await client.get_workflow_handle(f"job-{job_name}").fetch_history()
    heartbeats = {}
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled = event.activity_task_scheduled_event_attributes
            heartbeats[scheduled.activity_type.name] = scheduled.heartbeat_timeout.ToSeconds()
    for step in ("plan", "launch", "retire"):
        assert 0 < heartbeats[step] <= 15, (step, heartbeats)


async def test_the_worker_waits_for_temporal_and_stops_when_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    settings = Settings(temporal=TemporalSettings(address=address))
    stop = asyncio.Event()
    connecting = asyncio.create_task(connect_patiently(settings, stop))

    def failed_tries() -> int:
        return sum("cannot reach Temporal" in r.getMessage() for r in caplog.records)

    # two failed tries: so at least one backoff between them, and it kept trying
    await eventually(lambda: failed_tries() >= 2, "two failed connection tries")
    assert not connecting.done()
    stop.set()
    assert await asyncio.wait_for(connecting, 5) is None


async def test_the_worker_connects_once_temporal_answers(client: Client) -> None:
    address = client.service_client.config.target_host
    settings = Settings(temporal=TemporalSettings(address=address))
    connected = await asyncio.wait_for(connect_patiently(settings, asyncio.Event()), 10)
    assert connected is not None


async def test_a_job_whose_offers_are_all_blocked_by_others_waits_for_a_block_to_lapse(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    sqlite_records.record_block(
        scope="provider",
        key="fake",
        kind=ErrorKind.CAPACITY.value,
        message="another job's stockout",
        job="someone-else",
        ttl=timedelta(seconds=2),
    )
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gp, cloud):
        handle = await gp.submit(job(job_name))
        waiting = await until(handle, lambda s: (s.waiting_for or "").startswith("capacity: "))
        assert "3 offer(s) out of stock, 0 tried so far, next try fake/" in waiting.waiting_for
        assert waiting.attempts == []
        at_ready, final = await ready_then_release(handle)
        assert at_ready.state is JobState.READY
        assert [attempt.offer.id for attempt in at_ready.attempts] == [OFFER_A]
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)


async def test_a_job_still_fails_when_its_own_failures_spent_every_offer(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    faults = [FaultRule(primitive="create", kind=ErrorKind.CAPACITY)]
    async with fake_worker(client, task_queue, fast_cloud(faults), sqlite_records) as (gp, _):
        final = await (await gp.submit(job(job_name, placement={"capacity_wait": False}))).result()
        assert final.state is JobState.FAILED
        assert "every offer failed (3 tried)" in (final.error or "")
