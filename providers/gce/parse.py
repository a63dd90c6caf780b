"""Compute Engine and Cloud Billing responses, read through strict models.

Anything that does not fit (missing fields, wrong types, absurd numbers, an address that is not
an IP) becomes a classified `ProviderError`, never another exception. Validation messages name
the field and the problem, never the value: instance metadata can hold a join token.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from providers.base import InstanceStatus, Observed, SshEndpoint
from providers.gce.errors import GceApiError, malformed, operation_error
from providers.gce.identity import VM_LABEL_KEY, VM_METADATA_KEY, instance_id, vm_label_value

Text = Annotated[str, Field(max_length=4096)]
Name = Annotated[str, Field(min_length=1, max_length=63)]


def _ip(value: str) -> str:
    return str(ipaddress.ip_address(value))


def _zone_of(url: str) -> str:
    """`.../zones/us-central1-a` (or a bare zone name) -> `us-central1-a`."""
    zone = url.rstrip("/").rsplit("/", 1)[-1]
    if not zone or len(zone) > 63 or not zone.replace("-", "").isalnum():
        raise ValueError("not a zone")
    return zone


IpAddress = Annotated[str, AfterValidator(_ip)]
Zone = Annotated[str, Field(max_length=2048), AfterValidator(_zone_of)]


class _Read(BaseModel):
    """Read only what we use; ignore the rest of a (large, evolving) resource."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Operation(_Read):
    name: Name
    status: Annotated[str, Field(max_length=40)]
    error: Any = None
    httpErrorStatusCode: int | None = None
    operationType: Annotated[str, Field(max_length=200)] | None = None
    targetLink: Text | None = None
    insertTime: Annotated[str, Field(max_length=64)] | None = None
    statusMessage: Text | None = None

    @property
    def done(self) -> bool:
        return self.status == "DONE"

    def failure(self, action: str) -> GceApiError | None:
        """The classified error of a DONE operation; None while running or when it worked."""
        return operation_error(self.error, self.httpErrorStatusCode, action) if self.done else None


class AccessConfig(_Read):
    natIP: IpAddress | None = None


class NetworkInterface(_Read):
    networkIP: IpAddress | None = None
    accessConfigs: list[AccessConfig] = Field(default_factory=list, max_length=16)


class MetadataItem(_Read):
    key: Annotated[str, Field(max_length=128)]
    value: str | None = None


class Metadata(_Read):
    items: list[MetadataItem] = Field(default_factory=list, max_length=5000)


class UpcomingMaintenance(_Read):
    type: Annotated[str, Field(max_length=64)] | None = None
    maintenanceStatus: Annotated[str, Field(max_length=64)] | None = None
    windowStartTime: Annotated[str, Field(max_length=64)] | None = None
    windowEndTime: Annotated[str, Field(max_length=64)] | None = None
    canReschedule: bool | None = None


class ResourceStatus(_Read):
    upcomingMaintenance: UpcomingMaintenance | None = None


class Instance(_Read):
    name: Name
    zone: Zone
    status: Annotated[str, Field(max_length=40)]
    statusMessage: Text | None = None
    selfLink: Text | None = None
    labels: dict[Annotated[str, Field(max_length=63)], Annotated[str, Field(max_length=63)]] = (
        Field(default_factory=dict, max_length=64)
    )
    networkInterfaces: list[NetworkInterface] = Field(default_factory=list, max_length=16)
    metadata: Metadata | None = None
    resourceStatus: ResourceStatus | None = None

    @property
    def id(self) -> str:
        return instance_id(self.zone, self.name)

    @property
    def vm(self) -> str | None:
        """The VM identity: the full one from metadata where it agrees with the label."""
        label = self.labels.get(VM_LABEL_KEY)
        if label is None:
            return None
        for item in self.metadata.items if self.metadata else []:
            if item.key == VM_METADATA_KEY and item.value and vm_label_value(item.value) == label:
                return item.value
        return label


class InstanceList(_Read):
    items: list[Instance] = Field(default_factory=list, max_length=5000)
    nextPageToken: Annotated[str, Field(max_length=4096)] | None = None


class ScopeWarning(_Read):
    code: Annotated[str, Field(max_length=100)] | None = None


class InstancesScoped(_Read):
    instances: list[Instance] = Field(default_factory=list, max_length=5000)
    warning: ScopeWarning | None = None  # UNREACHABLE: this scope's instances are not listed


class InstanceAggregatedList(_Read):
    items: dict[Annotated[str, Field(max_length=200)], InstancesScoped] = Field(
        default_factory=dict, max_length=1000
    )
    nextPageToken: Annotated[str, Field(max_length=4096)] | None = None
    unreachables: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=list, max_length=1000
    )  # scopes ("zones/us-central1-a") missing from a partial answer

    @property
    def unreachable_scopes(self) -> list[str]:
        """Scopes this page could not list: `unreachables`, and scopes whose warning says
        UNREACHABLE (Discovery: "A given scope cannot be reached")."""
        warned = [s for s, v in self.items.items() if v.warning and v.warning.code == "UNREACHABLE"]
        return [*self.unreachables, *warned]


class OperationList(_Read):
    items: list[Operation] = Field(default_factory=list, max_length=5000)
    nextPageToken: Annotated[str, Field(max_length=4096)] | None = None


class Accelerator(_Read):
    guestAcceleratorType: Name
    guestAcceleratorCount: int = Field(ge=0, le=64)


class Deprecation(_Read):
    state: Annotated[str, Field(max_length=40)] | None = None


class MachineType(_Read):
    name: Name
    zone: Zone
    guestCpus: int = Field(ge=0, le=100_000)
    memoryMb: int = Field(ge=0, le=100_000_000)
    accelerators: list[Accelerator] = Field(default_factory=list, max_length=16)
    deprecated: Deprecation | None = None


class MachineTypesScoped(_Read):
    machineTypes: list[MachineType] = Field(default_factory=list, max_length=5000)


class MachineTypeAggregatedList(_Read):
    items: dict[Annotated[str, Field(max_length=200)], MachineTypesScoped] = Field(
        default_factory=dict, max_length=1000
    )
    nextPageToken: Annotated[str, Field(max_length=4096)] | None = None


class AcceleratorType(_Read):
    name: Name
    zone: Zone
    description: Annotated[str, Field(max_length=200)] | None = None
    maximumCardsPerInstance: int | None = Field(default=None, ge=0, le=1024)


class AcceleratorTypesScoped(_Read):
    acceleratorTypes: list[AcceleratorType] = Field(default_factory=list, max_length=5000)


class AcceleratorTypeAggregatedList(_Read):
    items: dict[Annotated[str, Field(max_length=200)], AcceleratorTypesScoped] = Field(
        default_factory=dict, max_length=1000
    )
    nextPageToken: Annotated[str, Field(max_length=4096)] | None = None


class Money(_Read):
    currencyCode: Annotated[str, Field(min_length=3, max_length=3)]
    units: int = Field(default=0, ge=0, le=1_000_000_000)  # int64 as a JSON string
    nanos: int = Field(default=0, ge=0, le=999_999_999)

    @property
    def amount(self) -> float:
        return self.units + self.nanos / 1e9


class TierRate(_Read):
    startUsageAmount: float = Field(default=0.0, ge=0, le=1e12)
    unitPrice: Money


class PricingExpression(_Read):
    usageUnit: Annotated[str, Field(max_length=40)]
    tieredRates: list[TierRate] = Field(default_factory=list, max_length=100)


class PricingInfo(_Read):
    pricingExpression: PricingExpression


class SkuCategory(_Read):
    usageType: Annotated[str, Field(max_length=40)] | None = None
    resourceGroup: Annotated[str, Field(max_length=100)] | None = None


class Sku(_Read):
    skuId: Annotated[str, Field(max_length=40)]
    description: Annotated[str, Field(max_length=500)] = ""
    category: SkuCategory | None = None
    serviceRegions: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list, max_length=500
    )
    pricingInfo: list[PricingInfo] = Field(default_factory=list, max_length=100)


class SkuList(_Read):
    skus: list[Sku] = Field(default_factory=list, max_length=10_000)
    nextPageToken: Annotated[str, Field(max_length=4096)] | None = None


M = TypeVar("M", bound=BaseModel)


def read(model: type[M], data: object, action: str) -> M:
    """`data` as `model`, or a classified error naming the fields (never the values)."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['type']}"
            for e in error.errors(include_input=False, include_url=False)[:5]
        )
        raise malformed(action, f"{model.__name__}: {problems}") from None
    except (ValueError, TypeError, RecursionError) as error:
        raise malformed(action, f"{model.__name__}: {type(error).__name__}") from None


# Instance.status -> the contract's statuses (clouds.md section 4). TERMINATED is a stopped
# instance that still exists (and still bills for its disk): Failed, so the core deletes it.
STATUSES: dict[str, InstanceStatus] = {
    "PENDING": InstanceStatus.PENDING,
    "PROVISIONING": InstanceStatus.PENDING,
    "STAGING": InstanceStatus.PENDING,
    "REPAIRING": InstanceStatus.PENDING,
    "RUNNING": InstanceStatus.RUNNING,
    "STOPPING": InstanceStatus.STOPPING,
    "SUSPENDING": InstanceStatus.STOPPING,
    "PENDING_STOP": InstanceStatus.STOPPING,
    "DEPROVISIONING": InstanceStatus.STOPPING,
    "TERMINATED": InstanceStatus.FAILED,
    "STOPPED": InstanceStatus.FAILED,
    "SUSPENDED": InstanceStatus.FAILED,
}


def observed(instance: Instance, ssh_user: str, external_ip: bool) -> Observed:
    """One instance in the contract's terms; Running only once SSH has an address."""
    status = STATUSES.get(instance.status)
    words = instance.statusMessage
    if status is None:  # a status newer than this table: keep waiting, say what it was
        status, words = InstanceStatus.PENDING, f"unrecognised status {instance.status}"
    elif status is InstanceStatus.FAILED:
        words = f"{instance.status}" + (f": {instance.statusMessage}" if words else "")
    ssh = None
    if status is InstanceStatus.RUNNING:
        host = _ssh_host(instance, external_ip)
        if host is None:
            status, words = InstanceStatus.PENDING, "running, waiting for its IP address"
        else:
            ssh = SshEndpoint(host=host, port=22, user=ssh_user)
    return Observed(id=instance.id, status=status, ssh=ssh, message=words)


def _ssh_host(instance: Instance, external_ip: bool) -> str | None:
    if not instance.networkInterfaces:
        return None
    nic = instance.networkInterfaces[0]
    if external_ip:
        return nic.accessConfigs[0].natIP if nic.accessConfigs else None
    return nic.networkIP


def by_vm(instances: list[Instance], ssh_user: str, external_ip: bool) -> dict[str, list[Observed]]:
    result: dict[str, list[Observed]] = {}
    for instance in instances:
        vm = instance.vm
        if vm is not None:
            result.setdefault(vm, []).append(observed(instance, ssh_user, external_ip))
    return result
