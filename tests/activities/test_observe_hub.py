"""ObserveHub: one list call per (provider, region) per poll interval, never a stale answer."""

from __future__ import annotations

import asyncio
from typing import Any

from activities.observe_hub import ObserveHub
from providers.base import (
    CloudProvider,
    InstanceStatus,
    Location,
    Observed,
)
from tests.helpers import eventually

R1 = Location(provider="rec", region="r1", zone="r1-a")
INTERVAL = 0.2


class RecordingCloud(CloudProvider):
    """Lists a region from an in-memory dict; records when each list call started."""

    name = "rec"

    def __init__(self, regional: bool = True, list_seconds: float = 0.0) -> None:
        self.instances: dict[str, list[Observed]] = {}
        self.list_starts: list[float] = []
        self.per_vm_calls = 0
        self._regional = regional
        self._list_seconds = list_seconds

    async def observe_region(self, location: Location) -> dict[str, list[Observed]] | None:
        if not self._regional:
            return None
        self.list_starts.append(asyncio.get_running_loop().time())
        snapshot = {vm: list(obs) for vm, obs in self.instances.items()}
        await asyncio.sleep(self._list_seconds)
        return snapshot

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        self.per_vm_calls += 1
        return list(self.instances.get(vm, []))

    async def plan(self, request: Any) -> list[Any]:
        return []

    async def prepare(self, offer: Any, spec: Any) -> dict[str, Any]:
        return {}

    async def create(self, offer: Any, prepared: Any, spec: Any) -> list[str]:
        return []

    async def delete(self, location: Location, vm: str, ids: list[str]) -> None:
        return None

    async def cleanup(self, location: Location, vm: str) -> None:
        return None


def running(instance_id: str) -> list[Observed]:
    return [Observed(id=instance_id, status=InstanceStatus.RUNNING)]


async def test_fifty_waiters_share_one_list_call_and_each_sees_its_own_vm():

    cloud, hub = RecordingCloud(), ObserveHub()
    for n in range(50):
        cloud.instances[f"vm-{n}"] = running(f"i-{n}")
    results = await asyncio.gather(
        *(hub.observe(cloud, R1, f"vm-{n}", INTERVAL) for n in range(50))
    )
    assert len(cloud.list_starts) == 1
    assert cloud.per_vm_calls == 0
    assert [r[0].id for r in results] == [f"i-{n}" for n in range(50)]
    assert await hub.observe(cloud, R1, "unknown-vm", INTERVAL) == []


async def test_list_calls_for_a_region_start_at_least_one_interval_apart():

    cloud, hub = RecordingCloud(), ObserveHub()
    for _ in range(5):  # five polling rounds by 20 waiters, back to back
        await asyncio.gather(*(hub.observe(cloud, R1, f"vm-{n}", INTERVAL) for n in range(20)))
    assert len(cloud.list_starts) == 5
    gaps = [b - a for a, b in zip(cloud.list_starts, cloud.list_starts[1:], strict=False)]
    assert all(gap >= INTERVAL * 0.99 for gap in gaps), gaps


async def test_a_waiter_is_never_answered_by_a_list_that_started_before_it_asked():

    cloud, hub = RecordingCloud(list_seconds=0.3), ObserveHub()
    first = asyncio.create_task(hub.observe(cloud, R1, "vm-0", INTERVAL))
    # the first list is in flight and saw no instance (it snapshots as it starts)
    await eventually(lambda: len(cloud.list_starts) == 1, "the first list call started")
    cloud.instances["vm-0"] = running("i-0")  # the machine appears now
    asked_at = asyncio.get_running_loop().time()
    late = await hub.observe(cloud, R1, "vm-0", INTERVAL)
    assert await first == []  # the old call's view
    assert [o.id for o in late] == ["i-0"]  # a fresh call's view
    assert cloud.list_starts[-1] >= asked_at


async def test_one_waiter_cancelled_does_not_cancel_the_shared_call():

    cloud, hub = RecordingCloud(list_seconds=0.2), ObserveHub()
    cloud.instances["vm-1"] = running("i-1")
    doomed = asyncio.create_task(hub.observe(cloud, R1, "vm-0", INTERVAL))
    survivor = asyncio.create_task(hub.observe(cloud, R1, "vm-1", INTERVAL))
    await eventually(lambda: cloud.list_starts, "the shared list call started")
    doomed.cancel()  # while both wait on that one call
    assert [o.id for o in await survivor] == ["i-1"]
    assert len(cloud.list_starts) == 1


async def test_a_cloud_that_cannot_list_a_region_is_observed_per_vm():

    cloud, hub = RecordingCloud(regional=False), ObserveHub()
    cloud.instances["vm-0"] = running("i-0")
    assert [o.id for o in await hub.observe(cloud, R1, "vm-0", INTERVAL)] == ["i-0"]
    assert [o.id for o in await hub.observe(cloud, R1, "vm-0", INTERVAL)] == ["i-0"]
    assert cloud.per_vm_calls == 2


class FailingCloud(RecordingCloud):
    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    async def observe_region(self, location: Location) -> dict[str, list[Observed]] | None:
        self.list_starts.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0.1)
        self.failed = True
        raise RuntimeError("the cloud is closed")


async def test_a_list_call_nobody_waits_for_any_more_does_not_log_an_unhandled_error():
    import gc

    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    try:
        hub, cloud = ObserveHub(), FailingCloud()
        waiter = asyncio.create_task(hub.observe(cloud, R1, "vm-0", INTERVAL))
        await eventually(lambda: cloud.list_starts, "the shared list call started")
        waiter.cancel()  # its activity was cancelled; the shared call goes on and fails
        await eventually(lambda: cloud.failed, "the shared list call failed")
        for _ in range(3):  # its task ends and its done callbacks run
            await asyncio.sleep(0)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert unhandled == []
