"""The `[providers.gce]` section for Google Compute Engine."""

from __future__ import annotations

from providers.settings import ProviderSettings


class GceConfig(ProviderSettings):
    """Google Compute Engine settings."""
