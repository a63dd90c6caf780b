"""The `[providers.lambda]` section: Lambda Cloud credentials, regions, SSH key, image, who
reaches a job's ports, and timing hints.

```toml
[providers.lambda]
# api_key_file = "~/.lambda/api-key"    # or api_key, or $LAMBDA_API_KEY
regions = ["us-east-1", "us-south-2"]   # allow-list; unset = every region Lambda offers
ssh_key_name = "ops-team"               # account key for VMs whose spec carries no public key
# image_family = "lambda-stack-24-04"   # unset = Lambda's default (latest Lambda Stack)
```
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from providers.settings import ApiKeySettings


class LambdaConfig(ApiKeySettings):
    """Lambda Cloud: the API key comes from `api_key`, `api_key_file` or $LAMBDA_API_KEY."""

    API_KEY_ENV: ClassVar[str] = "LAMBDA_API_KEY"

    # The API root without `/api/v1` (the client appends it). cloud.lambdalabs.com is the
    # deprecated older host.
    base_url: str = "https://cloud.lambda.ai"
    # Regions offers may come from, e.g. ["us-east-1"]; None = every region Lambda lists. Also
    # the regions the orphan reconciler sweeps (sweep_regions).
    regions: list[str] | None = None
    # Lambda's launch takes exactly one account SSH key, by name. A VM whose spec carries
    # `ssh_public_key` gets its own key `gpuprov-<vm>` (removed by cleanup); any other VM
    # launches with this one. Neither = prepare fails with InvalidRequest.
    ssh_key_name: str | None = Field(default=None, min_length=1, max_length=64)
    # The machine image; an InstanceSpec.image overrides both (a UUID is an image id, anything
    # else a family). Unset = Lambda's default image.
    image_family: str | None = None
    image_id: str | None = None
    # Where a job's `ports` may be reached from: the source networks (CIDR) of the rules in
    # the VM's own firewall ruleset. SSH is not among them (the account's global ruleset).
    ports_source_networks: list[str] = Field(
        default_factory=lambda: ["0.0.0.0/0"], min_length=1, max_length=16
    )
    # Timing hints: an 8-GPU machine can take about 25 minutes to boot.
    boot_timeout: float = Field(default=1800.0, gt=0)
    delete_timeout: float = Field(default=900.0, gt=0)
    poll_interval: float = Field(default=10.0, gt=0)
    # Lambda allows one launch per 12 s per account; the adapter spaces its launches this far
    # apart (tests set 0).
    min_launch_interval: float = Field(default=12.0, ge=0)
    request_timeout: float = Field(default=30.0, gt=0)  # seconds per HTTP request
