"""The `[providers.runpod]` section: RunPod credentials, regions and timing hints."""

from __future__ import annotations

from typing import ClassVar

from providers.settings import ApiKeySettings


class RunPodConfig(ApiKeySettings):
    """RunPod: the API key comes from `api_key`, `api_key_file` or $RUNPOD_API_KEY."""

    API_KEY_ENV: ClassVar[str] = "RUNPOD_API_KEY"
