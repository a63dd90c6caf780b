"""The `[providers.vast]` section: Vast.ai credentials, search filters, what to create, and
timing hints.

Vast.ai is a marketplace: a "region" here is the country of a listing (`geolocation`'s
two-letter code, e.g. `US`), and `regions` is an allow-list sent to the offer search. The API
key comes from `api_key`, `api_key_file` or $VAST_API_KEY, in that order. The key file the
`vastai` CLI writes (`~/.vast_api_key`, or `~/.config/vastai/vast_api_key` in newer versions)
is read only when `api_key_file` names it: nothing is picked up implicitly.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from providers.base import Model
from providers.settings import ApiKeySettings, agent_only_over_ssh

# Vast's own names for the GPUs a job most often asks for, keyed by the asked model with case,
# spaces, dashes and underscores removed. The offer search filters `gpu_name` by exact name, so
# "H100" has to be sent as every Vast variant of it. Names as listed by dstack's gpuhunt
# (src/gpuhunt/providers/vastai.py); extend or override with `gpu_names`.
DEFAULT_GPU_NAMES: dict[str, list[str]] = {
    "h100": ["H100 SXM", "H100 PCIE", "H100 NVL"],
    "h100nvl": ["H100 NVL"],
    "h200": ["H200", "H200 NVL"],
    "a100": ["A100 PCIE", "A100 SXM4"],
    "a800": ["A800 PCIE"],
    "l40s": ["L40S"],
    "l40": ["L40"],
    "l4": ["L4"],
    "a10": ["A10"],
    "a40": ["A40"],
    "v100": ["Tesla V100"],
    "t4": ["Tesla T4"],
    "p100": ["Tesla P100"],
    "p40": ["Tesla P40"],
}


class VastMinIntervals(Model):
    """Seconds between two calls to one endpoint from this worker. Vast enforces a minimum
    interval per endpoint and API key (429 "API requests too frequent"); pacing our own calls
    keeps a multi-node create or a paginated listing from tripping it. Defaults are the
    `x-rate-limit` thresholds of Vast's per-endpoint OpenAPI files, read as seconds."""

    search: float = Field(default=6.0, ge=0)  # POST /api/v0/bundles/ (10 per minute)
    create: float = Field(default=4.5, ge=0)  # PUT /api/v0/asks/{id}/
    list_page: float = Field(default=1.0, ge=0)  # GET /api/v1/instances/ (each page)
    destroy: float = Field(default=3.0, ge=0)  # DELETE /api/v0/instances/{id}/


class VastConfig(ApiKeySettings):
    """Vast.ai: the API key comes from `api_key`, `api_key_file` or $VAST_API_KEY."""

    API_KEY_ENV: ClassVar[str] = "VAST_API_KEY"

    base_url: str = "https://console.vast.ai"
    request_timeout: float = Field(default=30.0, gt=0)  # seconds per HTTP call

    # --- the offer search (POST /api/v0/bundles/)
    regions: list[str] | None = None  # country codes, e.g. ["US", "CA"]; None = anywhere
    verified_only: bool = True  # only machines Vast has verified
    datacenter_only: bool = False  # only listings Vast marks as datacenter hosts
    min_reliability: float | None = Field(default=0.95, ge=0, le=1)  # Vast's reliability score
    max_offers: int = Field(default=10, ge=1, le=100)  # offers one plan returns
    search_limit: int = Field(default=200, ge=1, le=1000)  # listings asked of Vast per plan
    gpu_names: dict[str, list[str]] = Field(default_factory=dict)  # added to DEFAULT_GPU_NAMES

    # --- what create asks for (PUT /api/v0/asks/{id}/)
    image: str = "vastai/base-image:@vastai-automatic-tag"  # Vast's documented default image
    disk_gb: float = Field(default=50.0, ge=8)  # Vast's minimum is 8 GB
    # direct: SSH straight to the host's public IP and mapped port (listings with at least one
    # direct port only); proxy: through Vast's SSH gateway (ssh_host:ssh_port).
    ssh: Literal["direct", "proxy"] = "direct"

    # --- timing hints (the core's wait bounds) and pacing
    boot_timeout: float = Field(default=1200.0, gt=0)  # image pulls on hosts can be slow
    delete_timeout: float = Field(default=300.0, gt=0)
    poll_interval: float = Field(default=15.0, gt=0)
    min_intervals: VastMinIntervals = Field(default_factory=VastMinIntervals)

    # The node agent is started over SSH once the machine runs (activities/bootstrap.py): what
    # a container is given (env, onstart) is readable through Vast's API, so no join token
    # goes there. Always on.
    ssh_bootstrap: bool = True

    @field_validator("ssh_bootstrap")
    @classmethod
    def _agent_over_ssh(cls, value: bool) -> bool:
        return agent_only_over_ssh(
            value, "a Vast container's env and onstart are readable through Vast's API"
        )

    def gpu_name_table(self) -> dict[str, list[str]]:
        """DEFAULT_GPU_NAMES with this section's `gpu_names` laid over it."""
        table = dict(DEFAULT_GPU_NAMES)
        table.update({normalise_gpu(name): names for name, names in self.gpu_names.items()})
        return table


def normalise_gpu(name: str) -> str:
    """The key of a GPU model in the name table: lower case, no spaces, dashes or underscores."""
    return "".join(ch for ch in name.lower() if ch not in " -_")
