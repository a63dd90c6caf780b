"""The `[providers.ssh]` section for Machines you own (SSH)."""

from __future__ import annotations

from providers.settings import ProviderSettings


class SshConfig(ProviderSettings):
    """Machines you own (SSH) settings."""
