"""Lambda's answers -> gpuprov records. Pure functions over the `data` payloads.

Anything unreadable that matters becomes a classified ProviderError (`errors.malformed`), never
another exception. What does not matter is skipped: an instance type we cannot read gives no
offer, and an instance or SSH key that does not carry a gpuprov identity is never validated (a
user's odd instance must not break observe).
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import re
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from providers.base import (
    VM_LABEL_PREFIX,
    Finding,
    InstanceStatus,
    Observed,
    Offer,
    PriceQuote,
    Severity,
    SshEndpoint,
    vm_label,
)
from providers.base import price_quote as stated_price

from .errors import Op, malformed

PROVIDER_ID = "lambda"
PRICE_SOURCE = "lambda: GET /api/v1/instance-types price_cents_per_hour"
IDENTITY_TAG = "gpuprov-vm"  # tag key carrying the VM identity; the name carries it too
MAX_NAME = 64  # Lambda's limit on instance and SSH key names
SHORTENED = "~"  # marks a name shortened to MAX_NAME (never in a VM name)
MAX_PRICE_CENTS = 10**8  # $1M per hour: anything above is not a price
SSH_USER = "ubuntu"  # Lambda Stack and Ubuntu images
MAX_MESSAGE = 300

# Lambda status -> gpuprov status; `terminated` is left out of observe altogether.
STATUSES: dict[str, InstanceStatus] = {
    "booting": InstanceStatus.PENDING,
    "active": InstanceStatus.RUNNING,
    "terminating": InstanceStatus.STOPPING,
    "unhealthy": InstanceStatus.FAILED,
    "preempted": InstanceStatus.FAILED,
}
TERMINATED = "terminated"
STATUS_MESSAGES = {
    "unhealthy": "Lambda reports the instance unhealthy",
    "preempted": "Lambda preempted the instance",
}


class _Answer(BaseModel):
    """Lambda's objects: unknown fields ignored, types exact (no "8" for 8)."""

    model_config = ConfigDict(extra="ignore", strict=True)


class Region(_Answer):
    name: str = Field(min_length=1, max_length=128)


class Specs(_Answer):
    vcpus: int = Field(ge=0, le=100_000)
    memory_gib: int = Field(ge=0, le=100_000_000)
    storage_gib: int = Field(ge=0, le=1_000_000_000)
    gpus: int = Field(ge=0, le=4096)


class InstanceType(_Answer):
    name: str = Field(min_length=1, max_length=200)
    gpu_description: str = Field(default="", max_length=500)
    price_cents_per_hour: Any = None  # read by price_quote: a bad price is no price
    specs: Specs


class InstanceTypesItem(_Answer):
    instance_type: InstanceType
    regions_with_capacity_available: list[Region]


class Tag(_Answer):
    key: str
    value: str


class Instance(_Answer):
    id: str = Field(min_length=1, max_length=200)
    name: str | None = None
    status: str
    ip: str | None = None
    region: Region
    tags: list[Tag] = Field(default_factory=list)


class SshKey(_Answer):
    id: str = Field(min_length=1, max_length=200)
    name: str
    public_key: str | None = None


class Image(_Answer):
    id: str = Field(min_length=1)
    family: str | None = None
    region: Region | None = None


class FirewallRuleset(_Answer):
    id: str = Field(min_length=1, max_length=200)
    name: str
    region: Region | None = None


class LaunchResult(_Answer):
    instance_ids: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        min_length=1, max_length=100
    )


# ---------------------------------------------------------------- identity


def instance_name(vm: str) -> str:
    """`gpuprov-<vm>`, the name of the VM's instance and of its per-VM SSH key. Lambda allows
    64 characters: a longer label keeps its start and ends in `~` and a hash of the whole, so
    it stays unique and the same every time (the `gpuprov-vm` tag carries the full identity;
    `~` never occurs in a VM name, so a shortened name is never read back as one)."""
    label = vm_label(vm)
    if len(label) <= MAX_NAME:
        return label
    digest = hashlib.sha256(label.encode()).hexdigest()[:8]
    return f"{label[: MAX_NAME - 9]}{SHORTENED}{digest}"


def vm_of(raw: Any) -> str | None:
    """The VM identity an instance (a raw list entry) carries: its `gpuprov-vm` tag, else a
    `gpuprov-<vm>` name. Lenient: this runs before (and decides whether) we validate it."""
    if not isinstance(raw, dict):
        return None
    tags = raw.get("tags")
    if isinstance(tags, list):
        for tag in tags:
            if isinstance(tag, dict) and tag.get("key") == IDENTITY_TAG:
                value = tag.get("value")
                if isinstance(value, str) and value:
                    return value
    name = raw.get("name")
    if isinstance(name, str) and name.startswith(VM_LABEL_PREFIX) and SHORTENED not in name:
        vm = name[len(VM_LABEL_PREFIX) :]
        if vm and instance_name(vm) == name:
            return vm
    return None


def carries(raw: Any, vm: str) -> bool:
    """Whether a raw instance carries this VM's identity (tag or name)."""
    return vm_of(raw) == vm or (isinstance(raw, dict) and raw.get("name") == instance_name(vm))


def gpuprov_instances(data: Any, op: Op, vm: str | None = None) -> list[tuple[str, Instance]]:
    """(vm, instance) for every instance in a GET /instances payload that carries a gpuprov
    identity (only `vm`'s, when given). Ours must be readable: one that is not is an error,
    because hiding it could leak it."""
    if not isinstance(data, list):
        raise malformed(op, f"expected a list of instances, got {type(data).__name__}")
    found: list[tuple[str, Instance]] = []
    for raw in data:
        owner = vm if vm is not None and carries(raw, vm) else None
        if vm is None:
            owner = vm_of(raw)
        if owner is None:
            continue
        try:
            found.append((owner, Instance.model_validate(raw)))
        except ValidationError as error:
            raise malformed(op, f"instance of {owner}: {_first_error(error)}") from None
    return found


# ---------------------------------------------------------------- status


def observed(instance: Instance) -> Observed | None:
    """The normalized view of one instance; None for a terminated one (gone)."""
    if instance.status == TERMINATED:
        return None
    status = STATUSES.get(instance.status)
    if status is None:
        # A status Lambda added later: keep waiting (bounded by boot_timeout), say what it is.
        return Observed(
            id=instance.id,
            status=InstanceStatus.PENDING,
            message=_clip(f"unknown Lambda status {instance.status!r}"),
        )
    if status is InstanceStatus.RUNNING:
        host = public_ip(instance.ip)
        if host is None:
            return Observed(
                id=instance.id, status=InstanceStatus.PENDING, message="active, no public IP yet"
            )
        return Observed(id=instance.id, status=status, ssh=SshEndpoint(host=host, user=SSH_USER))
    return Observed(id=instance.id, status=status, message=STATUS_MESSAGES.get(instance.status))


# Lambda status -> the diagnose finding it gives (active with an address gives none).
STATUS_FINDINGS: dict[str, tuple[Severity, str]] = {
    "preempted": (Severity.CRITICAL, "preempted"),
    "unhealthy": (Severity.CRITICAL, "unhealthy"),
    "booting": (Severity.WARN, "booting"),
    "terminating": (Severity.WARN, "terminating"),
}


def findings(instance: Instance) -> list[Finding]:
    """What diagnose says about one (non-terminated) instance's Lambda status."""
    seen = observed(instance)
    if instance.status in STATUS_FINDINGS:
        severity, code = STATUS_FINDINGS[instance.status]
        message = STATUS_MESSAGES.get(instance.status, f"Lambda reports the instance {code}")
        return [Finding(severity=severity, code=code, message=message)]
    if seen is not None and seen.status is InstanceStatus.PENDING:
        code = "no-public-ip" if instance.status == "active" else "unknown-status"
        return [Finding(severity=Severity.WARN, code=code, message=seen.message or code)]
    return []


def public_ip(value: str | None) -> str | None:
    """The instance's address if it is an IP address (never anything else as an SSH host)."""
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return None


# ---------------------------------------------------------------- offers


def offers(data: Any, regions: list[str] | None, observed_at: datetime) -> list[Offer]:
    """One offer per (instance type, region with capacity), within the `regions` allow-list,
    cheapest first (ties by id, unpriced last). A type with no region with capacity gives none."""
    if not isinstance(data, dict):
        raise malformed(Op.INSTANCE_TYPES, f"expected an object, got {type(data).__name__}")
    found: dict[str, Offer] = {}
    for raw in data.values():
        try:
            item = InstanceTypesItem.model_validate(raw)
        except ValidationError:
            continue  # a type we cannot read is not offered
        for region in item.regions_with_capacity_available:
            if regions is not None and region.name not in regions:
                continue
            offer = _offer(item.instance_type, region.name, observed_at)
            found[offer.id] = offer
    return sorted(found.values(), key=offer_order)


def offer_order(offer: Offer) -> tuple[bool, float, str]:
    return (offer.price is None, offer.price.amount if offer.price else 0.0, offer.id)


def _offer(kind: InstanceType, region: str, observed_at: datetime) -> Offer:
    specs = kind.specs
    gpu_name, gpu_memory = gpu_model(kind.gpu_description) if specs.gpus else (None, None)
    return Offer(
        id=f"{PROVIDER_ID}/{region}/{kind.name}",
        provider=PROVIDER_ID,
        region=region,
        instance_type=kind.name,
        gpu_name=gpu_name,
        gpu_count=specs.gpus,
        gpu_memory_gb=gpu_memory,
        vcpus=specs.vcpus,
        # Lambda states GiB; reported as is, so a minimum in GB is never met by rounding up.
        memory_gb=float(specs.memory_gib),
        disk_gb=float(specs.storage_gib),
        price=price_quote(kind.price_cents_per_hour, observed_at),
        detail={"instance_type": kind.name},
    )


def price_quote(cents: Any, observed_at: datetime) -> PriceQuote | None:
    """USD per instance-hour from `price_cents_per_hour`; None for anything not a price."""
    if isinstance(cents, bool) or not isinstance(cents, int | float):
        return None
    if isinstance(cents, float) and not math.isfinite(cents):
        return None
    if not 0 < cents <= MAX_PRICE_CENTS:
        return None
    return stated_price(cents / 100, source=PRICE_SOURCE, observed_at=observed_at)


_GPU = re.compile(r"^(?P<model>[^()]*?)\s*(?:\((?P<inner>[^()]*)\))?\s*$")
_MEMORY = re.compile(r"(?P<gb>\d{1,6}(?:\.\d{1,3})?)\s*GB", re.IGNORECASE)


def gpu_model(description: str) -> tuple[str | None, float | None]:
    """ "H100 (80 GB SXM5)" -> ("H100 SXM5", 80.0); "A10 (24 GB PCIe)" -> ("A10 PCIe", 24.0)."""
    match = _GPU.match(description.strip())
    if match is None:
        return (_clip(description.strip()) or None, None)
    model, inner = match.group("model").strip(), match.group("inner") or ""
    memory = _MEMORY.search(inner)
    rest = _MEMORY.sub("", inner).split()
    name = " ".join([model, *rest]).strip()
    return (name or None, float(memory.group("gb")) if memory else None)


# ---------------------------------------------------------------- keys, images, launch


def ssh_keys(data: Any) -> list[SshKey]:
    """The account's SSH keys; entries without a readable id and name are skipped."""
    if not isinstance(data, list):
        raise malformed(Op.LIST_KEYS, f"expected a list of keys, got {type(data).__name__}")
    keys = []
    for raw in data:
        try:
            keys.append(SshKey.model_validate(raw))
        except ValidationError:
            continue
    return keys


def firewall_rulesets(data: Any) -> list[FirewallRuleset]:
    """The account's firewall rulesets; entries without a readable id and name are skipped."""
    if not isinstance(data, list):
        raise malformed(Op.LIST_RULESETS, f"expected a list of rulesets, got {type(data).__name__}")
    found = []
    for raw in data:
        try:
            found.append(FirewallRuleset.model_validate(raw))
        except ValidationError:
            continue
    return found


def created_ruleset_id(data: Any) -> str:
    try:
        return FirewallRuleset.model_validate(data).id
    except ValidationError as error:
        raise malformed(
            Op.ADD_RULESET, f"no ruleset id: {error.error_count()} problem(s)"
        ) from None


def images(data: Any) -> list[Image]:
    if not isinstance(data, list):
        raise malformed(Op.IMAGES, f"expected a list of images, got {type(data).__name__}")
    found = []
    for raw in data:
        try:
            found.append(Image.model_validate(raw))
        except ValidationError:
            continue
    return found


def launched_ids(data: Any) -> list[str]:
    try:
        ids = LaunchResult.model_validate(data).instance_ids
    except ValidationError as error:
        raise malformed(Op.LAUNCH, _first_error(error)) from None
    return ids


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0] if error.errors() else {"loc": (), "msg": str(error)}
    where = ".".join(str(part) for part in first.get("loc", ())) or "body"
    return _clip(f"{where}: {first.get('msg', '')}")


def _clip(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
