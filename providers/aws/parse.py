"""Reading EC2 and Price List answers (as aiobotocore returns them) into gpuprov's records.

Every reader either returns a well-formed value or raises a classified ProviderError (Failed,
"malformed ... answer"); a hostile or truncated answer never escapes as another exception.
Prices that cannot be read are None, never guessed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from providers.base import InstanceStatus, Observed, SshEndpoint
from providers.errors import ErrorKind, ProviderError

VM_TAG = "gpuprov-vm"  # tag key carrying the VM identity; Name carries gpuprov-<vm>
# Every state but terminated: a terminated instance is still listed for a while, and is gone.
LIVE_STATES = ["pending", "running", "shutting-down", "stopping", "stopped"]
STATUS = {
    "pending": InstanceStatus.PENDING,
    "running": InstanceStatus.RUNNING,
    "shutting-down": InstanceStatus.STOPPING,
    "stopping": InstanceStatus.STOPPING,
    "stopped": InstanceStatus.FAILED,  # our instances never stop on purpose
}
MIB_PER_GB = 1024


@dataclass(frozen=True)
class Shape:
    """What DescribeInstanceTypes says one instance type has."""

    name: str
    gpu_name: str | None
    gpu_count: int
    gpu_memory_gb: float | None  # per GPU
    vcpus: int | None
    memory_gb: float | None
    architecture: str  # x86_64 or arm64: the image must match


@contextmanager
def reading(what: str) -> Iterator[None]:
    """Any shape error while reading `what` becomes a classified ProviderError."""
    try:
        yield
    except ProviderError:
        raise
    except (
        KeyError,
        TypeError,
        ValueError,  # pydantic's ValidationError too
        AttributeError,
        IndexError,
        OverflowError,
        ValidationError,
    ) as error:
        raise ProviderError(
            ErrorKind.FAILED, f"malformed {what} answer: {type(error).__name__}: {error}"
        ) from None


def instances(reservations: list[Any]) -> list[dict[str, Any]]:
    """The instances of DescribeInstances' Reservations."""
    with reading("DescribeInstances"):
        found = [instance for r in reservations for instance in r["Instances"]]
        for instance in found:
            if not isinstance(instance, dict) or not isinstance(instance["InstanceId"], str):
                raise TypeError("an instance without an InstanceId")
        return found


def tag(instance: dict[str, Any], key: str) -> str | None:
    with reading("DescribeInstances"):
        for item in instance.get("Tags") or []:
            if item["Key"] == key:
                return str(item["Value"])
        return None


def observed(instance: dict[str, Any], ssh_user: str) -> Observed | None:
    """One instance as the core sees it; None when terminated (gone)."""
    with reading("DescribeInstances"):
        state = str(instance["State"]["Name"])
        if state == "terminated":
            return None
        status = STATUS.get(state, InstanceStatus.FAILED)
        ssh = None
        host = instance.get("PublicIpAddress") or instance.get("PrivateIpAddress")
        if status is InstanceStatus.RUNNING and host:
            ssh = SshEndpoint(host=str(host), port=22, user=ssh_user)
        return Observed(
            id=instance["InstanceId"], status=status, ssh=ssh, message=_message(instance, state)
        )


def _message(instance: dict[str, Any], state: str) -> str | None:
    """The cloud's words: StateReason (code: message), else StateTransitionReason."""
    words = reason_words(instance.get("StateReason") or {})
    words = words or str(instance.get("StateTransitionReason") or "")
    if state not in STATUS:
        words = f"unknown instance state {state!r}" + (f"; {words}" if words else "")
    return words or None


def reason_words(reason: dict[str, Any]) -> str:
    """`Code: Message` of a StateReason; EC2's message often repeats the code already."""
    code, message = str(reason.get("Code") or ""), str(reason.get("Message") or "")
    if not code or message.startswith(code):
        return message or code
    return f"{code}: {message}" if message else code


def shapes(instance_types: list[Any]) -> dict[str, Shape]:
    """DescribeInstanceTypes' InstanceTypes by name."""
    found: dict[str, Shape] = {}
    with reading("DescribeInstanceTypes"):
        for item in instance_types:
            gpus = (item.get("GpuInfo") or {}).get("Gpus") or []
            first = gpus[0] if gpus else {}
            name = " ".join(str(p) for p in (first.get("Manufacturer"), first.get("Name")) if p)
            gpu_mib = (first.get("MemoryInfo") or {}).get("SizeInMiB")
            architectures = (item.get("ProcessorInfo") or {}).get("SupportedArchitectures")
            found[str(item["InstanceType"])] = Shape(
                name=str(item["InstanceType"]),
                gpu_name=name or None,
                gpu_count=sum(int(gpu.get("Count", 0)) for gpu in gpus),
                gpu_memory_gb=_gb(gpu_mib),
                vcpus=_count((item.get("VCpuInfo") or {}).get("DefaultVCpus")),
                memory_gb=_gb((item.get("MemoryInfo") or {}).get("SizeInMiB")),
                architecture="arm64" if architectures == ["arm64"] else "x86_64",
            )
    return found


def offered_zones(offerings: list[Any]) -> dict[str, set[str]]:
    """DescribeInstanceTypeOfferings (availability-zone) -> {instance type: zones}."""
    zones: dict[str, set[str]] = {}
    with reading("DescribeInstanceTypeOfferings"):
        for item in offerings:
            zones.setdefault(str(item["InstanceType"]), set()).add(str(item["Location"]))
    return zones


def spot_prices(history: list[Any]) -> dict[tuple[str, str], float]:
    """DescribeSpotPriceHistory -> the newest price per (instance type, zone). An entry that
    cannot be read is skipped: that zone's spot offer is then unpriced, not guessed."""
    newest: dict[tuple[str, str], tuple[datetime | str, float]] = {}
    for item in history:
        try:
            key = (str(item["InstanceType"]), str(item["AvailabilityZone"]))
            amount = _amount(item["SpotPrice"])
            stamp = item.get("Timestamp") or ""
            if amount is None:
                continue
            if key not in newest or _later(stamp, newest[key][0]):
                newest[key] = (stamp, amount)
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
    return {key: amount for key, (_, amount) in newest.items()}


def on_demand_price(entries: list[Any], instance_type: str, region: str) -> float | None:
    """The one hourly USD on-demand price in Price List GetProducts entries (JSON text), for
    `instance_type` in `region`; None when there is none, or several that disagree."""
    amounts: set[float] = set()
    for entry in entries:
        try:
            product = json.loads(entry) if isinstance(entry, str | bytes) else entry
            attributes = product["product"]["attributes"]
            if attributes.get("instanceType") != instance_type:
                continue
            if attributes.get("regionCode", region) != region:
                continue
            for term in product["terms"]["OnDemand"].values():
                for dimension in term["priceDimensions"].values():
                    if str(dimension.get("unit", "")).lower() not in ("hrs", "hours", "hour"):
                        continue
                    amount = _amount(dimension["pricePerUnit"]["USD"])
                    if amount is not None:
                        amounts.add(amount)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError):
            continue
    return amounts.pop() if len(amounts) == 1 else None


def _amount(raw: Any) -> float | None:
    """A positive, finite price from text like "98.3200000000"; None otherwise."""
    if isinstance(raw, bool):
        return None
    value = float(raw) if isinstance(raw, str | int | float) else math.nan
    return value if math.isfinite(value) and 0 < value < 1_000_000 else None


def _later(stamp: Any, other: Any) -> bool:
    try:
        return bool(stamp > other)
    except TypeError:
        return False


def _gb(mib: Any) -> float | None:
    if mib is None:
        return None
    value = float(mib) / MIB_PER_GB
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"memory {mib!r} MiB")
    return round(value, 2)


def _count(raw: Any) -> int | None:
    if raw is None:
        return None
    value = int(raw)
    if value < 0:
        raise ValueError(f"count {raw!r}")
    return value
