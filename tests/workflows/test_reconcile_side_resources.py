"""The reconciler and per-VM side resources left without a machine, on the real dev server, the
fake cloud and a real database.

Prepare makes a firewall per VM before create makes the machine; a job that ends between the
two, or whose teardown failed before its cleanup, leaves the firewall behind with no instance.
One pass lists every region's side resources by identity, judges their VM as it judges a
machine (kept: untouched; owned by a live job: untouched; owner unknown: left alone), and
gives an unowned one the job's teardown, whose cleanup removes them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from activities import reconcile as reconcile_activities
from gpuprov.config import FaultRule
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState
from gpuprov.store.records import Records
from providers.base import InstanceSpec, Location, ResourceRequest
from providers.errors import ErrorKind
from providers.fake import FakeCloud
from tests.helpers import (
    assert_nothing_left,
    fake_worker,
    fast_cloud,
    job,
    ready_then_release,
    start_unanswered_job,
)
from tests.workflows.test_reconcile import plant, reconcile

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Records:
    return open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")


async def prepare_only(cloud: FakeCloud, vm: str, region: str = "r1", **spec: object) -> None:
    """What a job leaves when it ends between prepare and create: the VM's firewall (and its
    ports rule), no instance, no VM row."""
    offers = [o for o in await cloud.plan(ResourceRequest()) if o.region == region]
    await cloud.prepare(offers[0], InstanceSpec(vm=vm, job="gone", node_index=0, attempt=1, **spec))


def side_vms(cloud: FakeCloud) -> list[str]:
    return sorted({vm for vm, *_ in cloud.state.live_side_resources()})


async def test_side_resources_without_instance_or_owner_are_cleaned_up_in_one_pass(
    client, task_queue, job_name, sqlite_records
):
    """Two firewalls left behind: one with no row at all, one whose row names a job that has
    ended (the node was enrolled, its create failed, its teardown never ran). One pass with no
    grace period removes both and closes their orphan records; nothing else is touched."""
    rowless = f"{job_name}-a1-n0-{uuid.uuid4().hex[:6]}"
    enrolled = f"{job_name}-a2-n0-{uuid.uuid4().hex[:6]}"
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (_, cloud):
        await prepare_only(cloud, rowless, ports=[8080])
        await prepare_only(cloud, enrolled, region="r2")
        sqlite_records.record_vm(
            job=job_name,
            node_index=0,
            attempt=2,
            vm=enrolled,
            provider="fake",
            region="r2",
            zone=None,
        )
        assert side_vms(cloud) == sorted([rowless, enrolled])

        report = await reconcile(client, task_queue, grace_seconds=0)

        assert report.errors == [], report
        assert_nothing_left(cloud)
        assert cloud.state.creates_per_vm() == {}  # cleanup made nothing, deleted nothing else
    assert (report.found, report.deleted, report.resolved, report.still_open) == (2, 0, 2, 0)
    assert sorted(report.gone_vms) == sorted([rowless, enrolled])
    assert sqlite_records.open_orphans() == []
    closed = {orphan.vm: orphan for orphan in sqlite_records.orphans(include_resolved=True)}
    assert closed[rowless].region == "r1" and closed[enrolled].region == "r2"
    assert "side resources left: firewall gpuprov-" in closed[rowless].last_error
    assert f"ports gpuprov-{rowless}-ports" in closed[rowless].last_error
    assert f"(job {job_name})" in closed[enrolled].last_error
    assert sqlite_records.get_vm(enrolled).status == "terminated"


async def test_side_resources_younger_than_the_grace_period_wait(
    client, task_queue, sqlite_records
):
    """A first sighting starts the clock, as for a machine without a record."""
    vm = f"ghost-a1-n0-{uuid.uuid4().hex[:6]}"
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (_, cloud):
        await prepare_only(cloud, vm)

        report = await reconcile(client, task_queue, grace_seconds=3600)

        assert (report.found, report.resolved, report.still_open) == (1, 0, 1), report
        assert "younger than the grace period" in report.left_open[0]
        assert side_vms(cloud) == [vm]
        [orphan] = sqlite_records.open_orphans()
        assert orphan.vm == vm and orphan.last_error.startswith("unowned: no instance")


async def test_a_live_jobs_firewall_is_not_touched_before_its_machine_exists(
    client, task_queue, job_name, sqlite_records
):
    """The job has prepared its node (firewall made, node enrolled) and its create is still
    under way: the job lists the node live, so the pass leaves the firewall alone and records
    nothing; the job then becomes ready and gives everything back."""
    slow_create = FaultRule(
        primitive="create", effect="delay", delay_seconds=6, vm=f"{job_name}-a1-", times=1
    )
    async with fake_worker(client, task_queue, fast_cloud([slow_create]), sqlite_records) as (
        gpuprov,
        cloud,
    ):
        handle = await gpuprov.submit(job(job_name))
        # create has enrolled the node and is in the cloud's call
        await until_true(lambda: ("create", "r1") in cloud.state.call_counts())
        [vm] = side_vms(cloud)
        assert cloud.live_instances() == []

        report = await reconcile(client, task_queue, grace_seconds=0)

        assert (report.found, report.resolved, report.still_open) == (0, 0, 0), report
        assert side_vms(cloud) == [vm]
        assert sqlite_records.orphans(include_resolved=True) == []
        at_ready, final = await ready_then_release(handle)
        assert at_ready.nodes[0].vm == vm
        assert final.state is JobState.COMPLETED and not final.leaks
        assert_nothing_left(cloud)


async def test_a_kept_vms_firewall_stays_after_its_machine_went(
    client, task_queue, job_name, sqlite_records
):
    """The user kept the machine, then deleted it by hand: its firewall is the user's to
    remove too, and the pass does not touch it."""
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gpuprov, cloud):
        _, final = await ready_then_release(await gpuprov.submit(job(job_name, release="keep")))
        [node] = final.nodes
        assert node.status == "kept"
        await cloud.delete(node.location, node.vm, node.instance_ids)
        await until_true(lambda: cloud.live_instances() == [])

        report = await reconcile(client, task_queue, grace_seconds=0)

        assert (report.found, report.resolved, report.still_open) == (0, 0, 0), report
        assert side_vms(cloud) == [node.vm]
        assert sqlite_records.orphans(include_resolved=True) == []


async def test_side_resources_are_left_alone_while_their_jobs_owner_is_unknown(
    client, task_queue, job_name, sqlite_records, monkeypatch: pytest.MonkeyPatch
):
    """No VM row yet (a job prepares before it enrols), and the job the identity names runs
    but answers no query: never delete on doubt, and no orphan record either."""
    monkeypatch.setattr(reconcile_activities, "TEMPORAL_RPC_TIMEOUT", timedelta(seconds=2))
    unanswered = await start_unanswered_job(client, job_name)
    vm = f"{job_name}-a1-n0-abcdef"
    try:
        async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (_, cloud):
            await prepare_only(cloud, vm)

            report = await reconcile(client, task_queue, grace_seconds=0)

            assert (report.found, report.resolved, report.still_open) == (0, 0, 1), report
            assert "owner unknown" in report.errors[0]
            assert side_vms(cloud) == [vm]
            assert sqlite_records.orphans(include_resolved=True) == []
    finally:
        await unanswered.terminate()


async def test_a_machine_and_its_firewall_stay_on_the_instance_path(
    client, task_queue, sqlite_records
):
    """A VM with an instance is a machine to delete (deleted, not "gone"): its teardown cleans
    its firewall once the machine is confirmed gone."""
    vm = f"ghost-a1-n0-{uuid.uuid4().hex[:6]}"
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (_, cloud):
        await plant(cloud, vm)

        report = await reconcile(client, task_queue, grace_seconds=0)

        assert (report.found, report.deleted, report.resolved) == (1, 1, 1), report
        assert report.deleted_vms == [vm] and report.gone_vms == []
        assert_nothing_left(cloud)


async def test_a_failed_side_listing_is_an_error_and_the_machines_are_still_swept(
    client, task_queue, sqlite_records
):
    failing = FaultRule(primitive="list_side", kind=ErrorKind.TRANSIENT, region="r1")
    ghost, leftover = (f"ghost-a1-n{i}-{uuid.uuid4().hex[:6]}" for i in range(2))
    async with fake_worker(client, task_queue, fast_cloud([failing]), sqlite_records) as (
        _,
        cloud,
    ):
        await plant(cloud, ghost)
        await prepare_only(cloud, leftover)

        report = await reconcile(client, task_queue, grace_seconds=0)

        assert any(e.startswith("list side resources fake/r1: ") for e in report.errors)
        assert (report.deleted, report.resolved) == (1, 1), report
        assert side_vms(cloud) == [leftover]  # found on a later pass


async def test_the_fake_cloud_lists_side_resources_by_vm_per_region() -> None:
    cloud = FakeCloud(fast_cloud())
    try:
        await prepare_only(cloud, "a-a1-n0-abcdef", ports=[8080])
        await prepare_only(cloud, "b-a1-n0-abcdef", region="r2")
        r1, r2 = Location(provider="fake", region="r1"), Location(provider="fake", region="r2")
        assert await cloud.observe_side_resources(r1) == {
            "a-a1-n0-abcdef": [
                "firewall gpuprov-a-a1-n0-abcdef-fw",
                "ports gpuprov-a-a1-n0-abcdef-ports",
            ]
        }
        await cloud.cleanup(r2, "b-a1-n0-abcdef")
        assert await cloud.observe_side_resources(r2) == {}
        assert cloud.state.call_counts()[("list_side", "r1")] == 1
    finally:
        await cloud.aclose()


async def until_true(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.05)
