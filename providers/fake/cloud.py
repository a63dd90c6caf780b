"""The fake cloud adapter: the provider contract over `FakeCloudState`, with fault rules.

Primitive -> what happens in the ledger:
- plan: one offer per (region, zone, instance type), plus a spot offer where a spot price is
  configured; price source "simulated", None where the catalogue has no price. Cheapest first,
  unless the cloud was built with `shuffle_offers=<seed>`: then in a seeded, deterministic
  shuffle, as a real cloud's API answers in an order of its own (a test of the core's ranking
  that sees offers already in ranked order cannot fail).
- prepare: records a per-VM firewall side resource, and a second one for the spec's ports when
  it names any (idempotent).
- create: adds one instance row labelled with the VM, recording the spec's image and ports (for
  tests to read); `boot_mode` comes from fault effects. With the real agent it also keeps the
  instance's cloud-init user data (providers/userdata.py). What it cannot do is the section's
  `unsupported` list (Capabilities.unsupported), so a test can make it refuse an image or ports.
- observe: instances of the VM in the region that are not gone; Pending until boot_delay has
  passed, then Running with an SSH endpoint (Failed / forever Pending under fault effects);
  Stopping until delete_delay has passed after a delete; Failed ("preempted") once the ledger
  says the cloud took it back (`FakeCloudState.preempt`). A Running instance's agent starts
  there: the simulated one (`simulate_agent`, providers/fake/agent.py) registers through the
  real API with the join token from its bootstrap, heartbeats and runs the node's work (unless
  `run_work = false`: then, its machine running on when the worker process that ran it dies,
  the next worker process takes its heartbeats over, with the credential it kept, at its first
  calls or when it observes the machine); a
  `partitioned` one is cut off from the API `delay_seconds` after it registered, or sooner
  when the ledger says so (`FakeCloudState.cut_off`). The real
  one (`agent = "real"`, providers/fake/node.py) is agent.pyz `run` in a local process,
  fetched and pinned as on a cloud-init machine.
- observe_region: the same for every VM in the region in one call (counted as "list").
- sweep_regions: every configured region (no call).
- delete: marks the given ids deleted (unknown ids are success) and stops their agents.
- cleanup: deletes the VM's side resources in the region.
- observe_side_resources: the region's side resources not deleted yet, by VM, in one call
  (counted as "list_side"), each as "<kind> <name>".

Every primitive first counts the call and consults the fault rules (see `FaultRule`); the
ledger counts each rule's firings too (`fault_fires`), so a test can tell a fault that happened
from one that never matched.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import providers.fake.node as node
from providers.base import (
    Capabilities,
    CloudProvider,
    InstanceSpec,
    InstanceStatus,
    Location,
    Observed,
    Offer,
    PriceQuote,
    ResourceRequest,
    SshEndpoint,
    price_quote,
)
from providers.errors import ErrorKind, ProviderError
from providers.fake.agent import (
    GPU_FAULT_DETAILS,
    Lease,
    Watch,
    heartbeat,
    read_assignments,
    register,
    run_work,
    simulated_capabilities,
)
from providers.fake.config import GPU_FAULTS, FakeInstanceType, FakeProviderConfig, FaultRule
from providers.fake.state import FakeCloudState, InstanceRow
from providers.node_agent import NoticeSource
from providers.settings import capabilities_from
from providers.userdata import user_data

T = TypeVar("T")

PROVIDER_ID = "fake"
PRICE_SOURCE = "simulated"
USER_DATA_LIMIT = 64 * 1024  # what the fake cloud takes, like most clouds' user data
BOOT_MODES = {
    "boot_failed": "failed",
    "boot_hang": "hang",
    "bad_runtime": "bad_runtime",
    "no_agent": "no_agent",
    "partitioned": "partitioned",
    **{fault: fault for fault in GPU_FAULTS},
}
TAKEOVER_EVERY = 2.0  # seconds between looks for agents a dead worker process left
# Effects that show `delay_seconds` after the machine boots (the GPU faults) or after its agent
# registered (a partition).
LATER_EFFECTS = (*GPU_FAULTS, "partitioned")


class FakeCloud(CloudProvider):
    name = PROVIDER_ID

    def __init__(
        self,
        config: FakeProviderConfig,
        state: FakeCloudState | None = None,
        *,
        shuffle_offers: int | None = None,
    ) -> None:
        self.config = config
        self.state = state or FakeCloudState(config.state_path)
        self.shuffle_offers = shuffle_offers  # seed of plan's offer order; None: cheapest first
        self._agents: dict[str, asyncio.Task[None]] = {}  # instance id -> simulated agent
        self._landing: set[asyncio.Future[Any]] = set()  # `lands_late` calls still to land
        self._next_takeover = 0.0  # when to look for agents a dead worker process left
        self.nodes: dict[str, node.Node] = {}  # instance id -> real agent (agent = "real")
        self._own_root: str | None = None
        self._fixtures = Path(config.nvidia_smi_fixtures or node.DEFAULT_FIXTURES)

    def capabilities(self) -> Capabilities:
        return capabilities_from(
            self.config,
            unsupported=self.config.unsupported,
            node_agent=self.config.agent_mode != "none",
            billing=self.config.billing,
        )

    async def aclose(self) -> None:
        for task in self._agents.values():
            task.cancel()
        await asyncio.gather(*self._agents.values(), return_exceptions=True)
        for machine in self.nodes.values():
            await asyncio.to_thread(machine.kill)
        if self._own_root is not None:
            shutil.rmtree(self._own_root, ignore_errors=True)
        self.state.close()

    def secrets(self) -> list[str]:
        return self.config.secret_values()

    # ------------------------------------------------------------------ primitives

    async def plan(self, request: ResourceRequest) -> list[Offer]:
        await self._enter("plan", region="*")
        offers = [
            offer
            for region in self.config.regions
            for zone in region.zones or [None]
            for instance_type in self.config.instance_types
            if instance_type.regions is None or region.name in instance_type.regions
            for offer in self._offers_for(region.name, zone, instance_type)
        ]
        offers.sort(key=_offer_order)
        if self.shuffle_offers is not None:
            random.Random(self.shuffle_offers).shuffle(offers)
        return offers

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        fault = await self._enter("prepare", region=offer.region, offer=offer.id, vm=spec.vm)
        if fault is not None and fault.effect == "lands_late":
            return await self._landing_late(fault, self._prepare(offer, spec))
        return await self._prepare(offer, spec)

    async def _prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        self._instance_type(offer)  # an offer this cloud never made is InvalidRequest
        firewall = f"{spec.label}-fw"
        self.state.add_side_resource(spec.vm, offer.region, "firewall", firewall)
        prepared: dict[str, Any] = {"firewall": firewall}
        if spec.ports:  # a rule of its own, as clouds open a job's ports beside SSH
            prepared["ports_rule"] = f"{spec.label}-ports"
            self.state.add_side_resource(spec.vm, offer.region, "ports", prepared["ports_rule"])
        return prepared

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        fault = await self._enter(
            "create", region=offer.region, offer=offer.id, vm=spec.vm, raise_error=False
        )
        if fault is not None and fault.effect == "error":
            raise ProviderError(fault.kind, fault.message)
        if fault is not None and fault.effect == "lands_late":
            return await self._landing_late(fault, self._create(offer, spec, None))
        return await self._create(offer, spec, fault)

    async def _create(self, offer: Offer, spec: InstanceSpec, fault: FaultRule | None) -> list[str]:
        instance_type = self._instance_type(offer)
        real = self.config.agent_mode == "real" and spec.bootstrap is not None
        if real:
            node.check_captured(instance_type, self._fixtures)
        effect = fault.effect if fault else ""
        instance_id = self.state.add_instance(
            vm=spec.vm,
            region=offer.region,
            zone=offer.zone,
            offer_id=offer.id,
            instance_type=instance_type.name,
            boot_mode=BOOT_MODES.get(effect, "normal"),
            api_url=spec.bootstrap.api_url if spec.bootstrap else None,
            join_token=spec.bootstrap.join_token if spec.bootstrap else None,
            user_data=self._user_data(spec) if real else None,
            fault_after=fault.delay_seconds if fault and effect in LATER_EFFECTS else 0.0,
            image=spec.image,
            ports=spec.ports,
        )
        if fault is not None and fault.effect == "lost_response":
            raise ProviderError(fault.kind, fault.message)
        return [instance_id]

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        await self._enter("observe", region=location.region, vm=vm)
        now = time.time()
        observed = []
        for row in self.state.instances(vm=vm, region=location.region, gone_by=self._gone_by(now)):
            instance = self._observed(row, now)
            if instance is None:
                continue
            observed.append(instance)
            if instance.status is InstanceStatus.RUNNING:
                self._boot_agent(row)
        return observed

    async def observe_region(self, location: Location) -> dict[str, list[Observed]]:
        await self._enter("list", region=location.region)
        now = time.time()
        by_vm: dict[str, list[Observed]] = {}
        for row in self.state.instances(region=location.region, gone_by=self._gone_by(now)):
            instance = self._observed(row, now)
            if instance is None:
                continue
            by_vm.setdefault(row.vm, []).append(instance)
            if instance.status is InstanceStatus.RUNNING:
                self._boot_agent(row)
        return by_vm

    def sweep_regions(self) -> list[str]:
        return [region.name for region in self.config.regions]

    def _user_data(self, spec: InstanceSpec) -> str | None:
        """What a cloud with user data gets, its agent watching notices where configured."""
        notices = NoticeSource(self.config.notices, self.config.notices_url)
        return user_data(spec, max_bytes=USER_DATA_LIMIT, cloud="fake", notices=notices)

    async def delete(self, location: Location, vm: str, ids: list[str]) -> None:
        await self._enter("delete", region=location.region, vm=vm)
        self.state.mark_deleted(vm, location.region, ids)
        for instance_id in ids:  # the machine shuts down: so does whatever ran on it
            task = self._agents.pop(instance_id, None)
            if task is not None:
                task.cancel()
            machine = self.nodes.get(instance_id)
            if machine is not None:
                await asyncio.to_thread(machine.kill)

    async def cleanup(self, location: Location, vm: str) -> None:
        await self._enter("cleanup", region=location.region, vm=vm)
        self.state.delete_side_resources(vm, location.region)

    async def observe_side_resources(self, location: Location) -> dict[str, list[str]]:
        await self._enter("list_side", region=location.region)
        by_vm: dict[str, list[str]] = {}
        for vm, kind, name in self.state.region_side_resources(location.region):
            by_vm.setdefault(vm, []).append(f"{kind} {name}")
        return by_vm

    # ------------------------------------------------------------------ for tests and demos

    def live_instances(self) -> list[InstanceRow]:
        return self.state.live_instances(self.config.delete_delay_seconds)

    def fault_fires(self) -> list[tuple[FaultRule, int]]:
        """Each configured fault rule, in order, with the number of calls it fired on (a
        `delay` fires too): a test can show that the fault it injected happened."""
        fired = self.state.fault_fires()
        return [(rule, fired.get(index, 0)) for index, rule in enumerate(self.config.faults)]

    def fired(self, rule: FaultRule) -> int:
        """Calls `rule` (one of the configured rules, compared by value) fired on."""
        counts = [n for configured, n in self.fault_fires() if configured == rule]
        if not counts:
            raise KeyError(f"not a configured fault rule: {rule!r}")
        return sum(counts)

    # ------------------------------------------------------------------ internals

    async def _landing_late(self, fault: FaultRule, call: Coroutine[Any, Any, T]) -> T:
        """Carry `call` out after the fault's delay, even if the caller stops waiting."""

        async def later() -> T:
            await asyncio.sleep(fault.delay_seconds)
            return await call

        task = asyncio.ensure_future(later())
        self._landing.add(task)  # held here: nobody else may be left waiting for it
        task.add_done_callback(self._landing.discard)
        return await asyncio.shield(task)

    def _gone_by(self, now: float) -> float:
        """Instances deleted at or before this time are gone from what the cloud reports."""
        return now - self.config.delete_delay_seconds

    def _take_over_agents(self) -> None:
        """Every few seconds, at a call: the agents of running machines that registered under
        a worker process now dead go on from this one, whether or not a job still observes
        their machines (a lease that is ready, a job whose worker died mid-step)."""
        now = time.time()
        if self.config.agent_mode != "simulated" or self.config.run_work:
            return
        if now < self._next_takeover:
            return
        self._next_takeover = now + TAKEOVER_EVERY
        for row in self.state.registered_agents():
            instance = self._observed(row, now)
            if instance is not None and instance.status is InstanceStatus.RUNNING:
                self._boot_agent(row)

    def _boot_agent(self, row: InstanceRow) -> None:
        """A booted instance's agent starts once; observe is where the fake notices the boot,
        so a restarted worker picks up simulated agents that had not registered yet. Several
        workers observe the same instance: the state file lets one of them run its simulated
        agent at a time (as a node runs one agent), so no second agent spends the token again.
        An instance booted with the `no_agent` fault runs none."""
        if row.boot_mode == "no_agent":
            return
        if self.config.agent_mode == "real":
            if row.user_data and row.id not in self.nodes and row.deleted_at is None:
                self.nodes[row.id] = self._boot_node(row)
            return
        pending = row.agent_state in ("pending", "running")
        # Registered already, by a worker process that died: its heartbeats go on from here.
        # Not where it ran the work itself: that died with the process, and so does the node.
        resumed = row.agent_state == "registered" and row.credential is not None
        resumed = resumed and not self.config.run_work
        if self.config.agent_mode != "simulated" or not (pending or resumed):
            return
        task = self._agents.get(row.id)
        if not row.join_token or (task is not None and not task.done()):
            return
        claimed = self.state.resume_agent(row.id) if resumed else self.state.claim_agent(row.id)
        if not claimed:
            return
        self._agents[row.id] = asyncio.create_task(self._run_agent(row))

    async def _run_agent(self, row: InstanceRow) -> None:
        assert row.api_url is not None and row.join_token is not None
        instance_type = next(t for t in self.config.instance_types if t.name == row.instance_type)
        capabilities = simulated_capabilities(instance_type, row.boot_mode == "bad_runtime")
        credential = row.credential
        partitioned = row.boot_mode == "partitioned"
        if credential is None:
            credential = await register(row.api_url, row.join_token, capabilities)
            if credential is None:
                self.state.set_agent_state(row.id, "rejected")
                return
            cut_at = time.time() + row.fault_after if partitioned else None
            self.state.registered(row.id, credential, cut_at)
        # The ledger says when a partitioned node's link is cut (a test may cut it sooner).
        cut_off = (lambda: self.state.is_cut_off(row.id)) if partitioned else None
        broken_from = row.created_at + self.config.boot_delay_seconds + row.fault_after

        def health() -> tuple[bool, str | None]:
            if row.boot_mode == "bad_runtime":
                return False, capabilities["gpu_runtime_error"]
            if row.boot_mode in GPU_FAULT_DETAILS and time.time() >= broken_from:
                return False, GPU_FAULT_DETAILS[row.boot_mode]
            return True, None

        watch = Watch()
        lease, hold = self._lease(row.id, partitioned)
        work = None
        if self.config.run_work:
            work = asyncio.create_task(
                run_work(row.api_url, credential, watch, lease=lease, cut_off=cut_off, hold=hold)
            )
        elif hold is not None:
            work = asyncio.create_task(
                read_assignments(row.api_url, credential, watch, hold, cut_off=cut_off)
            )
        try:
            await heartbeat(row.api_url, credential, health, watch, lease=lease, cut_off=cut_off)
            self.state.set_agent_state(row.id, "ended")  # its credential was refused
        finally:  # revoked, or the instance deleted: its work ends with it
            if work is not None:
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)

    def _lease(
        self, instance_id: str, partitioned: bool
    ) -> tuple[Lease, Callable[[str, float], None] | None]:
        """The agent's lease and, for one that is to be cut off (the only kind whose lease can
        lapse here), what keeps it and the work it holds in the ledger: read back from there
        when another worker process takes the agent over."""
        if not partitioned:
            return Lease(), None
        kept = self.state.agent_lease(instance_id)
        lease = Lease(
            kept.sent_at if kept else None,
            kept.lease_seconds if kept else None,
            keep=lambda sent_at, seconds: self.state.renew_lease(instance_id, sent_at, seconds),
        )
        return lease, lambda work_id, grace: self.state.hold_work(instance_id, work_id, grace)

    def _boot_node(self, row: InstanceRow) -> node.Node:
        """The real agent on the instance, in its own root under the agent root."""
        assert row.user_data is not None
        if self.config.agent_root is not None:
            base = Path(self.config.agent_root)
        else:
            if self._own_root is None:
                self._own_root = tempfile.mkdtemp(prefix="gpuprov-fake-nodes-")
            base = Path(self._own_root)
        self.state.set_agent_state(row.id, "started")
        return node.boot(
            base / row.id,
            row.user_data,
            fixtures=self._fixtures,
            fault=row.boot_mode,
            broken_from=row.created_at + self.config.boot_delay_seconds + row.fault_after,
        )

    async def _enter(
        self,
        primitive: str,
        *,
        region: str,
        offer: str | None = None,
        vm: str | None = None,
        raise_error: bool = True,
    ) -> FaultRule | None:
        """Simulate latency, count the call, and return (or raise) the fault that fires."""
        if self.config.call_latency_seconds:
            await asyncio.sleep(self.config.call_latency_seconds)
        self._take_over_agents()
        self.state.count_call(primitive, region)
        for index, rule in enumerate(self.config.faults):
            if not _matches(rule, primitive, region, offer, vm):
                continue
            if not self.state.hit_fault(index, rule.after, rule.times):
                continue
            if rule.effect == "delay":
                await asyncio.sleep(rule.delay_seconds)
                continue
            if raise_error and rule.effect == "error":
                raise ProviderError(rule.kind, rule.message)
            return rule
        return None

    def _offers_for(
        self, region: str, zone: str | None, instance_type: FakeInstanceType
    ) -> list[Offer]:
        place = zone or region
        base = dict(
            provider=PROVIDER_ID,
            region=region,
            zone=zone,
            instance_type=instance_type.name,
            gpu_name=instance_type.gpu,
            gpu_count=instance_type.gpu_count,
            gpu_memory_gb=instance_type.gpu_memory_gb,
            vcpus=instance_type.vcpus,
            memory_gb=instance_type.memory_gb,
            disk_gb=instance_type.disk_gb,
        )
        offers = [
            Offer(
                id=f"fake/{place}/{instance_type.name}",
                price=_quote(instance_type.price),
                detail={"instance_type": instance_type.name},
                **base,
            )
        ]
        if instance_type.spot_price is not None:
            offers.append(
                Offer(
                    id=f"fake/{place}/{instance_type.name}/spot",
                    spot=True,
                    price=_quote(instance_type.spot_price),
                    detail={"instance_type": instance_type.name, "spot": True},
                    **base,
                )
            )
        return offers

    def _instance_type(self, offer: Offer) -> FakeInstanceType:
        name = offer.detail.get("instance_type")
        for instance_type in self.config.instance_types:
            if instance_type.name == name:
                return instance_type
        raise ProviderError(ErrorKind.INVALID_REQUEST, f"unknown instance type {name!r}")

    def _observed(self, row: InstanceRow, now: float) -> Observed | None:
        if row.deleted_at is not None:
            if now - row.deleted_at >= self.config.delete_delay_seconds:
                return None
            return Observed(id=row.id, status=InstanceStatus.STOPPING)
        booted = now - row.created_at >= self.config.boot_delay_seconds
        if row.boot_mode == "preempted":
            return Observed(
                id=row.id, status=InstanceStatus.FAILED, message="preempted: the cloud took it back"
            )
        if row.boot_mode == "failed" and booted:
            return Observed(
                id=row.id, status=InstanceStatus.FAILED, message="instance failed to boot"
            )
        if row.boot_mode == "hang" or not booted:
            return Observed(id=row.id, status=InstanceStatus.PENDING)
        return Observed(
            id=row.id,
            status=InstanceStatus.RUNNING,
            ssh=SshEndpoint(host=self.config.ssh_host, port=self.config.ssh_port),
        )


def _matches(
    rule: FaultRule, primitive: str, region: str, offer: str | None, vm: str | None
) -> bool:
    return (
        rule.primitive == primitive
        and rule.region in (None, region)
        and rule.offer in (None, offer)
        and (rule.vm is None or (vm or "").startswith(rule.vm))
    )


def _quote(amount: float | None) -> PriceQuote | None:
    return price_quote(amount, source=PRICE_SOURCE, observed_at=datetime.now(UTC))


def _offer_order(offer: Offer) -> tuple[bool, float, str]:
    return (offer.price is None, offer.price.amount if offer.price else 0.0, offer.id)
