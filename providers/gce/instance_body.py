"""The `instances.insert` request body for one VM (Compute Engine REST v1 `Instance`).

- `machineType: zones/<z>/machineTypes/<type>`; N1 entries add `guestAccelerators`
  (A2/A3/G2 machine types include their GPUs and take none);
- the boot disk from the spec's image (else the configured one): `disks[0].initializeParams.
  sourceImage` for an image or image family, or `sourceMachineImage` (and no `disks`) for a
  machine image;
- `scheduling.onHostMaintenance: TERMINATE` (required for GPUs); Spot adds
  `provisioningModel: SPOT` and `instanceTerminationAction`;
- identity: `labels` (`gpuprov_vm`, `gpuprov_job`, the spec's labels) on the instance and its
  boot disk, the per-VM network tag in `tags.items`, and the full identity in metadata;
- metadata: `ssh-keys` (`<ssh_user>:<public key>`) and `user-data` (providers/userdata.py: the
  spec's cloud-init user data and the node's bootstrap, which cloud-init writes to a root-only
  file; cloud-init's GCE data source reads the `user-data` key on Ubuntu images).
  Metadata is readable by anyone who may read the instance (and by the VM itself), so the token
  is single-use and short-lived by design; it is never logged and never returned.
"""

from __future__ import annotations

from typing import Any

from providers.base import InstanceSpec, Offer
from providers.gce.auth import SCOPES
from providers.gce.config import GceConfig
from providers.gce.identity import VM_METADATA_KEY, network_tag, user_labels
from providers.node_agent import GCE_NOTICES
from providers.userdata import user_data

MAX_USER_DATA_BYTES = 256 * 1024  # Compute Engine's limit on one metadata value
MACHINE_IMAGES = "/machineImages/"  # the path segment of a machine image's URL


def instance_body(
    config: GceConfig, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec, name: str
) -> dict[str, Any]:
    zone = offer.zone
    labels = user_labels(spec.labels, spec.vm, spec.job)
    tag = prepared.get("network_tag")
    body: dict[str, Any] = {
        "name": name,
        "description": f"gpuprov {spec.vm}",
        "machineType": f"zones/{zone}/machineTypes/{offer.detail['machine_type']}",
        "labels": labels,
        "tags": {"items": [tag if isinstance(tag, str) and tag else network_tag(spec.vm)]},
        "networkInterfaces": [_network_interface(config)],
        "scheduling": _scheduling(config, bool(offer.detail.get("spot") or offer.spot)),
        "metadata": {"items": _metadata(config, spec)},
    }
    image = boot_image(spec.image or config.image)
    if MACHINE_IMAGES in image:
        # A machine image brings its own disks (and whatever else it holds); the fields above
        # override its properties, as instances.insert documents.
        body["sourceMachineImage"] = image
    else:
        body["disks"] = [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {
                    "sourceImage": image,
                    "diskSizeGb": str(config.disk_size_gb),
                    "diskType": f"zones/{zone}/diskTypes/{config.disk_type}",
                    "labels": labels,
                },
            }
        ]
    accelerator, count = offer.detail.get("accelerator_type"), offer.detail.get("accelerator_count")
    if isinstance(accelerator, str) and isinstance(count, int) and count > 0:
        body["guestAccelerators"] = [
            {
                "acceleratorType": f"zones/{zone}/acceleratorTypes/{accelerator}",
                "acceleratorCount": count,
            }
        ]
    if config.service_account_email:
        body["serviceAccounts"] = [{"email": config.service_account_email, "scopes": list(SCOPES)}]
    return body


def boot_image(image: str) -> str:
    """The image as instances.insert takes it: a URL or a path (`projects/<p>/global/images/
    <name>`, `.../images/family/<family>`, `.../machineImages/<name>`, or `global/...` for the
    project's own) as given; a bare name is an image of the project (`global/images/<name>`)."""
    image = image.strip()
    return image if "/" in image else f"global/images/{image}"


def _network_interface(config: GceConfig) -> dict[str, Any]:
    nic: dict[str, Any] = {"network": config.network}
    if config.subnetwork:
        nic["subnetwork"] = config.subnetwork
    if config.external_ip:
        nic["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
    return nic


def _scheduling(config: GceConfig, spot: bool) -> dict[str, Any]:
    if not spot:
        return {"onHostMaintenance": "TERMINATE", "automaticRestart": True}
    return {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
        "provisioningModel": "SPOT",
        "instanceTerminationAction": config.spot_termination_action,
    }


def _metadata(config: GceConfig, spec: InstanceSpec) -> list[dict[str, str]]:
    items = [{"key": VM_METADATA_KEY, "value": spec.vm}]
    if spec.ssh_public_key:
        items.append({"key": "ssh-keys", "value": f"{config.ssh_user}:{spec.ssh_public_key}"})
    if document := user_data(
        spec, max_bytes=MAX_USER_DATA_BYTES, cloud="GCE metadata", notices=GCE_NOTICES
    ):
        items.append({"key": "user-data", "value": document})
    return items
