"""Building Vast.ai request bodies: the offer search and the create call.

Field names and limits are from Vast's OpenAPI files (search_offers.yaml, create_instance.yaml):
`order` must hold exactly two `[field, direction]` pairs; `onstart` and `args` together are at
most 4,096 characters. `type` is `on-demand`: what Vast's own
client sends (vast-ai/vast-cli, `vastai/api/offers.py` `search_offers`, whose `offer_type` is
"One of 'on-demand', 'reserved', or 'bid'", default 'on-demand') and what search_offers.yaml's
own request example sends; only that file's enum spells it `ondemand`.

How a machine gets what the core hands over, since Vast runs Docker containers, not VMs with
cloud-init:
- `spec.ssh_public_key`: appended to /root/.ssh/authorized_keys by the `onstart` script.
- `spec.user_data`: a shell script (a `#cloud-config` document cannot run here), written to
  /root/gpuprov-user-data by the `onstart` script (base64, so no quoting can break it) and
  started in the background with its output in /var/log/gpuprov-user-data.log.
- `spec.image`: the container image (`image`), else the section's.
- `spec.ports`: published with Docker's `-p <port>:<port>` in `env` (the create call's
  documented form); the search asks for hosts with that many direct ports more.
- `spec.bootstrap`: not sent. `env` and `onstart` come back from the instance listing to
  anyone who can read the account, so the join token goes in neither: the core starts the
  node agent over SSH with a fresh token on its stdin (activities/bootstrap.py).
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Collection
from typing import Any

from providers.base import InstanceSpec, Offer, ResourceRequest
from providers.errors import BlockScope, ErrorKind, ProviderError
from providers.vast.config import VastConfig, normalise_gpu
from providers.vast.parse import number

SSH_PORT = 22
MAX_ONSTART_CHARS = 4096
MAX_LABEL_CHARS = 256
MAX_ASKS_PER_OFFER = 16  # nodes one offer can place on distinct listings
USER_DATA_PATH = "/root/gpuprov-user-data"
USER_DATA_LOG = "/var/log/gpuprov-user-data.log"

# The search's on-demand `type` (see the module docstring for why this spelling).
ON_DEMAND = "on-demand"


def runtype(config: VastConfig) -> str:
    return "ssh_direct" if config.ssh == "direct" else "ssh_proxy"


def disk_gb(config: VastConfig, request: ResourceRequest) -> float:
    """The disk create will ask for: the section's size, or more if the job needs more."""
    return max(config.disk_gb, request.min_disk_gb or 0.0)


def search_regions(config: VastConfig, request: ResourceRequest) -> list[str] | None:
    """Country codes to search in; None = anywhere; [] = nowhere this job may go."""
    allowed = [r.upper() for r in config.regions] if config.regions is not None else None
    if request.regions is None:
        return allowed
    asked = [r.upper() for r in request.regions if len(r) == 2 and r.isalpha()]
    return [r for r in asked if allowed is None or r in allowed]


def gpu_names(config: VastConfig, asked: str) -> list[str]:
    """Vast's exact names for an asked GPU model: the table's, plus the name as asked."""
    names = list(config.gpu_name_table().get(normalise_gpu(asked), []))
    for candidate in (asked.strip().replace("_", " "), asked.strip().replace("_", " ").upper()):
        if candidate and candidate not in names:
            names.append(candidate)
    return names


def search_body(
    config: VastConfig, request: ResourceRequest, regions: list[str] | None
) -> dict[str, Any]:
    """POST /api/v0/bundles/: rentable on-demand listings that fit one node, cheapest first."""
    disk = disk_gb(config, request)
    body: dict[str, Any] = {
        "rentable": {"eq": True},
        "rented": {"eq": False},
        "type": ON_DEMAND,
        "order": [["dph_total", "asc"], ["id", "asc"]],
        "limit": config.search_limit,
        # dph_total then includes storage for the disk create will ask for.
        "allocated_storage": disk,
        "disk_space": {"gte": disk},
    }
    if config.verified_only:
        body["verified"] = {"eq": True}
    if config.datacenter_only:
        body["datacenter"] = {"eq": True}
    if config.min_reliability is not None:
        body["reliability"] = {"gte": config.min_reliability}
    # A host publishes a container port on one of its direct ports: SSH (direct mode) takes
    # one, and each of the job's ports another.
    direct_ports = (1 if config.ssh == "direct" else 0) + len(job_ports(request.ports))
    if direct_ports:
        body["direct_port_count"] = {"gte": direct_ports}
    if request.gpus_per_node > 0:
        body["num_gpus"] = {"eq": request.gpus_per_node}
    if request.gpu is not None:
        body["gpu_name"] = {"in": gpu_names(config, request.gpu)}
    if request.min_vcpus:
        body["cpu_cores_effective"] = {"gte": request.min_vcpus}
    if regions is not None:
        body["geolocation"] = {"in": regions}
    return body


def check_spec(spec: InstanceSpec) -> None:
    """What Vast cannot carry, found before anything is made (prepare). Unavailable with
    provider scope: every Vast offer would fail the same way, another cloud may not."""
    if len(spec.label) > MAX_LABEL_CHARS:
        raise ProviderError(
            ErrorKind.INVALID_REQUEST, f"label longer than {MAX_LABEL_CHARS} characters"
        )
    if spec.user_data is not None and spec.user_data.lstrip().startswith("#cloud-config"):
        raise ProviderError(
            ErrorKind.UNAVAILABLE,
            "Vast runs containers without cloud-init: user_data must be a shell script",
            block_scope=BlockScope.PROVIDER,
        )
    length = len(onstart_script(spec) or "")
    if length > MAX_ONSTART_CHARS:
        raise ProviderError(
            ErrorKind.UNAVAILABLE,
            f"user_data and SSH key make an onstart script of {length} characters; "
            f"Vast allows {MAX_ONSTART_CHARS}",
            block_scope=BlockScope.PROVIDER,
        )


def onstart_script(spec: InstanceSpec) -> str | None:
    """The `onstart` commands: install the SSH key, then start the user data script."""
    lines: list[str] = []
    if spec.ssh_public_key and spec.ssh_public_key.strip():
        key = shlex.quote(spec.ssh_public_key.strip())
        lines += [
            "mkdir -p /root/.ssh && chmod 700 /root/.ssh",
            f"printf '%s\\n' {key} >> /root/.ssh/authorized_keys",
            "chmod 600 /root/.ssh/authorized_keys",
        ]
    if spec.user_data and spec.user_data.strip():
        encoded = base64.b64encode(spec.user_data.encode()).decode()
        runner = "" if spec.user_data.startswith("#!") else "bash "
        lines += [
            f"echo {encoded} | base64 -d > {USER_DATA_PATH} && chmod 700 {USER_DATA_PATH}",
            f"nohup {runner}{USER_DATA_PATH} > {USER_DATA_LOG} 2>&1 &",
        ]
    return "\n".join(lines) if lines else None


def create_body(config: VastConfig, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
    """PUT /api/v0/asks/{ask_id}/: the image, our label, the disk, SSH, start now or never
    (`cancel_unavail`: a listing that cannot start at once answers no_such_ask instead of
    leaving a contract that waits)."""
    body: dict[str, Any] = {
        "image": spec.image or _detail_text(offer, "image") or config.image,
        "label": spec.label,
        "disk": number(offer.detail.get("disk_gb")) or config.disk_gb,
        "runtype": _detail_text(offer, "runtype") or runtype(config),
        "target_state": "running",
        "cancel_unavail": True,
    }
    if (onstart := onstart_script(spec)) is not None:
        body["onstart"] = onstart
    if ports := job_ports(spec.ports):
        # Docker's -p flags in `env`, as create_instance.yaml documents: Vast maps each to a
        # public port of the host (the instance's `ports` say which).
        body["env"] = " ".join(f"-p {port}:{port}" for port in ports)
    return body


def job_ports(ports: list[int]) -> list[int]:
    """The job's ports to publish, once each; 22 is SSH's, which the runtype publishes."""
    return [port for port in dict.fromkeys(ports) if port != SSH_PORT]


def _detail_text(offer: Offer, key: str) -> str | None:
    value = offer.detail.get(key)
    return value if isinstance(value, str) and value else None


def ask_id(offer: Offer, node_index: int = 0, taken: Collection[int] = ()) -> int:
    """The listing node `node_index` of a job rents. A listing is one host's bundle and can be
    rented once, so node k > 0 takes the k-th of the offer's equivalent listings
    (`detail["ask_ids"]`, see `with_alternates`), leaving out those lately `taken` (they
    answered no_such_ask); an offer without enough of them is Unavailable before anything is
    made. An offer this adapter did not make is InvalidRequest."""
    asks = offer.detail.get("ask_ids", [offer.detail.get("ask_id")])
    if not isinstance(asks, list) or not asks or not all(_is_ask(a) for a in asks):
        raise ProviderError(
            ErrorKind.INVALID_REQUEST, f"offer {offer.id} has no Vast ask id in its detail"
        )
    asks = [asks[0], *(ask for ask in asks[1:] if ask not in taken)]  # its own listing first
    if node_index >= len(asks):
        raise ProviderError(
            ErrorKind.UNAVAILABLE,
            f"offer {offer.id} stands for {len(asks)} equivalent listing(s) at or under its "
            f"price; node {node_index} has none of its own",
        )
    return asks[node_index]


def _is_ask(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def with_alternates(offers: list[Offer]) -> None:
    """Give each offer the ask ids a multi-node job can rent under it: its own first, then
    every other listing of the same GPU model, count and region at no higher a price,
    cheapest first, so no node costs more than the offer's quote."""
    for offer in offers:
        alternates = [
            other.detail["ask_id"]
            for other in offers
            if other is not offer and _same_shape(other, offer) and _not_dearer(other, offer)
        ]
        offer.detail["ask_ids"] = [offer.detail["ask_id"], *alternates][:MAX_ASKS_PER_OFFER]


def _same_shape(one: Offer, other: Offer) -> bool:
    return (one.gpu_name, one.gpu_count, one.region) == (
        other.gpu_name,
        other.gpu_count,
        other.region,
    )


def _not_dearer(one: Offer, than: Offer) -> bool:
    return (
        one.price is not None and than.price is not None and one.price.amount <= than.price.amount
    )
