"""Prime Intellect (provider id `prime`): GPU pods through Prime's Compute API.

Primitive -> API calls (paths exactly as in the vendor OpenAPI document; base
`https://api.primeintellect.ai`, `Authorization: Bearer <key>`):
- plan: `GET /api/v1/availability/gpus?page=N&page_size=100[&regions=..][&gpu_type=..]
  [&security=..]`, every page until `totalCount`; one Offer per item that is in stock, not
  prepaid, offers the job's image (one of Prime's environments; any other image is Unavailable
  for the provider), else the configured one, and has a `gpuCount` above 0 (create's
  PodRequestConfig takes no other; an item with 0 is rejected here, with a logged reason).
  Price: the item's own `prices` (per pod-hour; see parse.py), else None. `Offer.detail` keeps
  what create needs: cloudId, gpuType, socket, gpuCount, upstream provider type, data centre,
  country, security, sizes.
- prepare: with `spec.ssh_public_key`, `GET /api/v1/ssh_keys/` (paginated) and, unless that key
  is already registered, `POST /api/v1/ssh_keys/ {name: gpuprov-key-<hash>, publicKey}`.
  Returns the image and the key id. Nothing else to prepare: Prime has no firewall or image
  resolution.
- create: `POST /api/v1/pods/ {pod: {name: gpuprov-<vm>, cloudId, gpuType, socket, gpuCount,
  diskSize, vcpus, memory, image, dataCenterId, country, security, sshKeyId, autoRestart},
  provider: {type}, team?}` -> the new pod's `id`. One attempt.
- observe: `GET /api/v1/pods/?offset=N&limit=100` (every page), the pods named `gpuprov-<vm>`.
  PROVISIONING / PENDING -> Pending; ACTIVE is Running only once `installationStatus` is
  FINISHED and an SSH endpoint is known (Pending until then); ERROR, STOPPED or a failed
  installation -> Failed; DELETING -> Stopping; TERMINATED is gone (left out).
- observe_region: the same listing, every `gpuprov-*` pod grouped by VM. Prime's pod records
  carry no region, so every region's listing is the account's: identity (the name) is global and
  deletes go by id, so nothing depends on the region there.
- sweep_regions: the configured regions, else one account-wide sweep ("global").
- delete: `DELETE /api/v1/pods/{pod_id}` per id; not found / already terminated is success.
- cleanup: nothing. The SSH key is the deployment's (one client key for every VM), shared like
  a user's own key, so no VM may delete it; Prime has no other per-VM side resource.
- observe_side_resources: {} without a call (nothing per VM exists to list).
- diagnose: the contract's default, from observe.

Prime cannot open ports (no field in a pod request, no firewall API): Capabilities.unsupported
says so, and the core never offers Prime to a job that asks for ports.
Prime cannot run user data or a boot script, so `spec.user_data` is refused (Unavailable for
the whole provider) and `spec.bootstrap` is not delivered by create: the node agent reaches the
pod over SSH (`ssh_bootstrap`, always on), started by the core with a fresh token on its stdin
(activities/bootstrap.py). Errors are classified in errors.py.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx

from providers.base import (
    Billing,
    Capabilities,
    CloudProvider,
    InstanceSpec,
    Location,
    Observed,
    Offer,
    ResourceRequest,
    gpu_model_matches,
)
from providers.errors import BlockScope, ErrorKind, ProviderError
from providers.prime.client import (
    AVAILABILITY_GPUS,
    PAGE_SIZE,
    PODS,
    SSH_KEYS,
    PodGone,
    PrimeClient,
    pod_path,
)
from providers.prime.config import PrimeConfig
from providers.prime.errors import malformed
from providers.prime.parse import (
    ENVIRONMENTS,
    GPU_TYPES,
    PROVIDER_ID,
    AvailabilityPage,
    GpuOffer,
    Page,
    Pod,
    SshKey,
    Unreadable,
    gpu_display_name,
    observed,
    to_offer,
    validated,
    vm_of,
)
from providers.settings import capabilities_from

log = logging.getLogger(__name__)

# Prime's documents state no billing increment or minimum for pods: an actual cost counts
# exact seconds and says so.
BILLING = Billing()
ACCOUNT_WIDE = "global"  # the sweep region when none is configured: pods have no region
_SECURITY = {"secure_cloud", "community_cloud"}


class PrimeCloud(CloudProvider):
    name = PROVIDER_ID

    def __init__(
        self,
        config: PrimeConfig,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """The registry passes the section only, and the key is resolved from it (or
        MissingCredentials). Tests pass `api_key` (and a respx or mock transport), so they never
        read the environment or a credentials file."""
        self.config = config
        key = api_key if api_key is not None else config.resolve_api_key(config.API_KEY_ENV)
        self._client = PrimeClient(config.base_url, key, config.request_timeout, transport)

    def capabilities(self) -> Capabilities:
        # node_agent: started over SSH by the core (the section's ssh_bootstrap is always on).
        # ports: a pod request has no field for them, and Prime no firewall API.
        return capabilities_from(
            self.config, unsupported=["user_data", "ports"], node_agent=True, billing=BILLING
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def secrets(self) -> list[str]:
        return [*self.config.secret_values(), *self._client.secrets()]

    # ------------------------------------------------------------------ plan

    async def plan(self, request: ResourceRequest) -> list[Offer]:
        image = _environment(request.image) if request.image else self.config.image
        now = datetime.now(UTC)
        offers: dict[str, Offer] = {}
        skipped = 0
        gpuless: list[str] = []
        async for raw in self._availability(request):
            try:
                item = validated(GpuOffer, raw)
            except Unreadable:
                skipped += 1
                continue
            if item.gpuCount <= 0:
                gpuless.append(item.cloudId)
                continue
            if not self._wanted(item, image):
                continue
            offer = to_offer(item, self.config.disk_gb, now)
            known = offers.get(offer.id)
            if known is None or _order(offer) < _order(known):
                offers[offer.id] = offer
        if skipped:
            log.warning("prime: skipped %d unreadable availability items", skipped)
        if gpuless:
            log.warning(
                "prime: rejected %d availability items with gpuCount 0 (%s): a pod is created "
                "with gpuCount > 0 (PodRequestConfig), so no such offer could be rented",
                len(gpuless),
                ", ".join(sorted(set(gpuless))[:5]),
            )
        return sorted(offers.values(), key=_order)

    async def _availability(self, request: ResourceRequest) -> AsyncIterator[Any]:
        base: list[tuple[str, str | int]] = [("page_size", PAGE_SIZE)]
        base += [("regions", region) for region in self.config.regions or []]
        if (gpu_type := _gpu_type_filter(request.gpu)) is not None:
            base.append(("gpu_type", gpu_type))
        if self.config.security is not None:
            base.append(("security", self.config.security))
        seen = 0
        for page_number in range(1, self.config.max_pages + 1):
            body = await self._client.get("plan", AVAILABILITY_GPUS, [("page", page_number), *base])
            try:
                page = validated(AvailabilityPage, body)
            except Unreadable as error:
                raise malformed("plan", str(error)) from None
            for raw in page.items:
                yield raw
            seen += len(page.items)
            if len(page.items) < PAGE_SIZE or (
                page.totalCount is not None and seen >= page.totalCount
            ):
                return
        log.warning(
            "prime: availability has more than %d pages; planned from those", self.config.max_pages
        )

    def _wanted(self, item: GpuOffer, image: str) -> bool:
        """The item can be rented now, as configured: in stock, not prepaid, allowed, and it
        offers `image` (where it lists images at all)."""
        config = self.config
        if item.stockStatus == "Unavailable" or (item.prepaidTime or 0) > 0:
            return False
        if config.regions is not None and item.region not in config.regions:
            return False
        if config.countries is not None and item.country not in config.countries:
            return False
        if config.upstream_providers is not None and item.provider not in config.upstream_providers:
            return False
        if config.security is not None and item.security != config.security:
            return False
        return not item.images or image in item.images

    # ------------------------------------------------------------------ prepare / create

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        detail = _detail(offer)
        if spec.user_data:
            raise ProviderError(
                ErrorKind.UNAVAILABLE,
                "Prime Intellect pods take no user data (no cloud-init or startup script)",
                block_scope=BlockScope.PROVIDER,
            )
        image = spec.image or self.config.image
        images = detail.get("images") or []
        if images and image not in images:
            raise ProviderError(
                ErrorKind.UNAVAILABLE, f"image {image} is not offered by {offer.id}"
            )
        prepared: dict[str, Any] = {"image": image}
        if spec.ssh_public_key:
            prepared["ssh_key_id"] = await self._ssh_key(spec.ssh_public_key)
        return prepared

    async def _ssh_key(self, public_key: str) -> str:
        """The id of the registered key equal to `public_key` (whatever its name), else of that
        key registered now as `gpuprov-key-<sha256 prefix>`. The key is the deployment's, shared
        by every VM, so it is never deleted per VM. Idempotent, and safe when two prepares race:
        a failed registration is settled by reading the keys again."""
        wanted = public_key.split()[:2]
        if (found := await self._registered(wanted)) is not None:
            return found
        name = "gpuprov-key-" + hashlib.sha256(" ".join(wanted).encode()).hexdigest()[:12]
        try:
            body = await self._client.post(
                "prepare", SSH_KEYS, {"name": name, "publicKey": public_key}
            )
        except ProviderError as error:
            if (
                error.kind is ErrorKind.TRANSIENT
                or (found := await self._registered(wanted)) is None
            ):
                raise
            return found  # another prepare registered it first
        try:
            return validated(SshKey, body).id
        except Unreadable as error:
            raise malformed("prepare", str(error)) from None

    async def _registered(self, wanted: list[str]) -> str | None:
        async for key in self._ssh_keys("prepare"):
            if key.publicKey.split()[:2] == wanted:
                return key.id
        return None

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        body = pod_request(
            _detail(offer),
            name=spec.label,
            image=str(prepared.get("image") or self.config.image),
            ssh_key_id=prepared.get("ssh_key_id"),
            team_id=self.config.team_id,
        )
        answer = await self._client.post("create", PODS, body)
        pod_id = answer.get("id") if isinstance(answer, dict) else None
        if not isinstance(pod_id, str) or not pod_id:
            raise malformed("create", "no pod id in the answer")
        return [pod_id]

    # ------------------------------------------------------------------ observe

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        return (await self._gpuprov_pods("observe")).get(vm, [])

    async def observe_region(self, location: Location) -> dict[str, list[Observed]]:
        return await self._gpuprov_pods("observe")

    def sweep_regions(self) -> list[str]:
        return list(self.config.regions or [ACCOUNT_WIDE])

    async def _gpuprov_pods(self, operation: str) -> dict[str, list[Observed]]:
        """Every live pod named `gpuprov-<vm>`, by VM, from one complete pods listing."""
        by_vm: dict[str, list[Observed]] = {}
        seen_ids: set[str] = set()
        async for raw in self._pages(operation, PODS):
            name = raw.get("name") if isinstance(raw, dict) else None
            vm = vm_of(name) if isinstance(name, str) else None
            if vm is None:
                continue  # not ours
            try:
                pod = validated(Pod, raw)
            except Unreadable as error:
                raise malformed(operation, f"pod {name}: {error}") from None
            state = observed(pod)
            if state is None or pod.id in seen_ids:
                continue
            seen_ids.add(pod.id)
            by_vm.setdefault(vm, []).append(state)
        return by_vm

    async def _pages(self, operation: str, path: str) -> AsyncIterator[Any]:
        """Every entry of an offset/limit listing. A listing that does not end within
        `max_pages` is an error, never a partial answer: a missing pod would read as gone."""
        offset = 0
        for _ in range(self.config.max_pages):
            body = await self._client.get(operation, path, {"offset": offset, "limit": PAGE_SIZE})
            try:
                page = validated(Page, body)
            except Unreadable as error:
                raise malformed(operation, str(error)) from None
            for raw in page.data:
                yield raw
            offset += len(page.data)
            if len(page.data) < PAGE_SIZE or (
                page.total_count is not None and offset >= page.total_count
            ):
                return
        raise ProviderError(
            ErrorKind.TRANSIENT,
            f"{operation}: {path} did not end within {self.config.max_pages} pages",
        )

    async def _ssh_keys(self, operation: str) -> AsyncIterator[SshKey]:
        """The account's readable SSH keys (an unreadable entry cannot be the one we want)."""
        async for raw in self._pages(operation, SSH_KEYS):
            try:
                yield validated(SshKey, raw)
            except Unreadable:
                continue

    # ------------------------------------------------------------------ delete / cleanup

    async def delete(self, location: Location, vm: str, ids: list[str]) -> None:
        for pod_id in ids:
            try:
                await self._client.delete("delete", pod_path(pod_id))
            except PodGone:
                continue  # already gone: that is what we asked for
            except ValueError:
                continue  # not a pod id Prime could have issued: nothing of ours

    async def cleanup(self, location: Location, vm: str) -> None:
        """Nothing per VM: Prime has no firewall, and the SSH key prepare registers is the
        deployment's, shared by every VM (deleting it would break the next create)."""

    async def observe_side_resources(self, location: Location) -> dict[str, list[str]]:
        """Nothing per VM exists to list (see cleanup)."""
        return {}


def pod_request(
    detail: dict[str, Any],
    name: str,
    image: str,
    ssh_key_id: str | None,
    team_id: str | None,
) -> dict[str, Any]:
    """The `POST /api/v1/pods/` body (PodRequestConfig allows no other fields)."""
    pod: dict[str, Any] = {
        "name": name,
        "cloudId": detail["cloud_id"],
        "gpuType": detail["gpu_type"],
        "socket": detail["socket"],
        "gpuCount": detail["gpu_count"],
        "image": image,
        "autoRestart": False,
    }
    optional = {
        "diskSize": detail.get("disk_size"),
        "vcpus": detail.get("vcpus"),
        "memory": detail.get("memory"),
    }
    pod.update(
        {key: value for key, value in optional.items() if isinstance(value, int) and value > 0}
    )
    for key, field in (("dataCenterId", "data_center_id"), ("country", "country")):
        if isinstance(detail.get(field), str):
            pod[key] = detail[field]
    if detail.get("security") in _SECURITY:
        pod["security"] = detail["security"]
    if ssh_key_id:
        pod["sshKeyId"] = ssh_key_id
    body: dict[str, Any] = {"pod": pod, "provider": {"type": detail["provider_type"]}}
    if team_id:
        body["team"] = {"teamId": team_id}
    return body


def _detail(offer: Offer) -> dict[str, Any]:
    """The offer's detail, checked: an offer this adapter did not make cannot be created."""
    detail = offer.detail
    strings = ("cloud_id", "gpu_type", "socket", "provider_type")
    count = detail.get("gpu_count")
    if (
        offer.provider != PROVIDER_ID
        or not all(isinstance(detail.get(key), str) and detail[key] for key in strings)
        or not isinstance(count, int)
        or count <= 0
    ):
        raise ProviderError(
            ErrorKind.INVALID_REQUEST, f"offer {offer.id} was not made by the prime adapter"
        )
    return detail


def _environment(image: str) -> str:
    """The job's image as a pod's `image`: one of Prime's environments (EnvironmentTypeEnum),
    never a container image reference. Anything else is Unavailable for the whole provider,
    at plan, so the job's status and `gpuprov offers` say why before anything is made."""
    if image in ENVIRONMENTS:
        return image
    raise ProviderError(
        ErrorKind.UNAVAILABLE,
        f"Prime Intellect pods run one of its environments ({', '.join(ENVIRONMENTS)}), "
        f"not the image {image!r}",
        block_scope=BlockScope.PROVIDER,
    )


def _gpu_type_filter(gpu: str | None) -> str | None:
    """The one Prime `GPUType` a requested model names ("H100" -> H100_80GB), else None (no
    server-side filter: several types match, or a type this adapter does not know yet)."""
    if gpu is None:
        return None
    matches = [t for t in GPU_TYPES if gpu_model_matches(gpu, gpu_display_name(t))]
    return matches[0] if len(matches) == 1 else None


def _order(offer: Offer) -> tuple[bool, float, str]:
    return (offer.price is None, offer.price.amount if offer.price else 0.0, offer.id)
