"""The `[providers.aws]` section for AWS EC2: regions, the instance-type catalogue, the image,
SSH access, spot, credentials (the standard AWS chain) and timing hints.

Shapes (GPU model, count and memory, vCPUs, memory) are not configured: `plan` reads them from
EC2 DescribeInstanceTypes, and where a type is offered from DescribeInstanceTypeOfferings.
Credentials are never configured here either: the AWS chain (environment, shared credentials
and config files, SSO, container and instance roles) finds them, optionally for `profile`.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from providers.settings import ProviderSettings

# NVIDIA GPU instance types (x86_64) a training or inference job usually asks for. Where a type
# is not offered in a region, DescribeInstanceTypeOfferings says so and no offer is made there.
DEFAULT_INSTANCE_TYPES = [
    "g5.xlarge",
    "g5.12xlarge",
    "g5.48xlarge",
    "g6.xlarge",
    "g6.12xlarge",
    "g6e.xlarge",
    "g6e.12xlarge",
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "p5e.48xlarge",
    "p5en.48xlarge",
]
# The AWS Deep Learning Base AMI with the NVIDIA driver (Ubuntu 22.04): resolved per region,
# newest first, with DescribeImages (no SSM parameter lookup needed).
DEFAULT_IMAGE_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"

_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_AMI = re.compile(r"^ami-[0-9a-f]{8,17}$")


class AwsConfig(ProviderSettings):
    """AWS EC2 settings. Every field has a default: `[providers.aws]` alone enables the cloud
    in us-east-1 with the default catalogue, once the AWS chain finds credentials."""

    # Credentials: the standard chain, optionally for one named profile (~/.aws/config).
    profile: str | None = None
    # A stand-in endpoint for every AWS call (tests: moto on loopback). When set, pricing calls
    # go there too unless `pricing_endpoint_url` says otherwise: a test never reaches AWS.
    endpoint_url: str | None = None
    pricing_endpoint_url: str | None = None
    pricing_region: str = "us-east-1"  # the Price List API answers in us-east-1

    regions: list[str] = Field(default_factory=lambda: ["us-east-1"], min_length=1)
    # Optional allow-list of availability zones per region; a region not named here offers
    # every zone where EC2 says the instance type is offered.
    zones: dict[str, list[str]] = Field(default_factory=dict)
    instance_types: list[str] = Field(
        default_factory=lambda: list(DEFAULT_INSTANCE_TYPES), min_length=1
    )
    spot: bool = True  # also offer spot capacity (priced from DescribeSpotPriceHistory)

    # The image: a job's `image` (an AMI id, `resolve:ssm:<parameter>` or an AMI name), else an
    # AMI per region, else the newest AMI named `image_name`; names are looked up among the
    # images of `image_owner` for the instance type's architecture (DescribeImages, in prepare).
    images: dict[str, str] = Field(default_factory=dict)
    image_name: str = DEFAULT_IMAGE_NAME
    image_owner: str = "amazon"
    root_volume_gb: int = Field(default=200, ge=8, le=16384)  # gp3; raised to min_disk_gb

    ssh_user: str = "ubuntu"  # depends on the image: ubuntu for Ubuntu AMIs, ec2-user for AL2023
    ssh_cidrs: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"], min_length=1)
    # Where a job's `ports` may be reached from (rules in the VM's own security group).
    ports_cidrs: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"], min_length=1)
    # A key pair you already have in every region, used when a job brings no public key.
    # gpuprov never deletes it (cleanup deletes only the per-VM key pairs it imported).
    key_name: str | None = None

    # Timing hints: GPU AMIs boot in a few minutes; p5 capacity can take longer to start.
    boot_timeout: float = Field(default=900.0, gt=0)
    delete_timeout: float = Field(default=600.0, gt=0)
    poll_interval: float = Field(default=10.0, gt=0)
    request_timeout: float = Field(default=30.0, gt=0)  # seconds per HTTP read
    # How long the catalogue (types, offerings) and on-demand prices are reused between plans.
    cache_seconds: float = Field(default=3600.0, ge=0)

    @field_validator("regions")
    @classmethod
    def _regions_are_region_names(cls, regions: list[str]) -> list[str]:
        for region in regions:
            if not _REGION.match(region):
                raise ValueError(f"{region!r} is not an AWS region name (like us-east-1)")
        if len(set(regions)) != len(regions):
            raise ValueError("regions are listed more than once")
        return regions

    @field_validator("images")
    @classmethod
    def _images_are_ami_ids(cls, images: dict[str, str]) -> dict[str, str]:
        for region, image in images.items():
            if not _AMI.match(image):
                raise ValueError(f"images.{region}: {image!r} is not an AMI id (ami-...)")
        return images

    @field_validator("endpoint_url", "pricing_endpoint_url")
    @classmethod
    def _endpoint_is_http(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http(s) URL")
        return url

    @model_validator(mode="after")
    def _zones_name_configured_regions(self) -> AwsConfig:
        unknown = sorted(set(self.zones) - set(self.regions))
        if unknown:
            raise ValueError(f"zones names regions not in `regions`: {', '.join(unknown)}")
        for region, zones in self.zones.items():
            strays = [zone for zone in zones if not zone.startswith(region)]
            if strays:
                raise ValueError(f"zones.{region}: {', '.join(strays)} not in {region}")
        return self

    @property
    def pricing_endpoint(self) -> str | None:
        """Where GetProducts goes: its own setting, else the stand-in endpoint, else AWS."""
        return self.pricing_endpoint_url or self.endpoint_url
