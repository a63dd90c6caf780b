"""The `[providers.vast]` section: credentials from the setting, a named file or the
environment (never an implicit file), the registry's construction, and the defaults."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gpuprov.config import ProvidersSettings, load_settings
from providers import build_all
from providers.base import Location
from providers.settings import MissingCredentials
from providers.vast.cloud import VastCloud
from providers.vast.config import VastConfig
from tests.providers.vast import fixtures
from tests.providers.vast.conftest import vast_config


def test_no_key_anywhere_is_missing_credentials_naming_the_three_places():
    with pytest.raises(MissingCredentials) as caught:
        VastConfig().resolve_api_key(VastConfig.API_KEY_ENV, environ={})
    assert "VAST_API_KEY" in str(caught.value) and "api_key_file" in str(caught.value)


def test_the_registry_skips_vast_without_credentials(monkeypatch, tmp_path):
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # a ~/.vast_api_key must not be picked up
    (tmp_path / ".vast_api_key").write_text("implicit-key\n")
    built = build_all(ProvidersSettings(vast=VastConfig()))
    assert "vast" not in built.providers
    assert "VAST_API_KEY" in built.skipped["vast"]


def test_the_key_file_is_read_only_when_named(tmp_path):
    key_file = tmp_path / ".vast_api_key"
    key_file.write_text(f"  {fixtures.API_KEY}\n")
    config = VastConfig(api_key_file=str(key_file))
    assert config.resolve_api_key(VastConfig.API_KEY_ENV, environ={}) == fixtures.API_KEY
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(MissingCredentials):
        VastConfig(api_key_file=str(tmp_path / "empty")).resolve_api_key("VAST_API_KEY", {})


def test_setting_beats_file_beats_environment(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-file")
    env = {"VAST_API_KEY": "from-env"}
    assert (
        VastConfig(api_key="direct", api_key_file=str(key_file)).resolve_api_key(
            "VAST_API_KEY", env
        )
        == "direct"
    )
    assert VastConfig(api_key_file=str(key_file)).resolve_api_key("VAST_API_KEY", env) == (
        "from-file"
    )
    assert VastConfig().resolve_api_key("VAST_API_KEY", env) == "from-env"


async def test_the_registry_builds_the_adapter_from_the_section(vast_api):
    built = build_all(ProvidersSettings(vast=vast_config(api_key=fixtures.API_KEY, regions=["US"])))
    cloud = built.providers["vast"]
    assert isinstance(cloud, VastCloud) and cloud.name == "vast"
    await cloud.observe_region(Location(provider="vast", region="all"))
    assert vast_api.requests[0].headers["authorization"] == f"Bearer {fixtures.API_KEY}"
    await cloud.aclose()


def test_defaults_an_operator_can_rely_on():
    config = VastConfig()
    assert config.base_url == "https://console.vast.ai"
    assert (config.verified_only, config.min_reliability, config.ssh) == (True, 0.95, "direct")
    assert (config.disk_gb, config.max_offers) == (50.0, 10)
    assert config.image == "vastai/base-image:@vastai-automatic-tag"
    assert (config.boot_timeout, config.delete_timeout, config.poll_interval) == (1200, 300, 15)
    assert config.min_intervals.create == 4.5 and config.min_intervals.list_page == 1.0
    assert "sekrit" not in repr(VastConfig(api_key="sekrit"))


def test_gpu_names_extend_and_override_the_table():
    config = VastConfig(gpu_names={"RTX 4090": ["RTX 4090"], "H100": ["H100 SXM"]})
    table = config.gpu_name_table()
    assert table["rtx4090"] == ["RTX 4090"] and table["h100"] == ["H100 SXM"]
    assert table["a100"] == ["A100 PCIE", "A100 SXM4"]


@pytest.mark.parametrize(
    "bad",
    [{"disk_gb": 4}, {"min_reliability": 1.5}, {"ssh": "telnet"}, {"max_offers": 0}, {"x": 1}],
)
def test_impossible_settings_are_refused(bad):
    with pytest.raises(ValidationError):
        VastConfig(**bad)


def test_the_toml_section_and_environment_overrides(tmp_path):
    path = tmp_path / "gpuprov.toml"
    path.write_text(
        "[providers.vast]\n"
        'api_key_file = "~/.vast_api_key"\n'
        'regions = ["US", "CA"]\n'
        "datacenter_only = true\n"
        "[providers.vast.min_intervals]\n"
        "create = 6.0\n"
    )
    settings = load_settings(path, env={"GPUPROV_PROVIDERS__VAST__DISK_GB": "120"})
    vast = settings.providers.vast
    assert vast is not None
    assert (vast.regions, vast.datacenter_only, vast.disk_gb) == (["US", "CA"], True, 120.0)
    assert vast.min_intervals.create == 6.0 and vast.min_intervals.search == 6.0
    assert json.loads(vast.model_dump_json())["api_key"] is None
