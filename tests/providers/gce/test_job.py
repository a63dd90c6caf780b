"""A whole ProvisionJob on the real Temporal dev server against the gce adapter over respx: the
cheapest zone stocks out through the insert operation, the job fails over to the next zone, the
machine's `user-data` metadata boots the node agent, which registers through the real API, the
job is ready, is released, and the instance and its firewall rule are deleted. A job's image
and ports reach the VM, and the ports' own rule is deleted with it."""

from __future__ import annotations

import asyncio

import pytest

from gpuprov.models import AttemptOutcome, BlockScope, JobState
from providers.errors import ErrorKind
from providers.gce.identity import firewall_name, instance_name, ports_firewall_name
from tests.helpers import job, ready_then_release
from tests.nodes import agent_stack, booting_nodes
from tests.providers.gce.fake_gce import FakeGce, gce_worker

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


def launched_user_data(fake: FakeGce) -> dict[str, str]:
    """The `user-data` metadata value of every instance the fake holds, by zone and name."""
    return {
        f"{zone}/{name}": item["value"]
        for (zone, name), instance in list(fake.instances.items())
        for item in instance["metadata"]["items"]
        if item["key"] == "user-data"
    }


FIRST = "gce/us-central1-a/a3-highgpu-8g"  # 8 x 1.00 USD, tried first (ties break on id)
SECOND = "gce/us-central1-b/a3-highgpu-8g"


async def test_stockout_in_one_zone_fails_over_to_the_next_and_everything_is_deleted(
    client, task_queue, job_name, tmp_path
):
    fake = FakeGce(stockout_zones={"us-central1-a"})
    cloud = fake.cloud()
    try:
        async with (
            agent_stack(client, task_queue, {"gce": cloud}, tmp_path) as stack,
            booting_nodes(lambda: launched_user_data(fake), tmp_path) as agents,
        ):
            handle = await stack.gpuprov.submit(job(job_name))
            at_ready, final = await ready_then_release(handle)
    finally:
        await cloud.aclose()

    assert at_ready.state is JobState.READY, at_ready.error
    first, second = at_ready.attempts
    assert (first.offer.id, first.kind, first.step) == (FIRST, ErrorKind.CAPACITY, "create")
    assert "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" in (first.message or "")
    assert second.offer.id == SECOND and second.outcome is AttemptOutcome.SUCCEEDED
    node = next(n for n in at_ready.nodes if n.attempt == 2)
    assert node.instance_ids == [f"us-central1-b/{instance_name(node.vm)}"]
    assert node.ssh is not None and node.ssh.host == "34.118.0.10"
    assert at_ready.hourly_cost is not None and at_ready.hourly_cost.amount == 8.0
    [agent] = agents  # one machine booted, its agent registered: the node the job placed
    assert agent.returncode == 0, agent.stderr
    assert node.worker_id is not None and node.worker_id in agent.stdout

    assert final.state is JobState.COMPLETED
    assert fake.inserts == [("us-central1-b", instance_name(node.vm))]  # one machine, no dupes
    assert fake.live_instances() == []
    assert fake.firewalls == {}, "firewall rules left behind"
    first_vm = next(n.vm for n in at_ready.nodes if n.attempt == 1)
    assert firewall_name(first_vm) not in fake.firewalls


async def test_gpus_all_regions_quota_blocks_every_gce_offer_at_once(client, task_queue, job_name):
    fake = FakeGce(exceeded_quota="GPUS_ALL_REGIONS")
    async with gce_worker(client, task_queue, {"gce": fake.cloud()}) as gpuprov:
        # With the capacity wait (the default) the job would wait for the quota to free up.
        handle = await gpuprov.submit(job(job_name, placement={"capacity_wait": False}))
        final = await asyncio.wait_for(handle.result(), 60)

    assert final.state is JobState.FAILED
    assert [(a.offer.id, a.kind) for a in final.attempts] == [(FIRST, ErrorKind.QUOTA)]
    assert any(b.scope is BlockScope.PROVIDER and b.key == "gce" for b in final.blocks)
    assert "GPUS_ALL_REGIONS" in (final.error or "")
    assert fake.live_instances() == [] and fake.firewalls == {}


async def test_the_jobs_image_and_ports_reach_the_vm_and_its_ports_rule_goes_at_release(
    client, task_queue, job_name, tmp_path
):
    fake = FakeGce()
    cloud = fake.cloud()
    family = "projects/deeplearning-platform-release/global/images/family/common-cu124"
    seen: dict[str, object] = {}

    def while_ready(status) -> None:
        seen["rules"] = {name: rule["allowed"] for name, rule in fake.firewalls.items()}
        seen["sources"] = [
            disk["initializeParams"]["sourceImage"]
            for instance in fake.instances.values()
            for disk in instance["disks"]
        ]

    try:
        async with (
            agent_stack(client, task_queue, {"gce": cloud}, tmp_path) as stack,
            booting_nodes(lambda: launched_user_data(fake), tmp_path),
        ):
            spec = job(job_name, image=family, ports=[8888, 6006])
            handle = await stack.gpuprov.submit(spec)
            at_ready, final = await ready_then_release(handle, on_ready=while_ready)
    finally:
        await cloud.aclose()

    assert at_ready.state is JobState.READY, at_ready.error
    (node,) = at_ready.nodes
    assert seen["sources"] == [family]
    assert seen["rules"] == {
        firewall_name(node.vm): [{"IPProtocol": "tcp", "ports": ["22"]}],
        ports_firewall_name(node.vm): [{"IPProtocol": "tcp", "ports": ["6006", "8888"]}],
    }
    assert final.state is JobState.COMPLETED
    assert fake.live_instances() == [] and fake.firewalls == {}  # both rules deleted
