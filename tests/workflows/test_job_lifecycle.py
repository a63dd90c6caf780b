"""ProvisionJob end to end on the real dev server: adoption, timeouts, cancellation, multi-node,
cost cap, release policies, search attributes.

Tests that say which offer a job tries, and in what order, run the fake cloud with its offers
shuffled (`SHUFFLED`): the order then comes from the workflow's ranking, not from the fake's
plan, which is already cheapest first."""

from __future__ import annotations

import asyncio

import pytest

from gpuprov import contract
from gpuprov.config import FakeInstanceType, FakeRegion, FaultRule
from gpuprov.models import AttemptOutcome, JobState
from providers.base import ResourceRequest
from providers.errors import ErrorKind
from providers.fake import FakeCloud
from tests.helpers import (
    OFFER_A,
    OFFER_B,
    OFFER_C,
    SHUFFLED,
    assert_nothing_left,
    assert_one_create_per_vm,
    creates_by_node,
    fake_worker,
    fast_cloud,
    job,
    ready_then_release,
    until,
)

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


async def _planned(config) -> list[str]:
    """The offer ids as the shuffled fake cloud's plan returns them (a cloud of its own)."""
    cloud = FakeCloud(config, shuffle_offers=SHUFFLED)
    try:
        return [offer.id for offer in await cloud.plan(ResourceRequest())]
    finally:
        await cloud.aclose()


async def test_lost_create_response_adopts_the_instance_instead_of_duplicating(
    client, task_queue, job_name
):
    lost = FaultRule(
        primitive="create", effect="lost_response", message="connection reset", times=1
    )
    config = fast_cloud([lost])
    async with fake_worker(client, task_queue, config, shuffle_offers=SHUFFLED) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        at_ready, final = await ready_then_release(handle)
        assert at_ready.state is JobState.READY
        assert creates_by_node(cloud.state) == {f"{job_name}-a1-n0": 1}
        assert [a.offer.id for a in at_ready.attempts] == [OFFER_A]
        assert at_ready.nodes[0].instance_ids == ["fake-i-000001"]
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)


async def test_boot_that_never_finishes_times_out_tears_down_and_fails_over(
    client, task_queue, job_name
):
    hang = FaultRule(primitive="create", effect="boot_hang", offer=OFFER_A)
    config = fast_cloud([hang], boot_timeout=2)
    async with fake_worker(client, task_queue, config, shuffle_offers=SHUFFLED) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        at_ready, final = await ready_then_release(handle)
        first, second = at_ready.attempts
        assert (first.offer.id, first.kind, first.step) == (
            OFFER_A,
            ErrorKind.FAILED,
            "wait_running",
        )
        assert "boot_timeout" in (first.message or "")
        assert second.offer.id == OFFER_B and second.outcome is AttemptOutcome.SUCCEEDED
        assert at_ready.nodes[0].status == "terminated"  # the hung instance, gone
        assert final.state is JobState.COMPLETED
        assert_one_create_per_vm(cloud)
        assert_nothing_left(cloud)


async def test_boot_into_failed_is_torn_down_and_next_offer_used(client, task_queue, job_name):
    broken = FaultRule(primitive="create", effect="boot_failed", offer=OFFER_A)
    config = fast_cloud([broken])
    async with fake_worker(client, task_queue, config, shuffle_offers=SHUFFLED) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        at_ready, final = await ready_then_release(handle)
        assert at_ready.attempts[0].kind is ErrorKind.FAILED
        assert "failed to boot" in (at_ready.attempts[0].message or "")
        assert at_ready.attempts[1].offer.id == OFFER_B
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)


async def test_three_node_job_with_one_failed_node_tears_down_the_whole_attempt(
    client, task_queue, job_name
):
    broken = FaultRule(primitive="create", effect="boot_failed", vm=f"{job_name}-a1-n1")
    config = fast_cloud([broken])
    async with fake_worker(client, task_queue, config, shuffle_offers=SHUFFLED) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, nodes=3))
        at_ready, final = await ready_then_release(handle)
        assert [a.offer.id for a in at_ready.attempts] == [OFFER_A, OFFER_B]
        first_attempt = [n for n in at_ready.nodes if n.attempt == 1]
        assert [n.status for n in first_attempt] == ["terminated"] * 3
        running = [n for n in at_ready.nodes if n.attempt == 2]
        assert [n.status for n in running] == ["running"] * 3
        assert all(n.ssh is not None for n in running)
        creates = creates_by_node(cloud.state)
        assert creates == {f"{job_name}-a{a}-n{n}": 1 for a in (1, 2) for n in range(3)}
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)


async def test_provisioning_timeout_fails_the_job_and_releases_instances(
    client, task_queue, job_name
):
    hang = FaultRule(primitive="create", effect="boot_hang")
    config = fast_cloud([hang], boot_timeout=120)
    async with fake_worker(client, task_queue, config) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, nodes=2, provisioning_timeout_seconds=2))
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.FAILED
        assert "provisioning timed out after 2s" in (final.error or "")
        assert final.attempts[0].outcome is AttemptOutcome.ABANDONED
        assert len(cloud.state.creates_per_vm()) == 2  # both nodes were created ...
        assert_nothing_left(cloud)  # ... and both are gone


async def _cancel_when(handle, predicate) -> None:
    await until(handle, predicate, timeout=30)
    await handle.cancel()


async def test_cancel_during_create_leaves_no_instance(client, task_queue, job_name):
    slow_create = FaultRule(primitive="create", effect="delay", delay_seconds=2)
    async with fake_worker(client, task_queue, fast_cloud([slow_create])) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, nodes=2))
        await _cancel_when(handle, lambda s: (s.waiting_for or "").startswith("create"))
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.CANCELLED
        # The creates finished (cancellation waits for them), then were torn down.
        assert len(cloud.state.creates_per_vm()) == 2
        assert_nothing_left(cloud)


async def test_cancel_during_wait_running_leaves_no_instance(client, task_queue, job_name):
    async with fake_worker(client, task_queue, fast_cloud(boot_delay_seconds=30)) as (
        gpuprov,
        cloud,
    ):
        handle = await gpuprov.submit(job(job_name, nodes=2))
        await _cancel_when(handle, lambda s: (s.waiting_for or "").startswith("running"))
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.CANCELLED
        assert [n.status for n in final.nodes] == ["terminated", "terminated"]
        assert_nothing_left(cloud)


async def test_cancel_during_compensation_still_finishes_the_teardown(client, task_queue, job_name):
    broken = FaultRule(primitive="create", effect="boot_failed", offer=OFFER_A)
    config = fast_cloud([broken], delete_delay_seconds=3)
    async with fake_worker(client, task_queue, config, shuffle_offers=SHUFFLED) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, nodes=2))
        await _cancel_when(handle, lambda s: (s.waiting_for or "").startswith("teardown"))
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.CANCELLED
        assert [a.offer.id for a in final.attempts] == [OFFER_A]  # no failover after cancel
        assert final.nodes and all(n.status == "terminated" for n in final.nodes)
        assert_nothing_left(cloud)


async def test_cancel_when_ready_terminates_everything(client, task_queue, job_name):
    async with fake_worker(client, task_queue, fast_cloud()) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, nodes=2))
        await _cancel_when(handle, lambda s: s.state is JobState.READY)
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.CANCELLED
        assert_nothing_left(cloud)


async def test_cost_cap_rejects_unpriced_offers(client, task_queue, job_name):
    unpriced = fast_cloud(
        regions=[FakeRegion(name="r1", zones=["r1-a"])],
        instance_types=[FakeInstanceType(name="gpu8", gpu="H100", gpu_count=8, price=None)],
    )
    async with fake_worker(client, task_queue, unpriced) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, max_hourly_cost=100.0))
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.FAILED
        assert final.attempts == []
        assert "fake/r1-a/gpu8: no reliable price and the job has a cost cap" in (final.error or "")
        assert cloud.state.creates_per_vm() == {}


async def test_unpriced_offers_are_tried_last_without_a_cap(client, task_queue, job_name):
    catalogue = [
        FakeInstanceType(name="a-unpriced", gpu="H100", gpu_count=8, price=None),
        FakeInstanceType(name="z-priced", gpu="H100", gpu_count=8, price=50.0),
    ]
    config = fast_cloud(regions=[FakeRegion(name="r1")], instance_types=catalogue)
    # The cloud answers unpriced first: only the workflow's ranking puts the priced one first.
    assert await _planned(config) == ["fake/r1/a-unpriced", "fake/r1/z-priced"]
    async with fake_worker(client, task_queue, config, shuffle_offers=SHUFFLED) as (
        gpuprov,
        _cloud,
    ):
        at_ready, _ = await ready_then_release(await gpuprov.submit(job(job_name)))
        assert at_ready.attempts[0].offer.id == "fake/r1/z-priced"


async def test_equal_prices_break_ties_by_offer_id(client, task_queue, job_name):
    # OFFER_A and OFFER_B cost the same; A sorts first by id, so it is tried first. The cloud
    # answers dearest first and the tie the other way round: only the ranking picks A.
    config = fast_cloud()
    assert await _planned(config) == [OFFER_C, OFFER_B, OFFER_A]
    async with fake_worker(client, task_queue, config, shuffle_offers=SHUFFLED) as (
        gpuprov,
        _cloud,
    ):
        at_ready, _ = await ready_then_release(await gpuprov.submit(job(job_name)))
        assert [a.offer.id for a in at_ready.attempts] == [OFFER_A]


async def test_cost_cap_counts_every_node(client, task_queue, job_name):
    # 2 nodes x 10 = 20 > 15 on region r1; r2 costs 24: nothing fits.
    async with fake_worker(client, task_queue, fast_cloud()) as (gpuprov, _cloud):
        handle = await gpuprov.submit(job(job_name, nodes=2, max_hourly_cost=15.0))
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.FAILED
        assert "20.00 USD/hour for 2 node(s) > cap 15.00" in (final.error or "")


async def test_release_keep_leaves_machines_running(client, task_queue, job_name):
    async with fake_worker(client, task_queue, fast_cloud()) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, release="keep"))
        _, final = await ready_then_release(handle)
        assert final.state is JobState.COMPLETED
        assert [n.status for n in final.nodes] == ["kept"]
        assert len(cloud.live_instances()) == 1


async def test_every_offer_failing_lists_each_offer_kind_and_message(client, task_queue, job_name):
    stockout = FaultRule(primitive="create", kind=ErrorKind.CAPACITY, message="sold out here")
    async with fake_worker(client, task_queue, fast_cloud([stockout])) as (gpuprov, cloud):
        # Without the capacity wait: a job that waits would retry them until its deadline.
        spec = job(job_name, placement={"capacity_wait": False})
        final = await asyncio.wait_for((await gpuprov.submit(spec)).result(), 60)
        assert final.state is JobState.FAILED
        assert "every offer failed (3 tried)" in (final.error or "")
        for offer in ("fake/r1-a/gpu8", "fake/r1-b/gpu8", "fake/r2-a/gpu8"):
            assert f"{offer} (fake/" in final.error
        assert final.error.count("Capacity at create: sold out here") == 3
        assert_nothing_left(cloud)


async def test_search_attributes_and_list_follow_the_job(client, task_queue, job_name):
    async with fake_worker(client, task_queue, fast_cloud()) as (gpuprov, _cloud):
        handle = await gpuprov.submit(job(job_name))
        await until(handle, lambda s: s.state is JobState.READY)
        query = (
            f"{contract.STATE.name}='ready' AND {contract.PROVIDER.name}='fake'"
            f" AND {contract.REGION.name}='r1' AND {contract.GPU.name}='H100'"
            f" AND WorkflowId='job-{job_name}'"
        )
        for _ in range(50):  # visibility is eventually consistent
            found = [wf.id async for wf in client.list_workflows(query)]
            if found:
                break
            await asyncio.sleep(0.1)
        assert found == [f"job-{job_name}"]
        listed = await gpuprov.list(state=JobState.READY, provider="fake")
        assert (job_name, JobState.READY, "fake") in [(j.name, j.state, j.provider) for j in listed]
        await handle.release()
        await handle.result()


async def test_duplicate_job_name_is_refused(client, task_queue, job_name):
    from gpuprov.sdk.client import JobAlreadyExists

    async with fake_worker(client, task_queue, fast_cloud()) as (gpuprov, _cloud):
        handle = await gpuprov.submit(job(job_name))
        try:
            await gpuprov.submit(job(job_name))
            raise AssertionError("a second job with the same name was accepted")
        except JobAlreadyExists as error:
            assert job_name in str(error)
        await handle.cancel()
        await handle.result()


async def test_unavailable_create_leaves_a_not_created_node_that_is_never_placed(
    client, task_queue, job_name
):
    nope = FaultRule(primitive="create", kind=ErrorKind.UNAVAILABLE, offer=OFFER_A)
    async with fake_worker(client, task_queue, fast_cloud([nope])) as (gpuprov, cloud):
        at_ready, final = await ready_then_release(await gpuprov.submit(job(job_name)))
        first, second = at_ready.nodes
        assert (first.attempt, first.status) == (1, "not_created")
        assert (second.attempt, second.status) == (2, "running")
        assert at_ready.live_nodes() == [second]
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)
