"""The `[providers.vast]` section: Vast.ai credentials, regions and timing hints."""

from __future__ import annotations

from typing import ClassVar

from providers.settings import ApiKeySettings


class VastConfig(ApiKeySettings):
    """Vast.ai: the API key comes from `api_key`, `api_key_file` or $VAST_API_KEY."""

    API_KEY_ENV: ClassVar[str] = "VAST_API_KEY"
