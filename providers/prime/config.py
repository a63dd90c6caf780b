"""The `[providers.prime]` section: Prime Intellect credentials, filters, pod shape and timing.

Prime Intellect is a broker: one availability call lists offers from many upstream providers
(`runpod`, `hyperstack`, `dc_*`, ...), and a pod is created through Prime on one of them. The
filters here narrow which of those offers `plan` returns; every value is checked against the
vendor's OpenAPI document (tests/fixtures/openapi/prime-intellect/).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from providers.settings import ApiKeySettings, agent_only_over_ssh

DEFAULT_BASE_URL = "https://api.primeintellect.ai"
DEFAULT_IMAGE = "ubuntu_22_cuda_12"

# The `Regions` enum of the Compute API (availability `regions` filter and offer `region`).
PrimeRegion = Literal[
    "africa",
    "asia_south",
    "asia_northeast",
    "australia",
    "canada",
    "eu_east",
    "eu_north",
    "eu_west",
    "middle_east",
    "south_america",
    "united_states",
]
# The `SecurityType` enum: Prime's own "secure" data centres or the community marketplace.
PrimeSecurity = Literal["secure_cloud", "community_cloud"]


class PrimeConfig(ApiKeySettings):
    """Prime Intellect: the API key comes from `api_key`, `api_key_file` or $PRIME_API_KEY."""

    API_KEY_ENV: ClassVar[str] = "PRIME_API_KEY"

    # Paths carry `/api/v1` themselves (the vendor document's form), so this is scheme + host.
    base_url: str = DEFAULT_BASE_URL
    team_id: str | None = None  # create pods for this team (`team.teamId`) instead of the user
    # Allow-lists; None means any. Regions and security are sent to the API as filters,
    # countries (as the API reports them, e.g. "US") and upstream providers are applied here.
    regions: list[PrimeRegion] | None = None
    countries: list[str] | None = None
    upstream_providers: list[str] | None = None  # e.g. ["hyperstack", "dc_roan"]
    security: PrimeSecurity | None = None
    # Pod shape: an `EnvironmentTypeEnum` image (a job's `image`, one of the same, wins), and
    # an optional disk size; without it each offer's default disk is used. vCPUs and memory are
    # always the offer's defaults.
    image: str = DEFAULT_IMAGE
    disk_gb: int | None = Field(default=None, gt=0)
    # Timing hints: pods are PROVISIONING, then ACTIVE while their image installs.
    boot_timeout: float = Field(default=1800.0, gt=0)
    delete_timeout: float = Field(default=600.0, gt=0)
    poll_interval: float = Field(default=15.0, gt=0)
    request_timeout: float = Field(default=30.0, gt=0)  # seconds per HTTP call
    max_pages: int = Field(default=50, ge=1)  # pages of 100 per listing before giving up

    # The node agent is started over SSH once the machine runs (activities/bootstrap.py):
    # Prime Intellect pods take no user data. Always on.
    ssh_bootstrap: bool = True

    @field_validator("ssh_bootstrap")
    @classmethod
    def _agent_over_ssh(cls, value: bool) -> bool:
        return agent_only_over_ssh(value, "Prime Intellect pods take no user data")
