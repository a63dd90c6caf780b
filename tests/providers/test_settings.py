"""providers/settings.py: capabilities_from hands a section's own timing hints to the core."""

from __future__ import annotations

import importlib

import pytest
from pydantic import SecretStr, ValidationError

from providers.base import Model
from providers.settings import ApiKeySettings, capabilities_from

# (config module, class, required fields, the section's default boot / delete / poll seconds)
DEFAULTS = [
    ("providers.aws.config", "AwsConfig", {}, (900.0, 600.0, 10.0)),
    ("providers.gce.config", "GceConfig", {"project": "p"}, (1200.0, 600.0, 10.0)),
    ("providers.lambdalabs.config", "LambdaConfig", {}, (1800.0, 900.0, 10.0)),
    ("providers.prime.config", "PrimeConfig", {}, (1800.0, 600.0, 15.0)),
    ("providers.runpod.config", "RunPodConfig", {}, (900.0, 300.0, 10.0)),
    ("providers.ssh.config", "SshConfig", {}, (120.0, 60.0, 5.0)),
    ("providers.vast.config", "VastConfig", {}, (1200.0, 300.0, 15.0)),
]


@pytest.mark.parametrize(("module", "name", "required", "timings"), DEFAULTS)
def test_each_clouds_own_defaults_reach_its_capabilities(module, name, required, timings):
    config = getattr(importlib.import_module(module), name)(**required)
    hints = capabilities_from(config)
    assert (hints.boot_timeout, hints.delete_timeout, hints.poll_interval) == timings
    assert hints.unsupported == [] and hints.node_agent is False and not hints.ssh_bootstrap


def test_configured_timings_and_what_the_cloud_cannot_do_are_carried():
    config = importlib.import_module("providers.vast.config").VastConfig(
        boot_timeout=61.5, delete_timeout=7, poll_interval=0.25
    )
    hints = capabilities_from(config, unsupported=("spot", "user_data"), node_agent=True)
    assert (hints.boot_timeout, hints.delete_timeout, hints.poll_interval) == (61.5, 7.0, 0.25)
    assert hints.unsupported == ["spot", "user_data"] and hints.node_agent is True


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("providers.prime.config", "PrimeConfig"),
        ("providers.runpod.config", "RunPodConfig"),
        ("providers.vast.config", "VastConfig"),
    ],
)
def test_clouds_without_usable_user_data_always_start_the_agent_over_ssh(module, name):
    config = getattr(importlib.import_module(module), name)
    assert config().ssh_bootstrap is True
    with pytest.raises(ValidationError, match="ssh_bootstrap cannot be false here"):
        config(ssh_bootstrap=False)


class _Vault(Model):
    token: SecretStr
    note: str = "not a secret"


class _Section(ApiKeySettings):
    """A section with secrets at every depth a config can have them."""

    vaults: list[_Vault] = []
    by_name: dict[str, _Vault] = {}


def test_secret_values_are_every_secret_of_a_section_at_any_depth():
    section = _Section(
        api_key=SecretStr(" top-level-key "),
        vaults=[_Vault(token=SecretStr("in-a-list"))],
        by_name={"a": _Vault(token=SecretStr("in-a-table")), "b": _Vault(token=SecretStr(""))},
    )
    assert section.secret_values() == ["top-level-key", "in-a-list", "in-a-table"]
    assert _Section().secret_values() == []
