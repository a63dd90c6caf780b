"""The RunPod adapter (provider id `runpod`), on RunPod's REST v2 only.

Primitive -> RunPod calls (base `https://api.runpod.io`, `Authorization: Bearer <key>`):
- plan: `GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N&cloud=C`, once per
  configured cloud type (N = the job's GPUs per node). One offer per (GPU type, data centre,
  cloud type) whose catalog availability is not NONE; data centres come from the entry's
  `dataCenters`. Price = the catalog's per-GPU price x N (PriceQuote source says so).
- prepare: no call. Checks the offer and resolves the image; RunPod has no per-VM side
  resources (a pod's ports are published by create, not by a firewall, and the account's SSH
  keys are never written).
- create: `GET /v2/account/ssh-keys` (read-only, only with a per-VM key and
  `include_account_ssh_keys`), then `POST /v2/pods` with `name = gpuprov-<vm>`, the spec's
  container image (else the configured one), env marker `GPUPROV_VM=<vm>`, the per-VM public
  key in env `PUBLIC_KEY`, `startSsh`, `ports ["22/tcp", "<port>/tcp" for the spec's ports]`,
  the offer's GPU, cloud type and data centre. 201 -> the pod id. RunPod has no labels and no
  idempotency key: a retried create is made safe by the core's observe-and-adopt.
- observe: `GET /v2/pods` (account-wide, not paginated), filtered client-side by the name
  `gpuprov-<vm>`; TERMINATED pods are gone. Status per providers/runpod/parse.py `observed`.
- observe_region: the same single `GET /v2/pods`, grouped by the `gpuprov-<vm>` names.
  Neither filters by data centre: the name is the identity, and `dataCenterIds` is
  documented as a placement preference, so a pod RunPod put elsewhere is still seen, waited
  on and deleted (never leaked). observe_region therefore answers for the whole account.
- sweep_regions: the configured `data_centers` (no call).
- delete: `DELETE /v2/pods/{id}` per id; 204 done, 404 already gone.
- cleanup: nothing to do (no call).
- observe_side_resources: {} without a call (nothing per VM exists to list).
- diagnose: the contract's default, from observe.

Errors are classified in providers/runpod/errors.py (documented detail phrases, then status).
Not delivered: `InstanceSpec.user_data` and `bootstrap` (RunPod pods have no user data, and a
pod's env is readable by anyone holding the account's API key, so a join token never goes
there). The node agent reaches the pod over SSH instead (`ssh_bootstrap`, always on): the core
logs in with the key create put in `PUBLIC_KEY` and starts the agent with a fresh token on its
stdin (activities/bootstrap.py).
"""

from __future__ import annotations

import logging
import math
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
)
from providers.errors import ErrorKind, ProviderError, redact
from providers.runpod import parse
from providers.runpod.client import RunPodClient
from providers.runpod.config import RunPodConfig
from providers.runpod.errors import Operation, unreadable
from providers.settings import capabilities_from

log = logging.getLogger(__name__)

# "All compute and storage charges are billed per second"; no minimum stated.
BILLING = Billing(granularity_seconds=1, source="https://docs.runpod.io/accounts-billing/billing")
DETAIL_KEYS = ("gpu_id", "gpu_count", "cloud", "data_center", "disk_gb")


class RunPodCloud(CloudProvider):
    name = parse.PROVIDER_ID

    def __init__(
        self,
        config: RunPodConfig,
        *,
        api_key: str | None = None,
        client: RunPodClient | None = None,
    ) -> None:
        """Built by the registry with the `[providers.runpod]` section (the key is resolved from
        it: MissingCredentials when there is none). Tests pass `api_key` (and a `base_url` in
        the config) or a ready `client`, so they never read the environment or key files."""
        self.config = config
        if client is None:
            key = api_key if api_key is not None else config.resolve_api_key(config.API_KEY_ENV)
            client = RunPodClient(key, config.base_url, timeout=config.request_timeout)
        self._client = client

    def capabilities(self) -> Capabilities:
        # node_agent: started over SSH by the core (the section's ssh_bootstrap is always on).
        return capabilities_from(
            self.config, unsupported=["spot", "user_data"], node_agent=True, billing=BILLING
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def secrets(self) -> list[str]:
        return [*self.config.secret_values(), *self._client.secrets()]

    # ------------------------------------------------------------------ primitives

    async def plan(self, request: ResourceRequest) -> list[Offer]:
        count = max(1, request.gpus_per_node)
        disk_gb = self._disk_for(request)
        now = datetime.now(UTC)
        offers: list[Offer] = []
        for cloud in dict.fromkeys(self.config.cloud_types):
            document = await self._client.list_gpu_types(cloud, count, self.config.min_cuda_version)
            for gpu in self._read("read", "GET /v2/catalog/gpus", parse.catalog_gpus, document):
                offers.extend(
                    parse.offers_for(
                        gpu,
                        cloud=cloud,
                        count=count,
                        disk_gb=disk_gb,
                        data_centers=self.config.data_centers,
                        asked_gpu=request.gpu,
                        observed_at=now,
                    )
                )
        return sorted(offers, key=_offer_order)

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        _offer_detail(offer)  # an offer this adapter did not make is InvalidRequest
        return {"image": spec.image or self.config.image}

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        body = await self._create_body(offer, prepared, spec)
        document = await self._client.create_pod(body)
        return [self._read("create", "POST /v2/pods", parse.created_pod_id, document)]

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        return (await self.observe_region(location)).get(vm, [])

    async def observe_region(self, location: Location) -> dict[str, list[Observed]]:
        by_vm: dict[str, list[Observed]] = {}
        for pod in await self._pods():
            vm = parse.vm_of(pod)
            if vm is None:
                continue
            state = parse.observed(pod)
            if state is not None:
                by_vm.setdefault(vm, []).append(state)
        return by_vm

    def sweep_regions(self) -> list[str]:
        return list(self.config.data_centers or [])

    async def delete(self, location: Location, vm: str, ids: list[str]) -> None:
        for pod_id in dict.fromkeys(ids):
            if pod_id:
                await self._client.delete_pod(pod_id)  # 404: already gone, fine

    async def cleanup(self, location: Location, vm: str) -> None:
        """RunPod pods have no per-VM side resources: nothing to remove."""

    async def observe_side_resources(self, location: Location) -> dict[str, list[str]]:
        """No per-VM side resources exist to list."""
        return {}

    # ------------------------------------------------------------------ internals

    async def _pods(self) -> list[parse.Pod]:
        document = await self._client.list_pods()
        return self._read("read", "GET /v2/pods", parse.pods, document)

    async def _create_body(
        self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec
    ) -> dict[str, Any]:
        detail = _offer_detail(offer)
        gpu: dict[str, Any] = {"id": detail["gpu_id"], "count": detail["gpu_count"]}
        if self.config.min_cuda_version is not None:
            gpu["minCudaVersion"] = self.config.min_cuda_version
        env = {parse.VM_ENV: spec.vm}
        keys = await self._ssh_keys(spec)
        if keys:
            # Set, PUBLIC_KEY stops startSsh from injecting the account's keys, so the
            # account's keys (read, never written) are added here next to the per-VM key.
            env["PUBLIC_KEY"] = "\n".join(keys)
        image = prepared.get("image") if isinstance(prepared.get("image"), str) else None
        return {
            "name": spec.label,
            "image": image or spec.image or self.config.image,
            "gpu": gpu,
            "cloud": detail["cloud"],
            "dataCenterIds": [detail["data_center"]],
            "disk": detail["disk_gb"],
            # ssh.direct exists only with a published 22/tcp; the job's ports beside it, each
            # mapped by RunPod to a public port of its choosing (the pod's runtime.ports).
            "ports": [
                "22/tcp",
                *(f"{port}/tcp" for port in dict.fromkeys(spec.ports) if port != 22),
            ],
            "env": env,
            "startSsh": True,
        }

    async def _ssh_keys(self, spec: InstanceSpec) -> list[str]:
        """The per-VM key first, then the account's; none without a per-VM key (startSsh then
        injects the account's keys itself)."""
        if not spec.ssh_public_key or not spec.ssh_public_key.strip():
            return []
        keys = [spec.ssh_public_key.strip()]
        if self.config.include_account_ssh_keys:
            for key in await self._account_keys():
                if key not in keys:
                    keys.append(key)
        return keys

    async def _account_keys(self) -> list[str]:
        """The account's registered keys. A key scoped to pods only may not read them: the pod
        is then made with the per-VM key alone (logged) rather than not at all. A Transient
        error still propagates, so the create is retried."""
        try:
            return _account_keys(await self._client.account_ssh_keys())
        except ProviderError as error:
            if error.kind is ErrorKind.TRANSIENT:
                raise
            reason = redact(error.message, self.secrets())
        except parse.BadResponse as error:
            reason = f"unreadable GET /v2/account/ssh-keys: {error}"
        log.warning("RunPod account SSH keys not added to the pod: %s", reason)
        return []

    @staticmethod
    def _read(operation: Operation, what: str, reader: Any, document: Any) -> Any:
        try:
            return reader(document)
        except parse.BadResponse as error:
            raise unreadable(operation, what, str(error)) from None

    def _disk_for(self, request: ResourceRequest) -> int:
        """The configured container disk, raised to the job's minimum."""
        wanted = request.min_disk_gb or 0
        if wanted > self.config.disk_gb:
            return math.ceil(wanted)
        return self.config.disk_gb


def _offer_detail(offer: Offer) -> dict[str, Any]:
    detail = offer.detail
    readable = (
        offer.provider == parse.PROVIDER_ID
        and all(key in detail for key in DETAIL_KEYS)
        and isinstance(detail["gpu_id"], str)
        and isinstance(detail["data_center"], str)
        and detail["cloud"] in ("SECURE", "COMMUNITY")
        and isinstance(detail["gpu_count"], int)
        and isinstance(detail["disk_gb"], int)
        and detail["gpu_count"] >= 1
        and detail["disk_gb"] >= 1
    )
    if not readable:
        raise ProviderError(ErrorKind.INVALID_REQUEST, f"not a RunPod offer: {offer.id}")
    return detail


def _account_keys(document: Any) -> list[str]:
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise parse.BadResponse("expected an object with a `keys` array")
    return [key.strip() for key in document["keys"] if isinstance(key, str) and key.strip()]


def _offer_order(offer: Offer) -> tuple[bool, float, str]:
    return (offer.price is None, offer.price.amount if offer.price else 0.0, offer.id)
