"""The `[providers.runpod]` section: RunPod credentials, where pods may go, and timing hints.

```toml
[providers.runpod]
# api_key_file = "~/.runpod/api-key"        # or api_key, or $RUNPOD_API_KEY
cloud_types = ["SECURE"]                    # and/or "COMMUNITY"
data_centers = ["US-KS-2", "EU-RO-1"]       # allow-list; unset = every one the catalog lists
# image = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"
# disk_gb = 100                             # container disk, raised to the job's min_disk_gb
# min_cuda_version = "12.4"
```

RunPod's REST v2 (`https://api.runpod.io/v2/...`) is the only API used: REST v1 retires on
15 Nov 2026 and GraphQL early in 2027.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from providers.settings import ApiKeySettings, agent_only_over_ssh

CloudType = Literal["SECURE", "COMMUNITY"]

# A RunPod official image: it starts sshd and writes $PUBLIC_KEY to root's authorized_keys.
DEFAULT_IMAGE = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"


class RunPodConfig(ApiKeySettings):
    """RunPod: the API key comes from `api_key`, `api_key_file` or $RUNPOD_API_KEY."""

    API_KEY_ENV: ClassVar[str] = "RUNPOD_API_KEY"

    base_url: str = "https://api.runpod.io"
    # Each cloud type listed gets its own offers (and catalog call). SECURE is RunPod's own
    # data-centre hardware; COMMUNITY is hosted by third parties.
    cloud_types: list[CloudType] = Field(default_factory=lambda: ["SECURE"], min_length=1)
    # Data-centre ids (e.g. "US-KS-2") pods may be placed in; None means every one the
    # catalog lists. When set, the reconciler also sweeps these on every pass.
    data_centers: list[str] | None = None
    image: str = Field(default=DEFAULT_IMAGE, min_length=1)  # InstanceSpec.image wins
    disk_gb: int = Field(default=100, ge=1)  # container disk; raised to the job's min_disk_gb
    # Lowest host CUDA version, "major.minor"; scopes the catalog's availability and the pod.
    min_cuda_version: str | None = Field(default=None, pattern=r"^\d+\.\d+$")
    # With a per-VM key, also put the account's registered keys into the pod (read-only
    # GET /v2/account/ssh-keys), so people keep their own SSH access. The account's key set
    # is never written.
    include_account_ssh_keys: bool = True
    boot_timeout: float = Field(default=900.0, gt=0)  # image pulls take minutes
    delete_timeout: float = Field(default=300.0, gt=0)
    poll_interval: float = Field(default=10.0, gt=0)  # RunPod documents 60 requests/minute
    request_timeout: float = Field(default=30.0, gt=0)  # one HTTP call

    # The node agent is started over SSH once the machine runs (activities/bootstrap.py):
    # RunPod pods take no user data. Always on.
    ssh_bootstrap: bool = True

    @field_validator("ssh_bootstrap")
    @classmethod
    def _agent_over_ssh(cls, value: bool) -> bool:
        return agent_only_over_ssh(value, "RunPod pods take no user data")

    @field_validator("base_url")
    @classmethod
    def _no_trailing_slash(cls, value: str) -> str:
        return value.rstrip("/")
