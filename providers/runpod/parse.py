"""RunPod REST v2 answers -> gpuprov records: catalog GPU types -> Offers, pods -> Observed.

Responses are read leniently (unknown fields ignored, one malformed catalog entry skipped) but
never trusted: numbers must be finite, ports in range, and a document without its documented
top-level list raises `BadResponse`, which the client classifies.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from providers.base import (
    VM_LABEL_PREFIX,
    InstanceStatus,
    Observed,
    Offer,
    PriceQuote,
    SshEndpoint,
    gpu_model_matches,
    price_quote,
)

log = logging.getLogger(__name__)

PROVIDER_ID = "runpod"
PRICE_SOURCE = "GET /v2/catalog/gpus (price per GPU x gpu count)"
VM_ENV = "GPUPROV_VM"  # the env marker every gpuprov pod carries besides its name
NO_STOCK = "NONE"


class BadResponse(ValueError):
    """A 2xx body that is not the document RunPod's OpenAPI describes."""


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class _PerCloud(_Lenient):
    secure: float | None = Field(default=None, ge=0)
    community: float | None = Field(default=None, ge=0)


class _DataCenterStock(_Lenient):
    id: str = Field(min_length=1)
    availability: str | None = None


class CatalogGpu(_Lenient):
    """One entry of `GET /v2/catalog/gpus` (schema GpuType), the fields an offer needs."""

    id: str = Field(min_length=1)
    name: str | None = None
    memory: float | None = Field(default=None, ge=0)  # VRAM per GPU, GB
    secure: bool | None = None
    community: bool | None = None
    price: _PerCloud = Field(default_factory=_PerCloud)  # USD/hour for ONE GPU
    maxCount: _PerCloud = Field(default_factory=_PerCloud)  # noqa: N815  (RunPod's name)
    availability: str | None = None
    dataCenters: list[_DataCenterStock] | None = None  # noqa: N815

    def offered_on(self, cloud: str) -> bool:
        flag = self.secure if cloud == "SECURE" else self.community
        return flag is not False

    def per_gpu_price(self, cloud: str) -> float | None:
        return self.price.secure if cloud == "SECURE" else self.price.community

    def max_count(self, cloud: str) -> float | None:
        return self.maxCount.secure if cloud == "SECURE" else self.maxCount.community


class _SshDirect(_Lenient):
    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    username: str | None = None


class _PodSsh(_Lenient):
    direct: _SshDirect | None = None  # `proxy` is interactive-only: never the endpoint


class Pod(_Lenient):
    """One pod of `GET /v2/pods` / `POST /v2/pods` (schema Pod), the fields gpuprov reads."""

    id: str = Field(min_length=1)
    name: str
    status: str | None = None
    env: dict[str, Any] | None = None
    ssh: _PodSsh | None = None


# --------------------------------------------------------------------------- catalog


def catalog_gpus(document: Any) -> list[CatalogGpu]:
    """`{"gpus": [...]}` -> the readable entries; an unreadable entry is skipped and logged."""
    if not isinstance(document, dict) or not isinstance(document.get("gpus"), list):
        raise BadResponse("expected an object with a `gpus` array")
    gpus = []
    for entry in document["gpus"]:
        try:
            gpus.append(CatalogGpu.model_validate(entry))
        except ValidationError as error:
            log.warning("skipping an unreadable RunPod catalog entry: %s", _first_error(error))
    return gpus


def offers_for(
    gpu: CatalogGpu,
    *,
    cloud: str,
    count: int,
    disk_gb: int,
    data_centers: list[str] | None,
    asked_gpu: str | None,
    observed_at: datetime,
) -> list[Offer]:
    """One offer per data centre that stocks `count` x `gpu` on `cloud`; none where the catalog
    says NONE, the type is not on that cloud, or `count` is above its per-machine ceiling."""
    if asked_gpu is not None and not gpu_model_matches(asked_gpu, gpu.id):
        return []
    if not gpu.offered_on(cloud) or (gpu.availability or "").upper() == NO_STOCK:
        return []
    ceiling = gpu.max_count(cloud)
    if ceiling is not None and count > ceiling:
        return []
    price = _quote(gpu.per_gpu_price(cloud), count, observed_at)
    offers = []
    for stock in gpu.dataCenters or []:
        if (stock.availability or "").upper() == NO_STOCK:
            continue
        if data_centers is not None and stock.id not in data_centers:
            continue
        offers.append(
            Offer(
                id=f"{PROVIDER_ID}/{stock.id}/{cloud.lower()}/{count}x-{_slug(gpu.id)}",
                provider=PROVIDER_ID,
                region=stock.id,
                instance_type=f"{count}x {gpu.id}",
                gpu_name=gpu.id,
                gpu_count=count,
                gpu_memory_gb=gpu.memory,
                disk_gb=float(disk_gb),
                price=price,
                detail={
                    "gpu_id": gpu.id,
                    "gpu_count": count,
                    "cloud": cloud,
                    "data_center": stock.id,
                    "disk_gb": disk_gb,
                    "availability": stock.availability,
                },
            )
        )
    return offers


def _quote(per_gpu: float | None, count: int, observed_at: datetime) -> PriceQuote | None:
    """The catalog's per-GPU list price times the GPU count; None when RunPod gives none (a
    zero price is "not priced", never "free")."""
    if per_gpu is None:
        return None
    return price_quote(per_gpu * count, source=PRICE_SOURCE, observed_at=observed_at, gpus=count)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-") or "gpu"


# --------------------------------------------------------------------------- pods


def pods(document: Any) -> list[Pod]:
    """`{"pods": [...]}` -> pods. An entry without a readable id and name cannot carry a
    gpuprov identity and is skipped; every other field is read leniently by `observed`."""
    if not isinstance(document, dict) or not isinstance(document.get("pods"), list):
        raise BadResponse("expected an object with a `pods` array")
    found = []
    for entry in document["pods"]:
        pod = pod_or_none(entry)
        if pod is not None:
            found.append(pod)
    return found


def pod_or_none(entry: Any) -> Pod | None:
    """A pod, reading around broken optional fields (they read as absent), or None when even
    its id and name are unreadable."""
    if not isinstance(entry, dict):
        return None
    try:
        return Pod.model_validate(entry)
    except ValidationError:
        pass
    core = {key: entry.get(key) for key in ("id", "name")}
    try:
        pod = Pod.model_validate(core)
    except ValidationError:
        return None
    status = entry.get("status")
    return pod.model_copy(
        update={
            "status": status if isinstance(status, str) else None,
            "env": entry.get("env") if isinstance(entry.get("env"), dict) else None,
            "ssh": _ssh_or_none(entry.get("ssh")),
        }
    )


def _ssh_or_none(value: Any) -> _PodSsh | None:
    try:
        return _PodSsh.model_validate(value)
    except ValidationError:
        return None


def created_pod_id(document: Any) -> str:
    """The id in createPod's 201 body."""
    if not isinstance(document, dict):
        raise BadResponse("expected a Pod object")
    pod_id = document.get("id")
    if not isinstance(pod_id, str) or not pod_id.strip():
        raise BadResponse("the created pod has no id")
    return pod_id


def vm_of(pod: Pod) -> str | None:
    """The gpuprov VM a pod belongs to, from its name `gpuprov-<vm>`; None for other pods and
    for one whose env marker names a different VM (renamed by hand: not ours to touch)."""
    if not pod.name.startswith(VM_LABEL_PREFIX) or len(pod.name) == len(VM_LABEL_PREFIX):
        return None
    vm = pod.name[len(VM_LABEL_PREFIX) :]
    marker = (pod.env or {}).get(VM_ENV)
    if isinstance(marker, str) and marker != vm:
        return None
    return vm


def observed(pod: Pod) -> Observed | None:
    """The normalized state of a pod; None once TERMINATED (gone).

    PROVISIONING/STARTING -> Pending; RUNNING with `ssh.direct` -> Running; RUNNING without it
    -> Pending (v2 reports RUNNING before the 22/tcp mapping exists); EXITED/ERROR -> Failed.
    """
    status = (pod.status or "").upper()
    if status == "TERMINATED":
        return None
    if status in ("EXITED", "ERROR"):
        return Observed(id=pod.id, status=InstanceStatus.FAILED, message=f"RunPod pod {status}")
    direct = pod.ssh.direct if pod.ssh else None
    if status == "RUNNING" and direct is not None:
        endpoint = SshEndpoint(host=direct.host, port=direct.port, user=direct.username or "root")
        return Observed(id=pod.id, status=InstanceStatus.RUNNING, ssh=endpoint)
    if status == "RUNNING":
        message = "RunPod pod RUNNING, ssh.direct not published yet"
    elif status in ("PROVISIONING", "STARTING"):
        message = f"RunPod pod {status}"
    else:
        message = f"RunPod pod status {pod.status!r} not understood; treated as pending"
    return Observed(id=pod.id, status=InstanceStatus.PENDING, message=message)


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
