"""The `[providers.lambda]` section: Lambda Cloud credentials, regions and timing hints."""

from __future__ import annotations

from typing import ClassVar

from providers.settings import ApiKeySettings


class LambdaConfig(ApiKeySettings):
    """Lambda Cloud: the API key comes from `api_key`, `api_key_file` or $LAMBDA_API_KEY."""

    API_KEY_ENV: ClassVar[str] = "LAMBDA_API_KEY"
