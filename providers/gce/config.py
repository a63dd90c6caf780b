"""The `[providers.gce]` section for Google Compute Engine: project, zones, the machine-type
catalogue, what each VM gets (image, disk, network), credentials, timing hints and spot.

Credentials: `credentials_file` (a service-account JSON key) or, when unset, Application
Default Credentials (`google.auth.default`: $GOOGLE_APPLICATION_CREDENTIALS, gcloud's ADC file,
or the metadata server of a GCE/GKE host). Neither found: the cloud is skipped
(`MissingCredentials`). `base_url` and `billing_base_url` exist for tests and private endpoints.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from providers.base import Model
from providers.settings import ProviderSettings

ZONE_PATTERN = r"^[a-z]+-[a-z]+[0-9]+-[a-z]$"  # e.g. us-central1-a
NAME_PATTERN = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"  # GCE resource names (RFC 1035)
SKU_PATTERN = r"^[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}$"  # Cloud Billing SKU ids


class PriceComponent(Model):
    """One billed component of a machine: `quantity` units of whichever of `skus` serves the
    offer's region (e.g. 8 x the H100 GPU SKU of that geography)."""

    quantity: float = Field(gt=0, le=100_000)
    skus: list[str] = Field(min_length=1, max_length=50)

    @field_validator("skus")
    @classmethod
    def _sku_ids(cls, skus: list[str]) -> list[str]:
        for sku in skus:
            if not re.fullmatch(SKU_PATTERN, sku):
                raise ValueError(f"{sku!r} is not a Cloud Billing SKU id (like 'A1B2-C3D4-E5F6')")
        return skus


class GceMachineType(Model):
    """One machine type to offer. vCPUs, memory, the zones that have it and (for A2/A3/G2,
    whose GPUs come with the machine type) the GPUs themselves are read from the
    machineTypes and acceleratorTypes APIs at plan time, never typed in here."""

    machine_type: str = Field(pattern=NAME_PATTERN)  # e.g. "g2-standard-4"
    # N1 only: GPUs attached as guestAccelerators (A2/A3/G2 bring their own and reject these).
    accelerator_type: str | None = Field(default=None, pattern=NAME_PATTERN)  # "nvidia-tesla-t4"
    accelerator_count: int = Field(default=0, ge=0, le=16)
    gpu: str | None = None  # display name override; default: the acceleratorType's description
    gpu_memory_gb: float | None = Field(default=None, gt=0)  # per GPU, for offers; not in the API
    # The machine's hourly price as Cloud Billing Catalog SKUs: each component is a quantity
    # (1 machine's GPUs, vCPUs or GiB of RAM) and the SKU ids that may bill it, one per
    # geography (the one serving the offer's region is used). Unset: the offer has no price.
    price_skus: list[PriceComponent] = Field(default_factory=list, max_length=20)
    spot_price_skus: list[PriceComponent] = Field(default_factory=list, max_length=20)

    @model_validator(mode="after")
    def _accelerators_together(self) -> GceMachineType:
        if (self.accelerator_type is None) != (self.accelerator_count == 0):
            raise ValueError("accelerator_type and accelerator_count (> 0) go together (N1 only)")
        return self

    @property
    def key(self) -> str:
        """The catalogue entry's name in offer ids: the machine type, plus N1's GPUs."""
        if self.accelerator_type is None:
            return self.machine_type
        return f"{self.machine_type}+{self.accelerator_count}x{self.accelerator_type}"


def _default_catalogue() -> list[GceMachineType]:
    """Common GPU machine types; the API fills in sizes, GPUs and zones."""
    return [
        GceMachineType(machine_type="g2-standard-4"),  # 1 x L4
        GceMachineType(machine_type="g2-standard-48"),  # 4 x L4
        GceMachineType(machine_type="a2-highgpu-1g"),  # 1 x A100 40GB
        GceMachineType(machine_type="a2-highgpu-8g"),  # 8 x A100 40GB
        GceMachineType(machine_type="a2-ultragpu-8g"),  # 8 x A100 80GB
        GceMachineType(machine_type="a3-highgpu-8g"),  # 8 x H100 80GB
        GceMachineType(
            machine_type="n1-standard-8", accelerator_type="nvidia-tesla-t4", accelerator_count=1
        ),
    ]


class GceConfig(ProviderSettings):
    """Google Compute Engine settings."""

    project: str = Field(min_length=1)
    zones: list[str] = Field(default_factory=list)  # allow-list; empty: every zone
    machine_types: list[GceMachineType] = Field(default_factory=_default_catalogue)
    spot: bool = False  # also offer each machine type as Spot (provisioningModel SPOT)
    spot_termination_action: Literal["DELETE", "STOP"] = "DELETE"

    # What each VM gets. The image, unless the job names one (docs/clouds/gce.md: an image, an
    # image family or a machine image, as a URL or a path).
    image: str = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
    disk_size_gb: int = Field(default=200, ge=10, le=65_536)
    disk_type: str = Field(default="pd-balanced", pattern=NAME_PATTERN)
    network: str = "global/networks/default"
    subnetwork: str | None = None  # "regions/<region>/subnetworks/<name>" for custom VPCs
    external_ip: bool = True  # ONE_TO_ONE_NAT; False: SSH goes to the internal IP
    ssh_user: str = Field(default="gpuprov", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    ssh_source_ranges: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"], min_length=1)
    # Where a job's `ports` may be reached from (the VM's own `gpuprov-<vm>-ports` rule).
    ports_source_ranges: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"], min_length=1)
    service_account_email: str | None = None  # attached to the VM (scope cloud-platform)

    # Credentials: a service-account key file, else Application Default Credentials.
    credentials_file: str | None = None
    base_url: str = "https://compute.googleapis.com/compute/v1"
    billing_base_url: str = "https://cloudbilling.googleapis.com/v1"

    # Timing hints (seconds) for the core's waits, and the bounds of this adapter's own calls.
    boot_timeout: float = Field(default=1200.0, gt=0)
    delete_timeout: float = Field(default=600.0, gt=0)
    poll_interval: float = Field(default=10.0, gt=0)
    operation_timeout: float = Field(default=180.0, gt=0, le=270)  # create's operations.wait
    operation_poll_interval: float = Field(default=2.0, ge=0)  # pause when wait returns early
    request_timeout: float = Field(default=30.0, gt=0)
    price_cache_seconds: float = Field(default=6 * 3600.0, ge=0)

    @field_validator("zones")
    @classmethod
    def _zones(cls, zones: list[str]) -> list[str]:
        for zone in zones:
            if not re.fullmatch(ZONE_PATTERN, zone):
                raise ValueError(f"{zone!r} is not a zone name (like 'us-central1-a')")
        return zones

    @property
    def regions(self) -> list[str]:
        """The regions of the zone allow-list, in order, without repeats."""
        return list(dict.fromkeys(region_of(zone) for zone in self.zones))


def region_of(zone: str) -> str:
    """`us-central1-a` -> `us-central1`."""
    return zone.rsplit("-", 1)[0]
