"""Reading Vast.ai responses: listings into Offers, instances into Observed.

Everything here takes the JSON exactly as Vast sent it and trusts none of it: a number that is a
bool, infinite or of the wrong type counts as missing; a listing that cannot be read is left
out of the plan; an instance carrying our label whose id cannot be read is `MalformedResponse`
(it cannot be deleted, so it must not be hidden). Field meanings are from Vast's OpenAPI files
(search_offers.yaml, show_instances.yaml) and the notes in docs/clouds/vast.md.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from providers.base import (
    VM_LABEL_PREFIX,
    InstanceStatus,
    Observed,
    Offer,
    PriceQuote,
    SshEndpoint,
    price_quote,
)

PROVIDER_ID = "vast"
PRICE_SOURCE = "vast: POST /api/v0/bundles/ dph_total"
UNKNOWN_REGION = "unknown"
MAX_TEXT = 300
MIB_PER_GIB = 1024
MAX_ID = 10**18  # Vast ids are database integers; anything larger is not one

# actual_status -> status (clouds.md, Vast section). `stopped` depends on intended_status.
_STATUS: dict[str | None, InstanceStatus] = {
    None: InstanceStatus.PENDING,
    "created": InstanceStatus.PENDING,
    "loading": InstanceStatus.PENDING,
    "rebooting": InstanceStatus.PENDING,
    "running": InstanceStatus.RUNNING,
    "exited": InstanceStatus.FAILED,
    "unknown": InstanceStatus.FAILED,
    "offline": InstanceStatus.FAILED,
}
# The container never started: Vast keeps the contract in `created` with this in status_msg
# (seen by dstack's Vast backend), so it would otherwise wait out the whole boot_timeout.
OCI_FAILURE = "OCI runtime create failed"
_COUNTRY = re.compile(r"^[A-Za-z]{2}$")


class MalformedResponse(Exception):
    """A response whose shape we cannot use; the cloud turns it into a ProviderError."""


# ------------------------------------------------------------------ scalars


def number(value: Any) -> float | None:
    """A finite int or float (never a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        result = float(value)
    except OverflowError:  # an int beyond float range
        return None
    return result if math.isfinite(result) else None


def integer(value: Any) -> int | None:
    """An int (never a bool), or a float that is a whole number; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    as_float = number(value)
    if as_float is not None and as_float.is_integer():
        return int(as_float)
    return None


def text(value: Any, limit: int = MAX_TEXT) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()[:limit]


def region_of(geolocation: Any) -> str:
    """`"California, US"` -> `US`: the listing's country code, the adapter's region. Where the
    last part is not a two-letter code (`"California, United States"`), a slug of it."""
    place = text(geolocation)
    if place is None:
        return UNKNOWN_REGION
    country = place.rsplit(",", 1)[-1].strip()
    if _COUNTRY.match(country):
        return country.upper()
    slug = re.sub(r"[^a-z0-9]+", "-", country.lower()).strip("-")
    return slug or UNKNOWN_REGION


# ------------------------------------------------------------------ offers


def offer_from_listing(
    listing: Any, *, disk_gb: float, image: str, runtype: str, observed_at: datetime
) -> Offer | None:
    """One Offer for one listing (ask), or None where the listing cannot be used."""
    if not isinstance(listing, dict):
        return None
    ask_id = integer(listing.get("id"))
    if ask_id is None or not 0 < ask_id < MAX_ID:
        return None
    disk_space = number(listing.get("disk_space"))
    if disk_space is not None and disk_space < disk_gb:
        return None  # the host cannot give the disk create would ask for
    gpu_name = text(listing.get("gpu_name"), 100)
    gpu_count = integer(listing.get("num_gpus"))
    gpu_count = gpu_count if gpu_count is not None and gpu_count >= 0 else 0
    gpu_ram = _non_negative(listing.get("gpu_ram"))
    vcpus = _non_negative(listing.get("cpu_cores_effective"))
    geolocation = text(listing.get("geolocation"), 100)
    detail: dict[str, Any] = {
        "ask_id": ask_id,
        "disk_gb": disk_gb,
        "image": image,
        "runtype": runtype,
        "geolocation": geolocation,
    }
    for key in ("machine_id", "host_id"):
        if (value := integer(listing.get(key))) is not None:
            detail[key] = value
    if (reliability := number(listing.get("reliability2"))) is not None:
        detail["reliability"] = reliability
    return Offer(
        id=f"{PROVIDER_ID}/{ask_id}",
        provider=PROVIDER_ID,
        region=region_of(geolocation),
        instance_type=f"{(gpu_name or 'gpu').replace(' ', '_')}x{gpu_count}",
        gpu_name=gpu_name,
        gpu_count=gpu_count,
        gpu_memory_gb=round(gpu_ram / MIB_PER_GIB, 1) if gpu_ram is not None else None,
        vcpus=int(vcpus) if vcpus is not None and vcpus < 2**31 else None,
        memory_gb=_memory_share_gb(listing),
        disk_gb=disk_gb,
        spot=False,
        price=_price(listing, gpu_count, observed_at),
        detail=detail,
    )


def _non_negative(value: Any) -> float | None:
    result = number(value)
    return result if result is not None and result >= 0 else None


def _memory_share_gb(listing: dict[str, Any]) -> float | None:
    """`cpu_ram` (MB) is the whole machine's; a listing gets its share of the CPU cores' worth
    (`cpu_cores_effective / cpu_cores`), as dstack's gpuhunt computes it."""
    ram = _non_negative(listing.get("cpu_ram"))
    cores = _non_negative(listing.get("cpu_cores"))
    effective = _non_negative(listing.get("cpu_cores_effective"))
    if ram is None or not cores or effective is None:
        return None
    share = ram * min(effective / cores, 1.0) / MIB_PER_GIB
    return round(share, 1) if math.isfinite(share) else None


def _price(listing: dict[str, Any], gpus: int, observed_at: datetime) -> PriceQuote | None:
    """`dph_total`: the listing's live $/hour for the whole rental, including storage for the
    disk size the search was told (`allocated_storage`); bandwidth is billed on top. Hosts
    set their own prices, so an absurd one is possible: price_quote bounds it per GPU."""
    amount = _non_negative(listing.get("dph_total"))
    return price_quote(amount, source=PRICE_SOURCE, observed_at=observed_at, gpus=gpus)


# ------------------------------------------------------------------ instances


def instance_label(instance: Any) -> str | None:
    if not isinstance(instance, dict):
        return None
    label = instance.get("label")
    return label if isinstance(label, str) else None


def vm_of(label: str | None) -> str | None:
    """The VM identity in a `gpuprov-<vm>` label, else None."""
    if label is None or not label.startswith(VM_LABEL_PREFIX):
        return None
    return label[len(VM_LABEL_PREFIX) :] or None


def observed_from_instance(instance: dict[str, Any], ssh_mode: str) -> Observed:
    """The normalised state of one of our instances."""
    instance_id = integer(instance.get("id"))
    if instance_id is None or not 0 < instance_id < MAX_ID:
        raise MalformedResponse(
            f"instance labelled {instance_label(instance)!r} has no usable id "
            f"({str(instance.get('id'))[:40]!r})"
        )
    status, note = status_of(instance)
    ssh = ssh_endpoint(instance, ssh_mode) if status is InstanceStatus.RUNNING else None
    if status is InstanceStatus.RUNNING and ssh is None:
        # Running but not reachable yet: the port mapping lands a little after the status.
        status, note = InstanceStatus.PENDING, f"running; waiting for the {ssh_mode} SSH port"
    message = text(instance.get("status_msg"))
    if note:
        message = f"{note} ({message})" if message else note
    return Observed(id=str(instance_id), status=status, ssh=ssh, message=message)


def status_of(instance: dict[str, Any]) -> tuple[InstanceStatus, str | None]:
    """Vast's state words -> InstanceStatus, plus a note where the mapping needs explaining."""
    actual = _word(instance.get("actual_status"))
    intended = _word(instance.get("intended_status"))
    status_msg = instance.get("status_msg")
    if actual != "running" and isinstance(status_msg, str) and OCI_FAILURE in status_msg:
        return InstanceStatus.FAILED, "the container could not be created"
    if actual == "stopped":
        if intended == "stopped":
            return InstanceStatus.FAILED, "stopped by the host (outbid or host stop)"
        return InstanceStatus.PENDING, "stopped; waiting to start"
    if actual in _STATUS:
        status = _STATUS[actual]
        if status is InstanceStatus.FAILED:
            return status, f"actual_status {actual}"
        return status, None
    return InstanceStatus.PENDING, f"unrecognised actual_status {str(actual)[:40]!r}"


def _word(value: Any) -> str | None:
    return value.strip().lower() if isinstance(value, str) and value.strip() else None


def ssh_endpoint(instance: dict[str, Any], ssh_mode: str) -> SshEndpoint | None:
    """Direct: `public_ipaddr` and the host port mapped to 22/tcp. Proxy: Vast's gateway
    `ssh_host:ssh_port`. User root in both."""
    if ssh_mode == "proxy":
        host, port = text(instance.get("ssh_host"), 255), _port(instance.get("ssh_port"))
    else:
        host, port = text(instance.get("public_ipaddr"), 255), _direct_port(instance)
    if host is None or port is None:
        return None
    return SshEndpoint(host=host, port=port, user="root")


def _direct_port(instance: dict[str, Any]) -> int | None:
    ports = instance.get("ports")
    if not isinstance(ports, dict):
        return None
    bindings = ports.get("22/tcp")
    if not isinstance(bindings, list) or not bindings or not isinstance(bindings[0], dict):
        return None
    return _port(bindings[0].get("HostPort"))


def _port(value: Any) -> int | None:
    if isinstance(value, str):  # Docker's port bindings are strings ("20000")
        digits = value.strip()
        value = int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 5 else None
    port = integer(value)
    return port if port is not None and 0 < port < 65536 else None


def new_contract(payload: Any) -> int | None:
    """The instance id in a create answer (`new_contract`), if any."""
    if not isinstance(payload, dict):
        return None
    contract = integer(payload.get("new_contract"))
    return contract if contract is not None and contract > 0 else None
