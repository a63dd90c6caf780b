"""One Temporal activity per provider primitive, plus the two waits the core owns.

- describe_providers: enabled provider ids and their Capabilities (the wait bounds).
- skipped_providers: configured clouds left out for lack of credentials, with the reason.
- plan: one provider's offers, split into compatible and rejected (with reasons); none at all,
  and one rejection for the whole provider, where the job asks what the provider declares
  unsupported (an image, ports).
- prepare: per-VM side resources (a job of several nodes prepares every node before creating).
- launch: prepare then create in one activity (a single-node job); retire: delete, wait until
  gone, mark the row terminated, clean up the side resources, in one activity (every node's
  teardown, the reconciler's too). Their failures name the part that failed (`prepare`,
  `create`, `delete`, `wait_gone`, `cleanup`).
- create: one attempt; on any retry it observes first and adopts what landed, so a lost
  response never becomes a second machine. Before the cloud call it records the VM row and
  mints the node's join token (activities/enrolment.py); the token never leaves the activity.
- wait_running, and retire's wait for gone: heartbeating loops over observe at the provider's
  poll_interval (through activities/observe_hub.py: all waits in one region share one list
  call), bounded by boot_timeout / delete_timeout (a missed deadline is Failed for that offer);
  the deadline travels in the heartbeat details, so a retried attempt keeps it. Deletion
  observes the VM identity and deletes every instance found plus the known ids.

ProviderError becomes ApplicationError(type=<ErrorKind>) through `activities.redaction.scrubbed`,
which scrubs every secret in play out of the message first (any other exception too). What a
cloud answered is scrubbed the same way before it leaves: plan's offers (names, descriptions,
GPU names, detail) and every observe's instances (ids, messages), also before they reach a
heartbeat's details (`activities.redaction.clean`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import Field
from temporalio import activity

from activities.enrolment import Enrolment
from activities.errors import to_application_error
from activities.fencing import CallFence
from activities.heartbeat import Heartbeater
from activities.observe_hub import ObserveHub
from activities.redaction import clean, scrubbed
from activities.ssh_keys import KeyStore, host_key_cloud_config
from gpuprov.store.fences import VmFences
from providers.base import (
    Capabilities,
    CloudProvider,
    InstanceSpec,
    InstanceStatus,
    Location,
    Model,
    Observed,
    Offer,
    ResourceRequest,
    compatibility_reasons,
    refusal,
    unsupported_reasons,
)
from providers.errors import ErrorKind, ProviderError

# Polls in a row that may see no instance right after create before we call it vanished
# (clouds list new instances with a lag).
EMPTY_POLLS_BEFORE_VANISHED = 3
# While waiting for gone, re-request deletion of anything not yet stopping every N polls.
REDELETE_EVERY_POLLS = 10
MAX_REJECTED_LISTED = 50


class PlanInput(Model):
    provider: str
    request: ResourceRequest


class PlanResult(Model):
    offers: list[Offer] = Field(default_factory=list)  # compatible, provider's order
    rejected: list[str] = Field(default_factory=list)  # "offer id: reasons" (first 50)
    rejected_count: int = 0


class PrepareInput(Model):
    offer: Offer
    spec: InstanceSpec


class CreateInput(Model):
    offer: Offer
    prepared: dict[str, Any]
    spec: InstanceSpec


class VmInput(Model):
    """A VM identity at a location; `ids` are the instance ids known so far."""

    location: Location
    vm: str
    ids: list[str] = Field(default_factory=list)


class WaitProgress(Model):
    """Heartbeat details of a wait: when it began (the deadline's origin) and what it saw."""

    started_at: float
    polls: int = 0
    last_seen: list[str] = Field(default_factory=list)  # "id=Status"


class CloudActivities:
    """Activities bound to the providers this worker was built with (no global registry)."""

    def __init__(
        self,
        providers: dict[str, CloudProvider],
        enrolment: Enrolment | None = None,
        skipped: dict[str, str] | None = None,
        *,
        ssh_bootstrap: set[str] | None = None,
        keys: KeyStore | None = None,
        fences: VmFences | None = None,
    ) -> None:
        self._providers = providers
        # Prepare and create hold their VM's claim; retire fences the VM first (no database: none).
        self._fence = CallFence(fences)
        self._skipped = dict(skipped or {})  # configured clouds left out, and why
        # Providers whose nodes the core bootstraps over SSH with the deployment key in `keys`.
        self._ssh_bootstrap = set(ssh_bootstrap or ())
        self._keys = keys
        self._enrolment = enrolment
        self._observe_hub = ObserveHub()  # waits in one region share one list call

    def all(self) -> list[Any]:
        return [
            self.describe_providers,
            self.skipped_providers,
            self.plan,
            self.prepare,
            self.create,
            self.launch,
            self.wait_running,
            self.retire,
        ]

    def _provider(self, name: str) -> CloudProvider:
        """The provider, or InvalidRequest (already an ApplicationError: callers ask for it
        before `scrubbed()`, which needs it) when this worker does not have it enabled."""
        try:
            return self._providers[name]
        except KeyError:
            error = ProviderError(
                ErrorKind.INVALID_REQUEST, f"provider {name!r} is not enabled on this worker"
            )
            raise to_application_error(error) from None

    @activity.defn(name="describe_providers")
    async def describe_providers(self) -> dict[str, Capabilities]:
        return {name: self._capabilities(name) for name in self._providers}

    def _capabilities(self, name: str) -> Capabilities:
        hints = self._providers[name].capabilities()
        if name in self._ssh_bootstrap:  # `[providers.<id>] ssh_bootstrap = true`
            hints = hints.model_copy(update={"ssh_bootstrap": True, "node_agent": True})
        return hints

    @activity.defn(name="skipped_providers")
    async def skipped_providers(self) -> dict[str, str]:
        """Configured clouds this worker could not build (e.g. no credentials), with why."""
        return dict(self._skipped)

    @activity.defn(name="plan")
    async def plan(self, request: PlanInput) -> PlanResult:
        provider = self._provider(request.provider)
        refused = unsupported_reasons(
            request.provider, self._capabilities(request.provider), request.request
        )
        if refused:  # no offer of this cloud could serve: its (rate-limited) plan is not asked
            return PlanResult(rejected=[refusal(request.provider, refused)])
        async with _beating():
            with scrubbed(provider):
                offers = clean(await provider.plan(request.request), provider.secrets())
        result = PlanResult()
        for offer in offers:
            reasons = compatibility_reasons(offer, request.request)
            if not reasons:
                result.offers.append(offer)
                continue
            result.rejected_count += 1
            if len(result.rejected) < MAX_REJECTED_LISTED:
                result.rejected.append(f"{offer.id}: {'; '.join(reasons)}")
        return result

    @activity.defn(name="prepare")
    async def prepare(self, request: PrepareInput) -> dict[str, Any]:
        provider = self._provider(request.offer.provider)
        async with _beating(), self._fence.holding(request.spec.vm, "prepare"):
            with scrubbed(provider, spec=request.spec):
                spec = await asyncio.to_thread(self._keyed, request.offer.provider, request.spec)
                return await provider.prepare(request.offer, spec)

    @activity.defn(name="create")
    async def create(self, request: CreateInput) -> list[str]:
        provider = self._provider(request.offer.provider)
        spec = request.spec
        # Heartbeats let Temporal notice a dead worker within the heartbeat timeout instead
        # of the whole start-to-close timeout; the retry then observes and adopts.
        async with _beating(), self._fence.holding(spec.vm, "create"):
            return await self._create_once(request, provider, spec)

    @activity.defn(name="launch")
    async def launch(self, request: PrepareInput) -> list[str]:
        """prepare then create, one activity (one server round trip fewer per node): the
        prepared JSON goes straight to create instead of through history. A retry adopts what
        an earlier attempt created, else prepares again (prepare is idempotent per VM) and
        creates. A failure names its part, `prepare` or `create`."""
        provider = self._provider(request.offer.provider)
        spec = request.spec
        async with _beating(), self._fence.holding(spec.vm, "create"):
            adopted = await self._adopted(provider, request.offer, spec, step="create")
            if adopted is not None:
                return adopted
            with scrubbed(provider, "prepare", spec):
                keyed = await asyncio.to_thread(self._keyed, request.offer.provider, spec)
                prepared = await provider.prepare(request.offer, keyed)
            create = CreateInput(offer=request.offer, prepared=prepared, spec=spec)
            return await self._create_once(create, provider, spec, step="create", adopt=False)

    async def _adopted(
        self, provider: CloudProvider, offer: Offer, spec: InstanceSpec, step: str | None
    ) -> list[str] | None:
        """On a retry: what an earlier attempt created with its response lost, recorded."""
        if activity.info().attempt <= 1:
            return None
        with scrubbed(provider, step):
            existing = await provider.observe(offer.location, spec.vm)
        if not existing:
            return None
        ids = [o.id for o in existing]
        activity.logger.info("adopting %s for %s", ids, spec.vm)
        await self._created(spec.vm, ids)
        return ids

    async def _create_once(
        self,
        request: CreateInput,
        provider: CloudProvider,
        spec: InstanceSpec,
        step: str | None = None,
        adopt: bool = True,
    ) -> list[str]:
        if adopt:
            adopted = await self._adopted(provider, request.offer, spec, step)
            if adopted is not None:
                return adopted
        with scrubbed(provider, step):
            if self._enrolment is not None:
                billing = provider.capabilities().billing
                spec = await asyncio.to_thread(
                    self._enrolment.record_and_mint, request.offer, spec, billing
                )
            if request.offer.provider in self._ssh_bootstrap:
                cloud_init = provider.capabilities().cloud_init
                spec = await asyncio.to_thread(self._for_ssh_bootstrap, spec, cloud_init)
        with scrubbed(provider, step, spec):  # now holding the join token and any host key
            ids = await provider.create(request.offer, request.prepared, spec)
        await self._created(spec.vm, ids)
        return ids

    async def _poll(
        self, provider: CloudProvider, request: VmInput, interval: float
    ) -> list[Observed] | None:
        observed = await _observe_tolerating_transient(
            self._observe_hub, provider, request, interval
        )
        return clean(observed, provider.secrets())

    def _keyed(self, provider: str, spec: InstanceSpec) -> InstanceSpec:
        """The spec prepare gets: with the worker's client key where the core bootstraps the
        provider's nodes over SSH, so a cloud that registers keys in prepare (Prime's account
        keys, EC2 key pairs, Lambda's per-VM key) registers the one bootstrap logs in with."""
        if provider not in self._ssh_bootstrap or spec.ssh_public_key:
            return spec
        assert self._keys is not None  # build_worker pairs ssh_bootstrap with a key store
        return spec.model_copy(update={"ssh_public_key": self._keys.client_public_key()})

    def _for_ssh_bootstrap(self, spec: InstanceSpec, cloud_init: bool) -> InstanceSpec:
        """What a node the core bootstraps over SSH needs: the worker's client key as its
        authorized key and, where the machine runs cloud-init, a host key derived for the VM
        and pinned, so bootstrap knows the key before first contact. The private host key
        lives only in this spec's user data (never stored, returned, or in history). No join
        token: bootstrap hands the agent its own over SSH, so the cloud never holds one (and no
        agent installed from user data races it)."""
        assert self._keys is not None  # build_worker pairs ssh_bootstrap with a key store
        client_key = spec.ssh_public_key or self._keys.client_public_key()
        update: dict[str, Any] = {"ssh_public_key": client_key, "bootstrap": None}
        if cloud_init and spec.user_data is None:
            host_key = self._keys.host_key_for(spec.vm)
            update["user_data"] = host_key_cloud_config(host_key, [client_key])
        return spec.model_copy(update=update)

    async def _created(self, vm: str, ids: list[str]) -> None:
        if self._enrolment is not None:
            await asyncio.to_thread(self._enrolment.created, vm, ids)

    @activity.defn(name="wait_running")
    async def wait_running(self, request: VmInput) -> list[Observed]:
        """Poll observe until every instance of the VM is Running; Failed or late is Failed."""
        provider = self._provider(request.location.provider)
        hints = provider.capabilities()
        progress = Heartbeater.resume(WaitProgress, WaitProgress(started_at=time.time()))
        deadline = progress.started_at + hints.boot_timeout
        empty_polls = 0
        with scrubbed(provider):
            async with Heartbeater(progress, beat_at_start=False) as heartbeat:
                while True:
                    observed = await self._poll(provider, request, hints.poll_interval)
                    if observed is not None:
                        progress = _progressed(progress, observed)
                        heartbeat.note(progress)
                        _raise_if_failed(observed)
                        if observed and all(o.status is InstanceStatus.RUNNING for o in observed):
                            return observed
                        empty_polls = 0 if observed else empty_polls + 1
                        if empty_polls >= EMPTY_POLLS_BEFORE_VANISHED and request.ids:
                            raise ProviderError(
                                ErrorKind.FAILED,
                                f"instances {request.ids} of {request.vm} vanished while booting",
                            )
                    if time.time() >= deadline:
                        seen = ", ".join(progress.last_seen) or "nothing"
                        raise ProviderError(
                            ErrorKind.FAILED,
                            f"{request.vm} not running after boot_timeout "
                            f"{hints.boot_timeout:g}s (last seen: {seen})",
                        )
                    await asyncio.sleep(hints.poll_interval)

    @activity.defn(name="retire")
    async def retire(self, request: VmInput) -> list[str]:
        """A node's whole teardown in one step (one server round trip instead of four):
        delete what carries the identity, wait until nothing does, mark the row terminated
        (its worker revoked), then remove the side resources. Each part is idempotent, so a
        retry simply does it all again; a failure names the part (`step`) that failed."""
        provider = self._provider(request.location.provider)
        # A retry keeps the wait's deadline, as wait_gone does.
        progress = Heartbeater.resume(WaitProgress, WaitProgress(started_at=time.time()))
        async with Heartbeater(progress, beat_at_start=False) as heartbeat:
            # No prepare or create of this identity reaches the cloud from here on, and one
            # still in flight has finished (or lapsed) before anything is looked for.
            if await self._fence.raise_fence(request.vm):
                heartbeat.note(progress.model_copy(update={"started_at": time.time()}))
            with scrubbed(provider, "delete"):
                ids = await _delete_by_identity(provider, request)
            gone = request.model_copy(update={"ids": ids})
            with scrubbed(provider, "wait_gone"):
                await self._until_gone(provider, gone, heartbeat)
            if self._enrolment is not None:
                await asyncio.to_thread(self._enrolment.terminated, request.vm, ids)
            with scrubbed(provider, "cleanup"):
                await provider.cleanup(request.location, request.vm)
        return ids

    async def _until_gone(
        self, provider: CloudProvider, request: VmInput, heartbeat: Heartbeater[WaitProgress]
    ) -> None:
        """Poll (re-deleting stragglers) until nothing carries the identity; Failed after
        delete_timeout from the progress' start (a resumed wait keeps its deadline)."""
        hints = provider.capabilities()
        progress = heartbeat.progress
        deadline = progress.started_at + hints.delete_timeout
        while True:
            observed = await self._poll(provider, request, hints.poll_interval)
            if observed is not None:
                progress = _progressed(progress, observed)
                heartbeat.note(progress)
                if not observed:
                    return
                lingering = [o.id for o in observed if o.status is not InstanceStatus.STOPPING]
                if lingering and progress.polls % REDELETE_EVERY_POLLS == 0:
                    await provider.delete(request.location, request.vm, lingering)
            if time.time() >= deadline:
                seen = ", ".join(progress.last_seen)
                raise ProviderError(
                    ErrorKind.FAILED,
                    f"{request.vm} still present after delete_timeout "
                    f"{hints.delete_timeout:g}s: {seen}",
                )
            await asyncio.sleep(hints.poll_interval)


async def _delete_by_identity(provider: CloudProvider, request: VmInput) -> list[str]:
    """Delete every instance that carries the VM identity plus the known ids; all of them."""
    observed = await provider.observe(request.location, request.vm)
    ids = sorted({*request.ids, *(o.id for o in observed)})
    if ids:
        await provider.delete(request.location, request.vm, ids)
    return ids


async def _observe_tolerating_transient(
    hub: ObserveHub, provider: CloudProvider, request: VmInput, interval: float
) -> list[Observed] | None:
    """One poll through the shared hub; a Transient error is a missed poll (None), anything
    else propagates."""
    try:
        return await hub.observe(provider, request.location, request.vm, interval)
    except ProviderError as error:
        if error.kind is not ErrorKind.TRANSIENT:
            raise
        if error.retry_after:
            await asyncio.sleep(error.retry_after)
        return None


def _progressed(progress: WaitProgress, observed: list[Observed]) -> WaitProgress:
    return progress.model_copy(
        update={
            "polls": progress.polls + 1,
            "last_seen": [f"{o.id}={o.status.value}" for o in observed],
        }
    )


def _raise_if_failed(observed: list[Observed]) -> None:
    for instance in observed:
        if instance.status is InstanceStatus.FAILED:
            raise ProviderError(
                ErrorKind.FAILED,
                f"instance {instance.id} failed: {instance.message or 'no reason given'}",
            )


def _beating() -> Heartbeater[WaitProgress]:
    """Heartbeat while one cloud call runs: the workflow gives these steps a short heartbeat
    timeout, so a worker killed mid-call is noticed in seconds, not after start-to-close."""
    return Heartbeater(WaitProgress(started_at=time.time()), beat_at_start=False)
