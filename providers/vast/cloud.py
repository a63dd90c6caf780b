"""Vast.ai (provider id `vast`): GPU containers rented from a marketplace of hosts.

Primitive -> Vast API call (base https://console.vast.ai, `Authorization: Bearer <key>`):
- plan: POST /api/v0/bundles/ — one search for rentable, on-demand listings that fit one node
  (GPU model and count, disk, vCPUs, verified, reliability, direct ports for SSH and the job's
  ports, countries), cheapest `dph_total` first. One Offer per listing, id `vast/<ask id>`,
  price `dph_total` (source "vast: POST /api/v0/bundles/ dph_total"); `Offer.detail` holds the
  ask id, disk, image and SSH mode create needs, and `ask_ids`: the listing plus every
  equivalent one (same GPU model, count and country) at no higher price, since a listing is one
  host's bundle and is rented once; node k of a job rents the k-th. Spot (interruptible bids) is
  not offered.
- prepare: no call. Vast has no per-VM side resources to make; it checks what Vast cannot carry
  (a #cloud-config user_data, an onstart script over 4,096 characters, a node beyond the
  offer's `ask_ids`) before anything exists.
- create: PUT /api/v0/asks/{ask id}/ with `label = gpuprov-<vm>`, the spec's image (else the
  section's), disk, runtype ssh_direct (or ssh_proxy), `cancel_unavail`, the SSH key and user
  data as `onstart`, the spec's ports as Docker `-p` flags in `env` -> `new_contract` (the
  instance id). The join token is never sent (env and onstart are readable through the API): the
  core starts the node agent over SSH (`ssh_bootstrap`). Vast has no idempotency key: a retried
  create is made safe by the core observing the label first and adopting what it finds. An
  answer with `success: false` beside a `new_contract` made an instance anyway: it is destroyed
  (DELETE /api/v0/instances/{id}/) and the call fails as Failed; should that destroy fail too,
  the core's teardown still finds the instance by its label.
- observe: GET /api/v1/instances/?select_filters={"label":{"eq":"gpuprov-<vm>"}}, every page.
- observe_region: GET /api/v1/instances/ (every page), keeping labels that start `gpuprov-`.
  Ids and labels are account-wide on Vast, so both look at the whole account whatever region
  they are asked about: an instance is never missed because of how its host's location reads.
- sweep_regions: ["all"] (no call): one listing already covers the account.
- delete: DELETE /api/v0/instances/{id}/ for each id; gone (404, not_found, no_such_instance)
  is success.
- cleanup: no call (prepare made nothing).
- observe_side_resources: {} without a call (nothing per VM exists to list).
- diagnose: the contract's default, from observe.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from providers.base import (
    Billing,
    Capabilities,
    CloudProvider,
    InstanceSpec,
    Location,
    Observed,
    Offer,
    ResourceRequest,
    compatibility_reasons,
    vm_label,
)
from providers.errors import ErrorKind, ProviderError
from providers.settings import capabilities_from
from providers.vast import launch, parse
from providers.vast.client import VastClient
from providers.vast.config import VastConfig
from providers.vast.errors import Op

# The active rental cost is charged "for every second your instance is in the active/connected
# state"; no minimum stated. Storage and bandwidth are charged apart and are not in the quote.
BILLING = Billing(granularity_seconds=1, source="https://docs.vast.ai/billing-help")
PROVIDER_ID = parse.PROVIDER_ID
ACCOUNT_REGION = "all"  # the one region the reconciler needs to list: the whole account
TAKEN_MEMORY_SECONDS = 600.0  # how long a listing that answered no_such_ask is skipped


class VastCloud(CloudProvider):
    name = PROVIDER_ID

    def __init__(self, config: VastConfig, *, api_key: str | None = None) -> None:
        """`api_key` given explicitly (tests) skips the section's credential lookup; otherwise
        MissingCredentials says where a key may come from."""
        self.config = config
        key = api_key if api_key is not None else config.resolve_api_key(config.API_KEY_ENV)
        self._client = VastClient(
            config.base_url,
            key,
            timeout=config.request_timeout,
            intervals=config.min_intervals,
        )
        self._taken = TakenListings()

    def capabilities(self) -> Capabilities:
        # node_agent: started over SSH by the core (the section's ssh_bootstrap is always on).
        return capabilities_from(
            self.config, unsupported=["spot"], node_agent=True, billing=BILLING
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def secrets(self) -> list[str]:
        return [*self.config.secret_values(), *self._client.secrets()]

    # ------------------------------------------------------------------ plan

    async def plan(self, request: ResourceRequest) -> list[Offer]:
        if not self._may_serve(request):
            return []
        regions = launch.search_regions(self.config, request)
        if regions == []:
            return []
        body = launch.search_body(self.config, request, regions)
        listings = await self._client.search_offers(body)
        observed_at = datetime.now(UTC)
        disk = launch.disk_gb(self.config, request)
        offers = [
            offer
            for listing in listings
            if (
                offer := parse.offer_from_listing(
                    listing,
                    disk_gb=disk,
                    image=self.config.image,
                    runtype=launch.runtype(self.config),
                    observed_at=observed_at,
                )
            )
            is not None
        ]
        offers.sort(key=_cheapest_first)
        fitting = [offer for offer in offers if not compatibility_reasons(offer, request)]
        launch.with_alternates(fitting)
        # None fit: hand back a few anyway, so the core's plan report says why each was refused.
        return (fitting or offers)[: self.config.max_offers]

    def _may_serve(self, request: ResourceRequest) -> bool:
        """Skip the (rate-limited) search where no Vast offer could be used."""
        if request.spot:
            return False  # interruptible bids are not supported (docs/clouds/vast.md)
        if request.providers is not None and PROVIDER_ID not in request.providers:
            return False
        return PROVIDER_ID not in request.denied_providers

    # ------------------------------------------------------------------ lifecycle

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        # Every node has a listing of its own before any create.
        launch.ask_id(offer, spec.node_index, self._taken.recent())
        launch.check_spec(spec)
        return {}

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        ask_id = launch.ask_id(offer, spec.node_index, self._taken.recent())
        body = launch.create_body(self.config, offer, spec)
        answer = await self._client.create_instance(ask_id, body)
        if answer.error is None and answer.contract is not None:
            return [str(answer.contract)]
        error = answer.error or ProviderError(ErrorKind.FAILED, "create instance: no answer")
        if answer.contract is not None:
            raise await self._undo(answer.contract, error)
        if error.kind is ErrorKind.CAPACITY:
            self._taken.add(ask_id)
        raise error

    async def _undo(self, contract: int, error: ProviderError) -> ProviderError:
        """A failed create that still made instance `contract`: destroy it, and say so."""
        try:
            await self._client.destroy_instance(contract)
        except ProviderError as destroy_error:
            outcome = (
                f"destroying it failed ({destroy_error.message}); teardown finds it by its label"
            )
        else:
            outcome = "it was destroyed"
        return ProviderError(
            ErrorKind.FAILED,
            f"{error.message}; Vast still made instance {contract} (new_contract): {outcome}",
        )

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        label = vm_label(vm)
        instances = await self._client.list_instances({"label": {"eq": label}})
        return [
            self._observed(instance)
            for instance in instances
            if parse.instance_label(instance) == label
        ]

    async def observe_region(self, location: Location) -> dict[str, list[Observed]]:
        by_vm: dict[str, list[Observed]] = {}
        for instance in await self._client.list_instances():
            vm = parse.vm_of(parse.instance_label(instance))
            if vm is not None:
                by_vm.setdefault(vm, []).append(self._observed(instance))
        return by_vm

    def sweep_regions(self) -> list[str]:
        return [ACCOUNT_REGION]

    async def delete(self, location: Location, vm: str, ids: list[str]) -> None:
        """Destroy each id; ids that are not Vast ids cannot exist there (success). Every id is
        tried before the first failure is raised."""
        first_error: ProviderError | None = None
        for instance_id in ids:
            number = _instance_number(instance_id)
            if number is None:
                continue
            try:
                await self._client.destroy_instance(number)
            except ProviderError as error:
                first_error = first_error or error
        if first_error is not None:
            raise first_error

    async def cleanup(self, location: Location, vm: str) -> None:
        """Nothing to clean: prepare makes no side resources on Vast."""

    async def observe_side_resources(self, location: Location) -> dict[str, list[str]]:
        """Prepare makes none, so there is nothing to list."""
        return {}

    # ------------------------------------------------------------------ helpers

    def _observed(self, instance: dict[str, Any]) -> Observed:
        try:
            return parse.observed_from_instance(instance, self.config.ssh)
        except parse.MalformedResponse as error:
            raise ProviderError(
                ErrorKind.FAILED, f"{Op.LIST.value}: unexpected answer from Vast: {error}"
            ) from None


class TakenListings:
    """Listings that lately answered no_such_ask on this worker. The next attempt of a
    multi-node job still carries them among its offer's `ask_ids` (the plan is journaled), so
    the nodes after the first skip them for a while instead of failing on them again."""

    def __init__(self, memory_seconds: float = TAKEN_MEMORY_SECONDS, limit: int = 4096) -> None:
        self._memory = memory_seconds
        self._limit = limit
        self._since: dict[int, float] = {}

    def add(self, ask_id: int) -> None:
        self._since.pop(ask_id, None)
        self._since[ask_id] = time.monotonic()
        while len(self._since) > self._limit:
            del self._since[next(iter(self._since))]

    def recent(self) -> set[int]:
        cutoff = time.monotonic() - self._memory
        return {ask for ask, since in self._since.items() if since >= cutoff}


def _cheapest_first(offer: Offer) -> tuple[bool, float, int, str]:
    price = offer.price.amount if offer.price is not None else 0.0
    return (offer.price is None, price, len(offer.id), offer.id)


def _instance_number(instance_id: str) -> int | None:
    """A Vast instance id (a positive integer) from its string form, else None."""
    if not (instance_id.isascii() and instance_id.isdigit() and len(instance_id) <= 18):
        return None
    return int(instance_id) or None
