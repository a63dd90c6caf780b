"""plan: the catalogue x the zones that have each machine type -> offers.

Calls (each paginated, filtered to the catalogue's names):
- `GET aggregated/machineTypes?filter=(name = "g2-standard-4") OR ...` -> per zone: vCPUs,
  memory and, for A2/A3/G2, the GPUs the machine type includes (`accelerators[]`);
- `GET aggregated/acceleratorTypes?filter=(name = "nvidia-l4") OR ...` -> per zone: the GPU's
  display name (`description`) and, for N1 entries, whether the zone has that GPU at all.

A zone is offered only if it is in the `zones` allow-list (when set) and the API lists the
machine type there (and, for N1, the accelerator, with enough cards per instance).
"""

from __future__ import annotations

from collections.abc import Iterable

from providers.base import Offer
from providers.gce.client import GceClient
from providers.gce.config import GceConfig, GceMachineType, region_of
from providers.gce.parse import (
    AcceleratorType,
    AcceleratorTypeAggregatedList,
    MachineType,
    MachineTypeAggregatedList,
    read,
)
from providers.gce.pricing import PriceBook

PROVIDER_ID = "gce"
RETIRED = frozenset({"OBSOLETE", "DELETED"})


def name_filter(names: Iterable[str]) -> str:
    """An AIP-160 filter matching any of `names` (catalogue names are validated RFC 1035)."""
    return " OR ".join(f'(name = "{name}")' for name in sorted(set(names)))


async def machine_types(client: GceClient, names: set[str]) -> list[MachineType]:
    action = "list machine types"
    found: list[MachineType] = []
    params = {"filter": name_filter(names), "maxResults": 500}
    async for page in client.pages(client.url("aggregated/machineTypes"), action, params):
        for scoped in read(MachineTypeAggregatedList, page, action).items.values():
            found.extend(m for m in scoped.machineTypes if m.name in names)
    return found


async def accelerator_types(
    client: GceClient, names: set[str]
) -> dict[tuple[str, str], AcceleratorType]:
    """(zone, accelerator name) -> accelerator type."""
    if not names:
        return {}
    action = "list accelerator types"
    found: dict[tuple[str, str], AcceleratorType] = {}
    params = {"filter": name_filter(names), "maxResults": 500}
    async for page in client.pages(client.url("aggregated/acceleratorTypes"), action, params):
        for scoped in read(AcceleratorTypeAggregatedList, page, action).items.values():
            for accelerator in scoped.acceleratorTypes:
                if accelerator.name in names:
                    found[(accelerator.zone, accelerator.name)] = accelerator
    return found


def build_offers(
    config: GceConfig,
    types: list[MachineType],
    accelerators: dict[tuple[str, str], AcceleratorType],
    prices: PriceBook,
) -> list[Offer]:
    allowed = set(config.zones)
    offers: list[Offer] = []
    for machine in types:
        if machine.deprecated and machine.deprecated.state in RETIRED:
            continue
        if allowed and machine.zone not in allowed:
            continue
        for entry in config.machine_types:
            if entry.machine_type == machine.name:
                offers.extend(_offers_for(config, entry, machine, accelerators, prices))
    return sorted(offers, key=_order)


def _offers_for(
    config: GceConfig,
    entry: GceMachineType,
    machine: MachineType,
    accelerators: dict[tuple[str, str], AcceleratorType],
    prices: PriceBook,
) -> list[Offer]:
    gpu = _gpu(entry, machine, accelerators)
    if gpu is None:
        return []
    gpu_name, gpu_count = gpu
    region = region_of(machine.zone)
    base = dict(
        provider=PROVIDER_ID,
        region=region,
        zone=machine.zone,
        instance_type=entry.key,
        gpu_name=gpu_name,
        gpu_count=gpu_count,
        gpu_memory_gb=entry.gpu_memory_gb,
        vcpus=machine.guestCpus,
        memory_gb=round(machine.memoryMb / 1024, 2),
        disk_gb=float(config.disk_size_gb),
    )
    detail = {
        "machine_type": entry.machine_type,
        "accelerator_type": entry.accelerator_type,
        "accelerator_count": entry.accelerator_count,
    }
    offer_id = f"{PROVIDER_ID}/{machine.zone}/{entry.key}"
    offers = [
        Offer(
            id=offer_id,
            price=prices.quote(entry.price_skus, region, spot=False),
            detail={**detail, "spot": False},
            **base,
        )
    ]
    if config.spot:
        offers.append(
            Offer(
                id=f"{offer_id}/spot",
                spot=True,
                price=prices.quote(entry.spot_price_skus, region, spot=True),
                detail={**detail, "spot": True},
                **base,
            )
        )
    return offers


def _gpu(
    entry: GceMachineType,
    machine: MachineType,
    accelerators: dict[tuple[str, str], AcceleratorType],
) -> tuple[str | None, int] | None:
    """(GPU name, count) of an entry in the machine's zone; None if the zone cannot have it."""
    if entry.accelerator_type is not None:  # N1: the GPU is attached, and must exist here
        if machine.accelerators:
            return None  # a machine type with its own GPUs takes no guestAccelerators
        attached = accelerators.get((machine.zone, entry.accelerator_type))
        if attached is None:
            return None
        cards = attached.maximumCardsPerInstance
        if cards is not None and cards < entry.accelerator_count:
            return None
        name = entry.gpu or attached.description or entry.accelerator_type
        return name, entry.accelerator_count
    if not machine.accelerators:
        return entry.gpu, 0
    included = machine.accelerators[0]
    described = accelerators.get((machine.zone, included.guestAcceleratorType))
    name = entry.gpu or (described.description if described else None)
    return name or included.guestAcceleratorType, sum(
        a.guestAcceleratorCount for a in machine.accelerators
    )


def _order(offer: Offer) -> tuple[bool, float, str]:
    return (offer.price is None, offer.price.amount if offer.price else 0.0, offer.id)
