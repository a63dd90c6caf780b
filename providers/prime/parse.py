"""Reading Prime Intellect answers: availability items -> Offers, pods -> Observed.

Field names and meanings follow the vendor OpenAPI document (GpuAvailability, Prices,
CustomSpecValue, APIPodConfig). Pydantic models at the boundary read only what we use and ignore
the rest; anything unreadable becomes a classified ProviderError in the caller, never a crash.

Prices. `prices` belongs to the whole availability configuration (`gpuCount` GPUs on one pod),
so the quote is per pod-hour: `onDemand` for `secure_cloud` offers, `communityPrice` for
`community_cloud` (the other one when the matching one is null). Prime charges separately for a
resource whose `defaultIncludedInPrice` is false (`pricePerUnit` per unit-hour), so those are
added for the sizes create will ask for. No price in the answer means no quote (None).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from providers.base import (
    VM_LABEL_PREFIX,
    InstanceStatus,
    Observed,
    Offer,
    PriceQuote,
    SshEndpoint,
    price_quote,
)

M = TypeVar("M", bound="BaseModel")

PROVIDER_ID = "prime"
PRICE_SOURCE = "GET /api/v1/availability/gpus"
UNKNOWN_REGION = "unknown"  # an offer whose `region` is null
CPU_ONLY = "CPU_NODE"
MAX_COUNT = 10_000_000  # no real GPU count, disk or memory size is larger


# The vendor document's `GPUType` enum, each value once (the document lists RTX3070_8GB twice).
GPU_TYPES: tuple[str, ...] = (
    "CPU_NODE", "A10_24GB", "A100_80GB", "A100_40GB", "A30_24GB", "A40_48GB", "B200_180GB",
    "B300_262GB", "GB200", "GB300", "RTX3070_8GB", "RTX3080_10GB", "RTX3080Ti_12GB",
    "RTX3090_24GB", "RTX3090Ti_24GB", "RTX4070Ti_12GB", "RTX4080_16GB", "RTX4080Ti_16GB",
    "RTX4090_24GB", "RTX5090_32GB", "H100_80GB", "H200_96GB", "GH200_96GB", "H200_141GB",
    "GH200_480GB", "GH200_624GB", "L4_24GB", "L40_48GB", "L40S_48GB", "RTX4000_8GB",
    "RTX5000_16GB", "RTX6000_24GB", "RTX8000_48GB", "RTX2000Ada_16GB", "RTX4000Ada_20GB",
    "RTX5000Ada_32GB", "RTX6000Ada_48GB", "A2000_6GB", "A4000_16GB", "A4500_20GB", "A5000_24GB",
    "A6000_48GB", "V100_16GB", "V100_32GB", "P100_16GB", "T4_16GB", "P4_8GB", "P40_24GB",
    "RTX_PRO_6000B_96GB",
)  # fmt: skip


# The vendor document's `EnvironmentTypeEnum`: what a pod's `image` may be. `custom_template`
# is left out: it needs a `customTemplateId` this adapter does not send.
ENVIRONMENTS: tuple[str, ...] = (
    "ubuntu_22_cuda_12", "cuda_12_1_pytorch_2_2", "cuda_11_8_pytorch_2_1",
    "cuda_12_1_pytorch_2_3", "cuda_12_1_pytorch_2_4", "cuda_12_4_pytorch_2_4",
    "cuda_12_4_pytorch_2_5", "cuda_12_4_pytorch_2_6", "cuda_12_6_pytorch_2_7",
    "stable_diffusion", "axolotl", "bittensor", "hivemind", "petals_llama", "vllm_llama_8b",
    "vllm_llama_70b", "vllm_llama_405b", "flux", "prime_rl",
)  # fmt: skip


class _Api(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class SpecValue(_Api):
    """CustomSpecValue: a resource's default size and its price per unit-hour, if separate."""

    minCount: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    defaultCount: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    maxCount: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    pricePerUnit: float | None = Field(default=None, ge=0)
    defaultIncludedInPrice: bool | None = None


class Prices(_Api):
    # Read as stated, however absurd (negative, infinite, NaN, astronomically large): that makes
    # the offer unpriced (price_quote), it does not make the whole item unreadable.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=True)

    onDemand: float | None = None
    communityPrice: float | None = None
    isVariable: bool | None = None
    currency: str


class GpuOffer(_Api):
    """One GpuAvailability item."""

    cloudId: str = Field(min_length=1)
    gpuType: str = Field(min_length=1)
    socket: str = Field(min_length=1)
    provider: str = Field(min_length=1)
    region: str | None = None
    dataCenter: str | None = None
    country: str | None = None
    gpuCount: int = Field(ge=0, le=MAX_COUNT)
    gpuMemory: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    disk: SpecValue = Field(default_factory=SpecValue)
    vcpu: SpecValue = Field(default_factory=SpecValue)
    memory: SpecValue = Field(default_factory=SpecValue)
    stockStatus: str = "Available"
    security: str
    prices: Prices
    images: list[str] = Field(default_factory=list)
    isSpot: bool | None = None
    prepaidTime: float | None = None


class PortMapping(_Api):
    internal: str | int | None = None
    external: str | int | None = None
    usedBy: str | None = None


# APIPodConfig's documented defaults: a pod that does not say is still being provisioned.
DEFAULT_POD_STATUS = "PROVISIONING"
DEFAULT_INSTALLATION_STATUS = "PENDING"


class Pod(_Api):
    """The APIPodConfig fields observe needs. `status` and `installationStatus` have documented
    defaults (PROVISIONING, PENDING), so a pod without them (or with null) is not yet known:
    Pending, never an unreadable answer."""

    id: str = Field(min_length=1)
    name: str
    status: str | None = None
    installationStatus: str | None = None
    installationFailure: str | None = None
    installationProgress: int | None = None
    sshConnection: str | list[str | None] | None = None
    ip: str | list[str | None] | None = None
    primePortMapping: list[PortMapping] | None = None


class Page(_Api):
    """GenericPaginationResponse: `data` plus the total the listing has."""

    data: list[Any]
    total_count: int | None = Field(default=None, ge=0)


class AvailabilityPage(_Api):
    items: list[Any]
    totalCount: int | None = Field(default=None, ge=0)


class SshKey(_Api):
    id: str = Field(min_length=1)
    name: str
    publicKey: str


class Unreadable(ValueError):
    """An answer that does not have the documented shape."""


def validated(model: type[M], value: Any) -> M:
    try:
        return model.model_validate(value)
    except ValidationError as error:
        fields = ", ".join(".".join(map(str, e["loc"])) or "(root)" for e in error.errors()[:5])
        raise Unreadable(f"{model.__name__}: bad or missing {fields}") from None


# ---------------------------------------------------------------------------- offers


def gpu_display_name(gpu_type: str) -> str | None:
    """`H100_80GB` -> `NVIDIA H100 80GB`, so "H100" matches it as a whole word."""
    if gpu_type == CPU_ONLY:
        return None
    return "NVIDIA " + gpu_type.replace("_", " ")


def disk_size(item: GpuOffer, wanted_gb: int | None) -> int | None:
    """The disk create will ask for: the configured size, else the offer's default."""
    return wanted_gb if wanted_gb is not None else item.disk.defaultCount


def offer_price(item: GpuOffer, disk_gb: int | None, now: datetime) -> PriceQuote | None:
    """USD (or EUR) per pod-hour for the pod create will ask for; None when not stated."""
    prices = item.prices
    if item.security == "community_cloud":
        base = prices.communityPrice if prices.communityPrice is not None else prices.onDemand
    else:
        base = prices.onDemand if prices.onDemand is not None else prices.communityPrice
    if base is None or base <= 0:  # 0 is no price (price_quote), whatever the extras add
        return None
    extras = [
        _extra(item.disk, disk_gb),
        _extra(item.vcpu, item.vcpu.defaultCount),
        _extra(item.memory, item.memory.defaultCount),
    ]
    if any(extra is None for extra in extras):
        return None
    amount = base + sum(extra for extra in extras if extra is not None)
    return price_quote(
        amount, currency=prices.currency, source=PRICE_SOURCE, observed_at=now, gpus=item.gpuCount
    )


def _extra(spec: SpecValue, requested: int | None) -> float | None:
    """What a resource adds to the base price at `requested` units; None when unknowable."""
    if spec.pricePerUnit is None or requested is None or requested == 0:
        return 0.0
    if spec.defaultIncludedInPrice is False:
        return requested * spec.pricePerUnit
    default = spec.defaultCount
    if default is not None and requested <= default:
        return 0.0  # the default (or less) is in the base price, or included by default
    if spec.defaultIncludedInPrice is True and default is not None:
        return (requested - default) * spec.pricePerUnit
    return None  # a non-default size whose pricing the answer does not settle


def offer_id(item: GpuOffer) -> str:
    place = item.dataCenter or item.country or item.region or "any"
    parts = [PROVIDER_ID, item.provider, place, item.cloudId, f"{item.gpuCount}x{item.gpuType}"]
    if item.security == "community_cloud":
        parts.append("community")
    if item.isSpot:
        parts.append("spot")
    return "/".join(re.sub(r"[\s/]+", "_", part) for part in parts)


def to_offer(item: GpuOffer, disk_gb: int | None, now: datetime) -> Offer:
    """An Offer whose detail holds everything create's body needs (and no secret)."""
    size = disk_size(item, disk_gb)
    is_cpu = item.gpuType == CPU_ONLY
    return Offer(
        id=offer_id(item),
        provider=PROVIDER_ID,
        region=item.region or UNKNOWN_REGION,
        zone=item.dataCenter,
        instance_type=item.cloudId,
        gpu_name=gpu_display_name(item.gpuType),
        gpu_count=0 if is_cpu else item.gpuCount,
        gpu_memory_gb=None if is_cpu else item.gpuMemory,
        vcpus=item.vcpu.defaultCount,
        memory_gb=item.memory.defaultCount,
        disk_gb=size,
        spot=bool(item.isSpot),
        price=offer_price(item, size, now),
        detail={
            "cloud_id": item.cloudId,
            "gpu_type": item.gpuType,
            "gpu_count": item.gpuCount,
            "socket": item.socket,
            "provider_type": item.provider,
            "data_center_id": item.dataCenter,
            "country": item.country,
            "security": item.security,
            "disk_size": size,
            "vcpus": item.vcpu.defaultCount,
            "memory": item.memory.defaultCount,
            "images": list(item.images),
            "stock_status": item.stockStatus,
            "price_is_variable": bool(item.prices.isVariable),
        },
    )


# ---------------------------------------------------------------------------- pods

_SSH = re.compile(
    r"^(?:ssh\s+)?(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9.:-]+)"
    r"(?:\s+-p\s*(?P<port>\d{1,5}))?\s*$"
)
_INSTALL_DONE = {"FINISHED"}
_INSTALL_FAILED = {"ERROR", "TERMINATED"}


def vm_of(pod_name: str) -> str | None:
    """The VM identity a pod name carries (`gpuprov-<vm>`), None for anyone else's pod."""
    if pod_name.startswith(VM_LABEL_PREFIX) and len(pod_name) > len(VM_LABEL_PREFIX):
        return pod_name[len(VM_LABEL_PREFIX) :]
    return None


def ssh_endpoint(pod: Pod) -> SshEndpoint | None:
    """From `sshConnection` ("root@1.2.3.4 -p 22"), else `ip` + the SSH port mapping."""
    for connection in _first_values(pod.sshConnection):
        match = _SSH.match(connection.strip())
        if match and (port := int(match["port"] or 22)) and 0 < port < 65536:
            return SshEndpoint(host=match["host"], port=port, user=match["user"] or "root")
    ips = _first_values(pod.ip)
    if not ips:
        return None
    port = 22
    for mapping in pod.primePortMapping or []:
        if (mapping.usedBy == "SSH" or str(mapping.internal) == "22") and mapping.external:
            external = str(mapping.external)
            if external.isdigit() and 0 < int(external) < 65536:
                port = int(external)
                break
    return SshEndpoint(host=ips[0].strip(), port=port)


def _first_values(value: str | list[str | None] | None) -> list[str]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, str) and v.strip()]


def observed(pod: Pod) -> Observed | None:
    """The normalized state of one pod; None once it is TERMINATED (gone)."""
    status = (pod.status or DEFAULT_POD_STATUS).upper()
    install = (pod.installationStatus or "").upper()
    if status == "TERMINATED":
        return None
    if status == "DELETING":
        return Observed(id=pod.id, status=InstanceStatus.STOPPING, message="DELETING")
    if status in ("ERROR", "STOPPED") or install in _INSTALL_FAILED:
        reason = pod.installationFailure or f"status {status}, installation {install or '-'}"
        return Observed(id=pod.id, status=InstanceStatus.FAILED, message=reason)
    if status == "ACTIVE" and install in _INSTALL_DONE:
        ssh = ssh_endpoint(pod)
        if ssh is not None:
            return Observed(id=pod.id, status=InstanceStatus.RUNNING, ssh=ssh, message="ACTIVE")
        return Observed(
            id=pod.id, status=InstanceStatus.PENDING, message="ACTIVE, no SSH endpoint yet"
        )
    progress = f" {pod.installationProgress}%" if pod.installationProgress is not None else ""
    words = f"{status}, installation {install or DEFAULT_INSTALLATION_STATUS}{progress}"
    return Observed(id=pod.id, status=InstanceStatus.PENDING, message=words)
