"""The `[providers.prime]` section: Prime Intellect credentials, regions and timing hints."""

from __future__ import annotations

from typing import ClassVar

from providers.settings import ApiKeySettings


class PrimeConfig(ApiKeySettings):
    """Prime Intellect: the API key comes from `api_key`, `api_key_file` or $PRIME_API_KEY."""

    API_KEY_ENV: ClassVar[str] = "PRIME_API_KEY"
