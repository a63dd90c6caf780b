"""A prepare or create still in flight when the job unwinds: nothing duplicated, nothing left.

The cloud here (`LandsLate`) holds one primitive's requests until the test lets them go, and
then carries them out whatever the caller did meanwhile: a request that reached the cloud, its
answer lost to a cancel or a timeout. Each test holds the request, makes the job unwind (its
provisioning timeout, or a cancel), lets the request land once the teardown has begun, and
checks the fake cloud's own ledger before any reconcile pass: one create per VM identity, no
instance and no side resource left.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest

from activities.cloud import CloudActivities, CreateInput
from activities.fencing import CallFence
from gpuprov.config import FaultRule
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState, WorkState
from gpuprov.store.db import utcnow
from gpuprov.store.fences import ClaimOutcome, VmFences
from gpuprov.store.work import Assignment, RunCommand, WorkRecords
from providers.base import InstanceSpec, Offer, ResourceRequest
from providers.fake import FakeCloud
from tests.helpers import (
    assert_nothing_left,
    assert_one_create_per_vm,
    fake_worker,
    fast_cloud,
    job,
    until,
)
from tests.providers.scrubbing import activity_failure

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


class LandsLate(FakeCloud):
    """The fake cloud, with `held` requests kept waiting until `gate` opens; a caller that
    stops waiting (cancelled) does not stop the request."""

    held = "create"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrived = asyncio.Event()
        self.gate = asyncio.Event()
        self.landed = 0

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        if self.held != "prepare":
            return await super().prepare(offer, spec)
        return await asyncio.shield(self._land(super().prepare(offer, spec)))

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        if self.held != "create":
            return await super().create(offer, prepared, spec)
        return await asyncio.shield(self._land(super().create(offer, prepared, spec)))

    async def _land(self, call: Any) -> Any:
        self.arrived.set()
        await self.gate.wait()
        try:
            return await call
        finally:
            self.landed += 1


class PrepareLandsLate(LandsLate):
    held = "prepare"


def _tearing_down(status: Any) -> bool:
    return status.state.terminal or (status.waiting_for or "").startswith("teardown")


async def _unwinds_with_the_request_landing_late(
    client: Any, task_queue: str, name: str, cloud_type: type[LandsLate], nodes: int, how: str
) -> None:
    timeout = 3 if how == "timeout" else 600
    spec = job(name, nodes=nodes, provisioning_timeout_seconds=timeout)
    async with fake_worker(client, task_queue, fast_cloud(), cloud_type=cloud_type) as (
        gpuprov,
        cloud,
    ):
        assert isinstance(cloud, LandsLate)
        handle = await gpuprov.submit(spec)
        await asyncio.wait_for(cloud.arrived.wait(), 30)
        if how == "cancel":
            await handle.cancel()
        # The job has given up on the request and begun its teardown; now the request lands.
        await until(handle, _tearing_down, timeout=60)
        cloud.gate.set()
        final = await asyncio.wait_for(handle.result(), 90)
        assert final.state is (JobState.CANCELLED if how == "cancel" else JobState.FAILED)
        assert cloud.landed >= 1, "the held request never landed"
        assert final.leaks == []
        assert_one_create_per_vm(cloud)
        assert_nothing_left(cloud)


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_a_create_that_lands_after_the_unwind_began_is_torn_down(
    client, task_queue, job_name, how
):
    await _unwinds_with_the_request_landing_late(client, task_queue, job_name, LandsLate, 1, how)


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_a_prepare_that_lands_after_the_unwind_began_leaves_no_firewall(
    client, task_queue, job_name, how
):
    await _unwinds_with_the_request_landing_late(
        client, task_queue, job_name, PrepareLandsLate, 2, how
    )


# ---------------------------------------------------------------- the fence itself


def test_a_second_attempt_waits_for_the_first_and_a_fenced_identity_refuses(records):
    fences = VmFences(records.db)
    later = _soon(60)
    assert fences.claim("vm-1", "run/1/1", later).outcome is ClaimOutcome.CLAIMED
    busy = fences.claim("vm-1", "run/1/2", later)
    assert busy.outcome is ClaimOutcome.BUSY and busy.until == later
    assert fences.fence("vm-1") == later  # the teardown waits for the call in flight
    fences.release("vm-1", "run/1/2")  # not the owner: changes nothing
    assert fences.in_flight_until("vm-1") == later
    fences.release("vm-1", "run/1/1")
    assert fences.in_flight_until("vm-1") is None
    assert fences.claim("vm-1", "run/1/3", later).outcome is ClaimOutcome.FENCED
    assert fences.fence("vm-2") is None  # a teardown may come first: nothing is made after it
    assert fences.claim("vm-2", "run/1/1", later).outcome is ClaimOutcome.FENCED


def test_a_lapsed_claim_frees_the_identity(records):
    fences = VmFences(records.db)
    assert fences.claim("vm-1", "run/1/1", _soon(-1)).outcome is ClaimOutcome.CLAIMED
    assert fences.claim("vm-1", "run/1/2", _soon(60)).outcome is ClaimOutcome.CLAIMED
    assert not fences.renew("vm-1", "run/1/1", _soon(60))  # the dead owner lost it


async def test_a_fenced_create_calls_nothing(records):
    """A create retried after its VM's teardown began refuses before any cloud call."""
    cloud = FakeCloud(fast_cloud())
    try:
        offer = (await cloud.plan(ResourceRequest()))[0]
        spec = InstanceSpec(vm="fenced-a1-n0-abcdef", job="fenced", node_index=0, attempt=1)
        assert await CallFence(VmFences(records.db)).raise_fence(spec.vm) is False
        activities = CloudActivities({"fake": cloud}, fences=VmFences(records.db))
        create = CreateInput(offer=offer, prepared={}, spec=spec)
        failure = await activity_failure(activities.create, create)
        assert failure.type == "Failed" and failure.non_retryable
        assert "teardown has begun" in failure.message
        assert cloud.state.creates_per_vm() == {}
        assert cloud.state.call_counts() == {("plan", "*"): 1}
    finally:
        await cloud.aclose()


def _soon(seconds: float) -> datetime:
    return utcnow() + timedelta(seconds=seconds)


async def test_the_fake_clouds_lands_late_rule_makes_a_timeout_land_mid_create(
    client, task_queue, job_name
):
    """What the chaos harness's mid-step jobs get: every first-attempt create lands after the
    provisioning timeout. The late machines are torn down by the job's own teardown."""
    late = FaultRule(primitive="create", effect="lands_late", delay_seconds=4, vm=f"{job_name}-a1-")
    spec = job(job_name, nodes=2, provisioning_timeout_seconds=2)
    async with fake_worker(client, task_queue, fast_cloud([late])) as (gpuprov, cloud):
        final = await asyncio.wait_for((await gpuprov.submit(spec)).result(), 90)
        assert final.state is JobState.FAILED
        assert "provisioning timed out" in (final.error or "")
        assert cloud.fired(late) == 2
        assert len(cloud.state.creates_per_vm()) == 2  # both landed, after the timeout
        assert_one_create_per_vm(cloud)
        assert_nothing_left(cloud)


async def test_work_handed_out_in_a_lost_workflow_task_is_given_up_when_the_job_ends(
    client, task_queue, job_name, tmp_path
) -> None:
    # Handing work out is a local activity: one that ran inside a workflow task that then
    # timed out (a busy worker) has written its rows, though the history the job follows to
    # its end never handed anything out. Such rows are written here by hand, while the job
    # still provisions; the job then fails by its deadline and must give them up.
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    hang = FaultRule(primitive="create", effect="boot_hang")
    work = WorkRecords(records.db)
    cloud_config = fast_cloud([hang], simulate_agent=True)
    try:
        async with fake_worker(client, task_queue, cloud_config, records) as (gp, cloud):
            spec = job(job_name, run="true", provisioning_timeout_seconds=4)
            handle = await gp.submit(spec)
            started = await until(handle, lambda s: bool(s.run and s.attempts))
            stray = Assignment(rank=0, worker_id="w-stray", command=RunCommand(run="true"))
            await asyncio.to_thread(work.assign, job_name, 0, [stray], started.run)
            final = await asyncio.wait_for(handle.result(), 60)
            assert final.state is JobState.FAILED
            assert "provisioning timed out" in (final.error or "")
            rows = await asyncio.to_thread(work.of_job, job_name, 0, started.run)
            assert [row.state for row in rows] == [WorkState.ABANDONED]
            assert_nothing_left(cloud)
    finally:
        records.db.dispose()
