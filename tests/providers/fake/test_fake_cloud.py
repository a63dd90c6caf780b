"""FakeCloud: its catalogue, the instance lifecycle, fault rules, and the shared state file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from providers.base import (
    Billing,
    InstanceSpec,
    InstanceStatus,
    Location,
    Observed,
    Offer,
    ResourceRequest,
)
from providers.errors import ErrorKind, ProviderError
from providers.fake import FakeCloud, FakeCloudState
from providers.fake.config import FakeInstanceType, FakeProviderConfig, FakeRegion, FaultRule
from tests.helpers import eventually

BOOT = 0.15  # generous: Pending must still hold on a loaded machine
DELETE = 0.15
VM = "job-a1-n0"
R1 = Location(provider="fake", region="r1", zone="r1-a")
R2 = Location(provider="fake", region="r2", zone="r2-a")


def config(faults: list[FaultRule] | None = None, **overrides: Any) -> FakeProviderConfig:
    settings: dict[str, Any] = dict(
        regions=[
            FakeRegion(name="r1", zones=["r1-a", "r1-b"]),
            FakeRegion(name="r2", zones=["r2-a"]),
            FakeRegion(name="r3"),
        ],
        instance_types=[
            FakeInstanceType(name="gpu8", gpu="H100", gpu_count=8, price=10.0, spot_price=4.0),
            FakeInstanceType(name="gpu1", gpu="A10", gpu_count=1, price=1.5, regions=["r1"]),
            FakeInstanceType(name="mystery", gpu="L4", gpu_count=1, regions=["r2"]),
        ],
        boot_delay_seconds=BOOT,
        delete_delay_seconds=DELETE,
        faults=faults or [],
    )
    settings.update(overrides)
    return FakeProviderConfig(**settings)


def spec(vm: str = VM) -> InstanceSpec:
    return InstanceSpec(vm=vm, job="job", node_index=0, attempt=1)


async def reaches(cloud: FakeCloud, status: InstanceStatus, vm: str = VM) -> list[Observed]:
    """What observe shows once every instance of `vm` (in r1) is in `status`, polled."""

    async def seen() -> list[Observed] | None:
        found = await cloud.observe(R1, vm)
        return found if found and all(o.status is status for o in found) else None

    return await eventually(seen, f"{vm} {status.value}")


async def wait_gone(cloud: FakeCloud, vm: str = VM) -> None:
    """Polls until observe shows nothing of `vm` in r1."""

    async def nothing() -> bool:
        return await cloud.observe(R1, vm) == []

    await eventually(nothing, f"{vm} gone")


async def offer_by_id(cloud: FakeCloud, offer_id: str) -> Offer:
    return next(o for o in await cloud.plan(ResourceRequest()) if o.id == offer_id)


async def launch(cloud: FakeCloud, offer_id: str = "fake/r1-a/gpu8", vm: str = VM) -> list[str]:
    offer = await offer_by_id(cloud, offer_id)
    return await cloud.create(offer, await cloud.prepare(offer, spec(vm)), spec(vm))


# ---------------------------------------------------------------- plan


# Every offer of config(), cheapest first: gpu1 1.5, gpu8 spot 4, gpu8 10, mystery unpriced.
PLAN_ORDER = [
    *("fake/r1-a/gpu1", "fake/r1-b/gpu1"),
    *("fake/r1-a/gpu8/spot", "fake/r1-b/gpu8/spot", "fake/r2-a/gpu8/spot", "fake/r3/gpu8/spot"),
    *("fake/r1-a/gpu8", "fake/r1-b/gpu8", "fake/r2-a/gpu8", "fake/r3/gpu8"),
    "fake/r2-a/mystery",
]


async def test_plan_makes_one_offer_per_region_zone_and_type_plus_spot() -> None:
    offers = await FakeCloud(config()).plan(ResourceRequest())
    assert len(offers) == len(PLAN_ORDER)
    assert {o.id for o in offers} == set(PLAN_ORDER)


async def test_offer_carries_the_catalogue_and_what_create_needs() -> None:
    cloud = FakeCloud(config())
    offer = await offer_by_id(cloud, "fake/r1-b/gpu8")
    assert (offer.provider, offer.region, offer.zone) == ("fake", "r1", "r1-b")
    assert (offer.instance_type, offer.gpu_name, offer.gpu_count) == ("gpu8", "H100", 8)
    assert offer.spot is False
    assert offer.detail == {"instance_type": "gpu8"}


async def test_region_without_zones_gets_a_zoneless_offer() -> None:
    offer = await offer_by_id(FakeCloud(config()), "fake/r3/gpu8")
    assert offer.region == "r3" and offer.zone is None


async def test_spot_offer_is_made_when_a_spot_price_is_set() -> None:
    offer = await offer_by_id(FakeCloud(config()), "fake/r1-a/gpu8/spot")
    assert offer.spot is True
    assert offer.price is not None and offer.price.amount == 4.0
    assert offer.detail == {"instance_type": "gpu8", "spot": True}


async def test_no_spot_offer_without_a_spot_price() -> None:
    offers = await FakeCloud(config()).plan(ResourceRequest())
    assert not any(o.spot for o in offers if o.instance_type == "gpu1")


async def test_price_is_a_simulated_usd_hourly_quote() -> None:
    offer = await offer_by_id(FakeCloud(config()), "fake/r1-a/gpu8")
    assert offer.price is not None
    assert offer.price.amount == 10.0
    assert (offer.price.currency, offer.price.unit, offer.price.source) == (
        "USD",
        "hour",
        "simulated",
    )
    assert offer.price.observed_at.tzinfo is not None


async def test_price_is_none_when_the_catalogue_has_none() -> None:
    offer = await offer_by_id(FakeCloud(config()), "fake/r2-a/mystery")
    assert offer.price is None


async def test_a_catalogue_price_of_zero_is_no_price_as_on_every_cloud() -> None:
    free = FakeInstanceType(name="gpu8", gpu="H100", gpu_count=8, price=0.0, spot_price=0.0)
    offers = await FakeCloud(config(instance_types=[free])).plan(ResourceRequest())
    assert offers and all(o.price is None for o in offers)


async def test_plan_sorts_cheapest_first_ties_by_id_unpriced_last() -> None:
    offers = await FakeCloud(config()).plan(ResourceRequest())
    assert [o.id for o in offers] == PLAN_ORDER


async def test_shuffled_plan_is_a_seeded_permutation_of_the_sorted_one() -> None:
    first = [o.id for o in await FakeCloud(config(), shuffle_offers=4).plan(ResourceRequest())]
    again = [o.id for o in await FakeCloud(config(), shuffle_offers=4).plan(ResourceRequest())]
    other = [o.id for o in await FakeCloud(config(), shuffle_offers=5).plan(ResourceRequest())]
    assert first == again  # deterministic for a seed
    assert sorted(first) == sorted(PLAN_ORDER) and first != PLAN_ORDER
    assert other != first


async def test_plan_creates_nothing() -> None:
    cloud = FakeCloud(config())
    await cloud.plan(ResourceRequest())
    assert cloud.state.instances() == [] and cloud.state.live_side_resources() == []


# ---------------------------------------------------------------- prepare / create / observe


async def test_prepare_is_idempotent_one_side_resource() -> None:
    cloud = FakeCloud(config())
    offer = await offer_by_id(cloud, "fake/r1-a/gpu8")
    first = await cloud.prepare(offer, spec())
    second = await cloud.prepare(offer, spec())
    assert first == second == {"firewall": f"gpuprov-{VM}-fw"}
    assert cloud.state.live_side_resources() == [(VM, "r1", "firewall", f"gpuprov-{VM}-fw")]


async def test_prepare_rejects_an_offer_this_cloud_never_made() -> None:
    cloud = FakeCloud(config())
    stranger = (await offer_by_id(cloud, "fake/r1-a/gpu8")).model_copy(
        update={"detail": {"instance_type": "nope"}}
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.prepare(stranger, spec())
    assert caught.value.kind is ErrorKind.INVALID_REQUEST


async def test_create_returns_one_id_and_records_the_instance() -> None:
    cloud = FakeCloud(config())
    ids = await launch(cloud)
    assert len(ids) == 1 and ids[0].startswith("fake-i-")
    (row,) = cloud.state.instances()
    assert (row.id, row.vm, row.region, row.zone) == (ids[0], VM, "r1", "r1-a")
    assert (row.offer_id, row.instance_type, row.boot_mode) == ("fake/r1-a/gpu8", "gpu8", "normal")


async def test_instance_is_pending_then_running_with_ssh_after_boot_delay() -> None:
    cloud = FakeCloud(config(ssh_host="10.0.0.9", ssh_port=2222))
    ids = await launch(cloud)
    (pending,) = await cloud.observe(R1, VM)
    assert (pending.id, pending.status, pending.ssh) == (ids[0], InstanceStatus.PENDING, None)
    (running,) = await reaches(cloud, InstanceStatus.RUNNING)
    assert running.status is InstanceStatus.RUNNING
    assert running.ssh is not None and (running.ssh.host, running.ssh.port) == ("10.0.0.9", 2222)


async def test_observe_only_sees_the_vm_in_that_region() -> None:
    cloud = FakeCloud(config())
    await launch(cloud)
    await launch(cloud, vm="other-vm")
    await launch(cloud, "fake/r2-a/gpu8")
    assert len(await cloud.observe(R1, VM)) == 1
    assert len(await cloud.observe(R2, VM)) == 1
    assert await cloud.observe(R1, "nobody") == []


async def test_delete_makes_it_stopping_then_gone_after_delete_delay() -> None:
    cloud = FakeCloud(config())
    ids = await launch(cloud)
    await reaches(cloud, InstanceStatus.RUNNING)
    await cloud.delete(R1, VM, ids)
    (stopping,) = await cloud.observe(R1, VM)
    assert stopping.status is InstanceStatus.STOPPING
    assert len(cloud.live_instances()) == 1
    await wait_gone(cloud)
    assert await cloud.observe(R1, VM) == []
    assert cloud.live_instances() == []


async def test_region_list_leaves_out_gone_instances_and_the_ledger_keeps_them() -> None:
    cloud = FakeCloud(config())
    gone, stopping = "job-gone-n0", "job-stopping-n0"
    gone_ids = await launch(cloud, vm=gone)
    stopping_ids = await launch(cloud, vm=stopping)
    await launch(cloud, vm=VM)
    await cloud.delete(R1, gone, gone_ids)
    await wait_gone(cloud, gone)
    await cloud.delete(R1, stopping, stopping_ids)
    listed = await cloud.observe_region(R1)
    assert set(listed) == {VM, stopping}
    assert [o.status for o in listed[stopping]] == [InstanceStatus.STOPPING]
    assert len(cloud.state.instances(region="r1")) == 3  # the ledger forgets nothing
    assert [row.vm for row in cloud.live_instances()] == [stopping, VM]


async def test_deleting_twice_does_not_restart_the_stopping_clock() -> None:
    cloud = FakeCloud(config())
    ids = await launch(cloud)
    await cloud.delete(R1, VM, ids)
    first = cloud.state.instances()[0].deleted_at
    await asyncio.sleep(0.01)
    await cloud.delete(R1, VM, ids)
    assert cloud.state.instances()[0].deleted_at == first


async def test_delete_of_unknown_ids_is_success() -> None:
    cloud = FakeCloud(config())
    ids = await launch(cloud)
    await cloud.delete(R1, VM, ["fake-i-999999"])
    await cloud.delete(R1, "never-created", ["fake-i-000001"])
    await cloud.delete(R2, VM, ids)  # right id, wrong region: not ours to delete
    assert [o.id for o in await cloud.observe(R1, VM)] == ids
    assert cloud.state.instances()[0].deleted_at is None


async def test_cleanup_removes_side_resources_of_that_vm_and_region_only() -> None:
    cloud = FakeCloud(config())
    await launch(cloud)
    await launch(cloud, vm="other-vm")
    await launch(cloud, "fake/r2-a/gpu8")
    await cloud.cleanup(R1, VM)
    assert sorted(cloud.state.live_side_resources()) == [
        (VM, "r2", "firewall", f"gpuprov-{VM}-fw"),
        ("other-vm", "r1", "firewall", "gpuprov-other-vm-fw"),
    ]
    await cloud.cleanup(R1, VM)  # idempotent


async def test_capabilities_carry_the_configured_timing_hints() -> None:
    hints = FakeCloud(config(boot_timeout=7, delete_timeout=3, poll_interval=0.2)).capabilities()
    assert (hints.boot_timeout, hints.delete_timeout, hints.poll_interval) == (7, 3, 0.2)
    assert hints.billing == Billing()  # exact seconds unless configured
    terms = Billing(granularity_seconds=60, minimum_seconds=60, source="test")
    assert FakeCloud(config(billing=terms)).capabilities().billing == terms


# ---------------------------------------------------------------- fault rules


async def test_error_fault_raises_its_kind_and_message_and_creates_nothing() -> None:
    rule = FaultRule(primitive="create", kind=ErrorKind.CAPACITY, message="sold out")
    cloud = FakeCloud(config([rule]))
    with pytest.raises(ProviderError) as caught:
        await launch(cloud)
    assert (caught.value.kind, caught.value.message) == (ErrorKind.CAPACITY, "sold out")
    assert cloud.state.instances() == []


@pytest.mark.parametrize("primitive", ["plan", "prepare", "observe", "delete", "cleanup"])
async def test_error_fault_fires_on_each_primitive(primitive: str) -> None:
    cloud = FakeCloud(config([FaultRule(primitive=primitive, kind=ErrorKind.QUOTA, times=1)]))
    offer = None if primitive == "plan" else await offer_by_id(cloud, "fake/r1-a/gpu8")
    calls = {
        "plan": lambda: cloud.plan(ResourceRequest()),
        "prepare": lambda: cloud.prepare(offer, spec()),
        "observe": lambda: cloud.observe(R1, VM),
        "delete": lambda: cloud.delete(R1, VM, []),
        "cleanup": lambda: cloud.cleanup(R1, VM),
    }
    with pytest.raises(ProviderError) as caught:
        await calls[primitive]()
    assert caught.value.kind is ErrorKind.QUOTA
    await calls[primitive]()  # times=1: the next call goes through


async def test_fault_skips_after_calls_then_fires_times_calls() -> None:
    cloud = FakeCloud(config([FaultRule(primitive="observe", after=2, times=2)]))
    outcomes = []
    for _ in range(6):
        try:
            await cloud.observe(R1, VM)
            outcomes.append("ok")
        except ProviderError as error:
            outcomes.append(error.kind.value)
    assert outcomes == ["ok", "ok", "Transient", "Transient", "ok", "ok"]


async def test_fault_without_times_fires_on_every_call() -> None:
    cloud = FakeCloud(config([FaultRule(primitive="observe", after=1)]))
    await cloud.observe(R1, VM)
    for _ in range(3):
        with pytest.raises(ProviderError):
            await cloud.observe(R1, VM)


async def test_region_filter_narrows_the_fault() -> None:
    cloud = FakeCloud(config([FaultRule(primitive="observe", region="r2")]))
    await cloud.observe(R1, VM)
    with pytest.raises(ProviderError):
        await cloud.observe(R2, VM)


async def test_offer_filter_narrows_the_fault() -> None:
    rule = FaultRule(primitive="create", offer="fake/r1-a/gpu8", kind=ErrorKind.CAPACITY)
    cloud = FakeCloud(config([rule]))
    with pytest.raises(ProviderError):
        await launch(cloud, "fake/r1-a/gpu8")
    assert len(await launch(cloud, "fake/r1-b/gpu8")) == 1


async def test_vm_filter_matches_by_prefix() -> None:
    cloud = FakeCloud(config([FaultRule(primitive="create", vm="job-a1")]))
    with pytest.raises(ProviderError):
        await launch(cloud, vm="job-a1-n3")
    assert len(await launch(cloud, vm="job-a2-n0")) == 1


async def test_non_matching_calls_do_not_use_up_the_rule() -> None:
    cloud = FakeCloud(config([FaultRule(primitive="observe", region="r2", times=1)]))
    for _ in range(3):
        await cloud.observe(R1, VM)
    with pytest.raises(ProviderError):
        await cloud.observe(R2, VM)
    await cloud.observe(R2, VM)


async def test_lost_response_creates_then_raises() -> None:
    cloud = FakeCloud(config([FaultRule(primitive="create", effect="lost_response", times=1)]))
    with pytest.raises(ProviderError) as caught:
        await launch(cloud)
    assert caught.value.kind is ErrorKind.TRANSIENT
    (observed,) = await cloud.observe(R1, VM)
    assert observed.status is InstanceStatus.PENDING
    assert cloud.state.creates_per_vm() == {VM: 1}


async def test_boot_failed_reports_failed_after_boot_delay() -> None:
    cloud = FakeCloud(config([FaultRule(primitive="create", effect="boot_failed")]))
    ids = await launch(cloud)
    assert (await cloud.observe(R1, VM))[0].status is InstanceStatus.PENDING
    (failed,) = await reaches(cloud, InstanceStatus.FAILED)
    assert (failed.id, failed.status, failed.ssh) == (ids[0], InstanceStatus.FAILED, None)
    assert failed.message == "instance failed to boot"


async def test_boot_hang_stays_pending() -> None:
    cloud = FakeCloud(config([FaultRule(primitive="create", effect="boot_hang", times=1)]))
    await launch(cloud)
    await launch(cloud, vm="control")  # created later, boots normally
    await reaches(cloud, InstanceStatus.RUNNING, vm="control")  # so the boot delay is over
    (hung,) = await cloud.observe(R1, VM)
    assert hung.status is InstanceStatus.PENDING


async def test_delay_fault_slows_the_call_then_proceeds() -> None:
    rule = FaultRule(primitive="observe", effect="delay", delay_seconds=0.3, times=1)
    cloud = FakeCloud(config([rule]))
    started = time.monotonic()
    assert await cloud.observe(R1, VM) == []
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    await cloud.observe(R1, VM)
    assert time.monotonic() - started < 0.3


async def test_delay_fault_does_not_hide_a_later_error_rule() -> None:
    rules = [
        FaultRule(primitive="create", effect="delay", delay_seconds=0.01),
        FaultRule(primitive="create", kind=ErrorKind.QUOTA),
    ]
    with pytest.raises(ProviderError) as caught:
        await launch(FakeCloud(config(rules)))
    assert caught.value.kind is ErrorKind.QUOTA


async def test_fault_fires_counts_only_the_calls_a_rule_fired_on() -> None:
    skipped = FaultRule(primitive="observe", after=2, times=2)
    elsewhere = FaultRule(primitive="observe", region="r2")
    slow = FaultRule(primitive="observe", effect="delay", delay_seconds=0.0, times=1)
    cloud = FakeCloud(config([slow, skipped, elsewhere]))
    for _ in range(6):
        with contextlib.suppress(ProviderError):
            await cloud.observe(R1, VM)
    assert cloud.fault_fires() == [(slow, 1), (skipped, 2), (elsewhere, 0)]
    assert (cloud.fired(slow), cloud.fired(skipped), cloud.fired(elsewhere)) == (1, 2, 0)


async def test_a_rule_behind_one_that_raised_is_not_counted_as_fired() -> None:
    first = FaultRule(primitive="create", kind=ErrorKind.CAPACITY, times=1)
    second = FaultRule(primitive="create", kind=ErrorKind.QUOTA, times=1)
    cloud = FakeCloud(config([first, second]))
    kinds = []
    for _ in range(3):
        try:
            await launch(cloud)
            kinds.append("ok")
        except ProviderError as error:
            kinds.append(error.kind.value)
    assert kinds == ["Capacity", "Quota", "ok"]
    assert cloud.fault_fires() == [(first, 1), (second, 1)]


def test_fired_refuses_a_rule_that_is_not_configured() -> None:
    with pytest.raises(KeyError):
        FakeCloud(config([FaultRule(primitive="plan")])).fired(FaultRule(primitive="create"))


# ---------------------------------------------------------------- state, counts, restarts


async def test_call_counts_are_per_primitive_and_region() -> None:
    cloud = FakeCloud(config())
    await launch(cloud)  # plan, prepare, create
    await cloud.observe(R1, VM)
    await cloud.observe(R1, VM)
    await cloud.observe(R2, VM)
    assert cloud.state.call_counts() == {
        ("plan", "*"): 1,
        ("prepare", "r1"): 1,
        ("create", "r1"): 1,
        ("observe", "r1"): 2,
        ("observe", "r2"): 1,
    }


async def test_failed_calls_are_counted_too() -> None:
    cloud = FakeCloud(config([FaultRule(primitive="delete")]))
    with pytest.raises(ProviderError):
        await cloud.delete(R1, VM, [])
    assert cloud.state.call_counts() == {("delete", "r1"): 1}


async def test_creates_per_vm_counts_every_create_even_deleted() -> None:
    cloud = FakeCloud(config())
    ids = await launch(cloud)
    await launch(cloud)
    await launch(cloud, vm="other-vm")
    await cloud.delete(R1, VM, ids)
    assert cloud.state.creates_per_vm() == {VM: 2, "other-vm": 1}


async def test_two_clouds_on_one_state_file_share_instances(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.db")
    first, second = FakeCloud(config(state_path=path)), FakeCloud(config(state_path=path))
    try:
        ids = await launch(first)
        assert [o.id for o in await second.observe(R1, VM)] == ids
        await second.delete(R1, VM, ids)
        assert (await first.observe(R1, VM))[0].status is InstanceStatus.STOPPING
    finally:
        await first.aclose()
        await second.aclose()


async def test_state_file_survives_a_restart_with_fault_counters(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.db")
    rules = [FaultRule(primitive="create", kind=ErrorKind.CAPACITY, times=1)]
    before = FakeCloud(config(rules, state_path=path))
    with pytest.raises(ProviderError):
        await launch(before)
    ids = await launch(before)
    await before.aclose()

    after = FakeCloud(config(rules, state_path=path))  # the worker restarted
    try:
        assert [o.id for o in await after.observe(R1, VM)] == ids
        assert len(await launch(after, vm="job-a2-n0")) == 1  # the one-shot fault stays spent
        assert after.state.creates_per_vm() == {VM: 1, "job-a2-n0": 1}
        assert after.state.call_counts()[("create", "r1")] == 3
        assert len(after.state.live_side_resources()) == 2
        assert after.fault_fires() == [(rules[0], 1)]  # the ledger keeps the firings too
    finally:
        await after.aclose()


async def test_instance_ids_stay_unique_across_clouds_on_one_file(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.db")
    first, second = FakeCloud(config(state_path=path)), FakeCloud(config(state_path=path))
    try:
        ids = await launch(first) + await launch(second) + await launch(first)
        assert len(set(ids)) == 3
    finally:
        await first.aclose()
        await second.aclose()


async def test_in_memory_clouds_do_not_share_state() -> None:
    first, second = FakeCloud(config()), FakeCloud(config())
    await launch(first)
    assert await second.observe(R1, VM) == []


def test_one_process_at_a_time_runs_an_instances_agent(tmp_path: Path) -> None:
    """Two workers observing one booted instance must not both run its agent (the second
    would spend the join token again); a worker killed while running it hands it on."""
    path = str(tmp_path / "state.db")
    first, second = FakeCloudState(path), FakeCloudState(path)  # two worker processes
    instance = first.add_instance(
        vm="j-a1-n0",
        region="r1",
        zone=None,
        offer_id="o",
        instance_type="gpu8",
        boot_mode="normal",
        api_url="http://127.0.0.1:9",
        join_token="t",
    )
    exited = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    killed_worker, other_worker = int(exited.stdout), os.getppid()

    assert first.claim_agent(instance, pid=killed_worker)
    [row] = second.instances()
    assert row.agent_state == "running"
    assert second.claim_agent(instance, pid=other_worker), "its runner died: taken over"
    assert not first.claim_agent(instance), "a live process runs it"
    assert second.claim_agent(instance, pid=other_worker), "the runner itself may go on"
    second.set_agent_state(instance, "registered")
    assert not second.claim_agent(instance, pid=other_worker)
    first.close()
    second.close()
