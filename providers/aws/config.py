"""The `[providers.aws]` section for AWS EC2."""

from __future__ import annotations

from providers.settings import ProviderSettings


class AwsConfig(ProviderSettings):
    """AWS EC2 settings."""
