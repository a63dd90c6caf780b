"""The fake cloud's simulated agents against an API mocked here: a `partitioned` node is cut off
from the API `delay_seconds` after it registered (or sooner, when the ledger is told to cut it
off), while its machine runs on, and the ledger says
when the work it holds stops (its last answered heartbeat's send time, the lease that answer
granted, the grace its assignment gives); a registered agent whose worker process is gone goes
on heartbeating from the next process, with the credential it kept, at its first call."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import respx

from providers.base import InstanceSpec, InstanceStatus, Location, NodeBootstrap, ResourceRequest
from providers.fake import FakeCloud, FakeCloudState
from providers.fake.config import FakeInstanceType, FakeProviderConfig, FakeRegion, FaultRule
from tests.helpers import eventually

API = "http://api.test"
VM = "job-a1-n0-abc123"
R1 = Location(provider="fake", region="r1", zone="r1-a")
LEASE, GRACE, CUT_AFTER = 3.0, 2.0, 0.8


def cloud_on(path: Path, *faults: FaultRule) -> FakeCloud:
    return FakeCloud(
        FakeProviderConfig(
            regions=[FakeRegion(name="r1", zones=["r1-a"])],
            instance_types=[FakeInstanceType(name="gpu8", gpu="H100", gpu_count=8, price=10.0)],
            boot_delay_seconds=0.05,
            simulate_agent=True,
            run_work=False,
            state_path=str(path),
            faults=list(faults),
        )
    )


class Api:
    """The control plane's side, as far as an agent sees it: registration, heartbeats that
    name the work `w1`, and that work's assignment; every heartbeat's arrival is kept."""

    def __init__(self, mock: respx.MockRouter) -> None:
        self.beats: list[tuple[float, str]] = []  # (arrival, credential)
        self.registrations = mock.post("/v1/workers/register").mock(
            return_value=httpx.Response(200, json={"credential": "gpw_node"})
        )
        mock.post("/v1/workers/heartbeat").mock(side_effect=self._beat)
        assignment = {"id": "w1", "state": "started", "command": {"run": "true", "env": {}}}
        mock.get("/v1/work").mock(
            return_value=httpx.Response(200, json={**assignment, "stop_grace_seconds": GRACE})
        )

    def _beat(self, request: httpx.Request) -> httpx.Response:
        self.beats.append((time.time(), request.headers["Authorization"].split()[-1]))
        answer = {"interval_seconds": 0.1, "lease_seconds": LEASE, "state": "busy"}
        return httpx.Response(200, json={**answer, "work_id": "w1", "draining": False})


async def boot(cloud: FakeCloud) -> None:
    offer = next(o for o in await cloud.plan(ResourceRequest()) if o.id == "fake/r1-a/gpu8")
    spec = InstanceSpec(
        vm=VM,
        job="job",
        node_index=0,
        attempt=1,
        bootstrap=NodeBootstrap(api_url=API, join_token="t"),
    )
    await cloud.create(offer, await cloud.prepare(offer, spec), spec)
    await running(cloud)


async def running(cloud: FakeCloud) -> None:
    """Observed Running (which is where the fake starts, or takes over, the machine's agent)."""

    async def seen() -> bool:
        found = await cloud.observe(R1, VM)
        return bool(found) and all(o.status is InstanceStatus.RUNNING for o in found)

    await eventually(seen, f"{VM} running")


async def test_a_partitioned_node_is_cut_off_and_the_ledger_says_when_its_work_stops(
    tmp_path: Path,
) -> None:
    rule = FaultRule(primitive="create", effect="partitioned", delay_seconds=CUT_AFTER, vm="job-")
    cloud = cloud_on(tmp_path / "state.db", rule)
    try:
        with respx.mock(base_url=API, assert_all_called=False) as mock:
            api = Api(mock)
            await boot(cloud)

            def cut_and_held() -> bool:
                leases = cloud.state.agent_leases()
                cut_at = leases[0].cut_at if leases else None
                return bool(leases) and leases[0].work_id == "w1" and time.time() > (cut_at or 0)

            await eventually(cut_and_held, "the agent cut off, holding its work")
            heard = len(api.beats)
            await asyncio.sleep(1.0)  # ten heartbeat intervals of silence: the absence checked
            [lease] = cloud.state.agent_leases()
            assert len(api.beats) == heard, "nothing arrives once it is cut off"
            assert lease.cut_at is not None and all(at < lease.cut_at for at, _ in api.beats)
            assert lease.sent_at is not None and lease.sent_at <= api.beats[-1][0]
            assert api.beats[-1][0] - lease.sent_at < 0.5, "the last answered one was kept"
            assert (lease.lease_seconds, lease.stop_grace) == (LEASE, GRACE)
            assert lease.work_stops_at == lease.sent_at + LEASE + GRACE
            assert lease.vm == VM and lease.deleted_at is None
            [observed] = await cloud.observe(R1, VM)
            assert observed.status is InstanceStatus.RUNNING, "the machine runs on"
            assert cloud.fired(rule) == 1
    finally:
        await cloud.aclose()


async def test_a_registered_agent_heartbeats_on_from_the_next_worker_process(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    first = cloud_on(path)
    with respx.mock(base_url=API, assert_all_called=False) as mock:
        api = Api(mock)
        try:
            await boot(first)
            await eventually(lambda: len(api.beats) >= 2, "heartbeats")
        finally:
            await first.aclose()  # its process is gone: so is every task it ran
        gone = len(api.beats)
        second = cloud_on(path)
        try:
            await second.plan(ResourceRequest())  # any call: no job needs to observe it
            await eventually(lambda: len(api.beats) >= gone + 2, "heartbeats again")
        finally:
            await second.aclose()
    assert api.registrations.call_count == 1, "it registered once"
    assert {credential for _, credential in api.beats} == {"gpw_node"}


def test_an_agent_is_taken_over_only_from_a_dead_process_and_never_once_refused(
    tmp_path: Path,
) -> None:
    state = FakeCloudState(str(tmp_path / "state.db"))
    try:
        instance = state.add_instance(
            vm=VM, region="r1", zone=None, offer_id="o", instance_type="gpu8", boot_mode="normal"
        )
        assert not state.resume_agent(instance), "not registered yet"
        assert state.claim_agent(instance, pid=1)  # pid 1 lives: another process runs it
        state.registered(instance, "gpw_node", None)
        assert not state.resume_agent(instance), "a live process runs it"
        with state._transaction() as db:  # its process died
            db.execute("UPDATE instances SET agent_pid = NULL WHERE id = ?", (instance,))
        assert state.resume_agent(instance)
        [row] = state.instances()
        assert (row.agent_state, row.credential) == ("registered", "gpw_node")
        state.set_agent_state(instance, "ended")
        assert not state.resume_agent(instance), "its credential was refused"
    finally:
        state.close()


def test_a_partitioned_agent_is_cut_off_at_its_delay_or_sooner_never_later(tmp_path: Path) -> None:
    state = FakeCloudState(str(tmp_path / "state.db"))
    try:
        instance = state.add_instance(
            vm=VM, region="r1", zone=None, offer_id="o", instance_type="gpu8", boot_mode="normal"
        )
        state.registered(instance, "gpw_node", time.time() + 600)
        assert not state.is_cut_off(instance)
        state.cut_off(instance)  # the moment a test chooses
        assert state.is_cut_off(instance)
        [row] = state.instances()
        state.cut_off(instance, at=time.time() + 600)
        assert state.instances()[0].cut_at == row.cut_at, "a later cut moves nothing"
    finally:
        state.close()
