"""The `[providers.runpod]` section: defaults, validation, and where the key comes from."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from providers.runpod.config import DEFAULT_IMAGE, RunPodConfig


def test_defaults_target_rest_v2_on_secure_cloud():
    config = RunPodConfig()
    assert config.base_url == "https://api.runpod.io"
    assert config.cloud_types == ["SECURE"]
    assert config.data_centers is None
    assert config.image == DEFAULT_IMAGE
    assert (config.boot_timeout, config.delete_timeout, config.poll_interval) == (900, 300, 10)


def test_base_url_loses_its_trailing_slash():
    assert RunPodConfig(base_url="http://127.0.0.1:4010/").base_url == "http://127.0.0.1:4010"


@pytest.mark.parametrize(
    "settings",
    [
        {"cloud_types": ["ALL"]},
        {"cloud_types": []},
        {"min_cuda_version": "12"},
        {"disk_gb": 0},
        {"poll_interval": 0},
        {"image": ""},
        {"region": "US-KS-2"},  # unknown keys are refused, not ignored
    ],
)
def test_bad_settings_are_refused(settings):
    with pytest.raises(ValidationError):
        RunPodConfig(**settings)


def test_the_key_comes_from_the_setting_the_file_or_the_environment(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert RunPodConfig(api_key="direct").resolve_api_key("RUNPOD_API_KEY", {}) == "direct"
    by_file = RunPodConfig(api_key_file=str(key_file))
    assert by_file.resolve_api_key("RUNPOD_API_KEY", {}) == "from-file"
    by_env = RunPodConfig().resolve_api_key("RUNPOD_API_KEY", {"RUNPOD_API_KEY": "from-env"})
    assert by_env == "from-env"
