"""The cloud registry: a configured cloud without credentials is skipped, and says why — in
`build_all`, and through PlanOffers to `gpuprov offers` (the worker holds the credentials)."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from pydantic import SecretStr
from temporalio.client import Client

import providers
from gpuprov import config
from gpuprov.config import ConfigError, ProvidersSettings, load_settings
from gpuprov.contract import OffersQuery
from gpuprov.engine.worker import build_worker, open_records
from gpuprov.sdk.client import GpuprovClient
from providers import PROVIDER_IDS, Cloud, build_all
from providers.base import ResourceRequest
from providers.fake import FakeCloud
from providers.fake.config import FakeProviderConfig
from providers.runpod.config import RunPodConfig
from providers.settings import ApiKeySettings, MissingCredentials
from tests.helpers import fast_cloud


def test_every_registered_cloud_has_a_config_section() -> None:
    settings = ProvidersSettings()
    for provider_id in PROVIDER_IDS:
        assert provider_id in ProvidersSettings.model_fields or any(
            field.alias == provider_id for field in ProvidersSettings.model_fields.values()
        ), provider_id
        assert settings.section(provider_id) is None  # absent unless configured


class AcmeConfig(ApiKeySettings):
    """A cloud that exists only in this test: its section, as providers/acme/config.py."""

    region: str = "moon-1"


class AcmeCloud:
    """Its adapter, as providers/acme/cloud.py (only the constructor matters here)."""

    def __init__(self, section: AcmeConfig, **_: Any) -> None:
        self.key = section.resolve_api_key("ACME_API_KEY", environ={})
        self.region = section.region


ACME = Cloud("tests.providers.test_registry:AcmeCloud", "tests.providers.test_registry:AcmeConfig")


def test_a_registry_line_is_all_a_new_cloud_needs_to_be_configured_and_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(providers.CLOUDS, "acme", ACME)
    settings_model = config._providers_settings()
    sections = settings_model.model_validate({"acme": {"api_key": "k-1", "region": "mars-2"}})
    built = build_all(sections)
    acme = built.providers["acme"]
    assert isinstance(acme, AcmeCloud)
    assert (acme.key, acme.region) == ("k-1", "mars-2")
    assert sections.enabled_ids() == ["acme"]
    with pytest.raises(MissingCredentials):
        AcmeCloud(AcmeConfig())


def test_an_unknown_provider_section_is_still_named_in_the_error() -> None:
    with pytest.raises(ConfigError, match=r"providers\.acme: Extra inputs are not permitted"):
        load_settings(env={"GPUPROV_PROVIDERS__ACME__API_KEY": "k"})


def test_env_overrides_reach_every_registered_section() -> None:
    env = {f"GPUPROV_PROVIDERS__{pid.upper()}__ENABLED": "false" for pid in PROVIDER_IDS}
    env["GPUPROV_PROVIDERS__GCE__PROJECT"] = "p"  # the one section with a required setting
    sections = load_settings(env=env).providers
    for provider_id in PROVIDER_IDS:
        section = sections.section(provider_id)
        assert section is not None and section.enabled is False, provider_id


async def test_a_cloud_without_credentials_is_skipped_with_the_way_to_supply_them() -> None:
    settings = load_settings(env={"GPUPROV_PROVIDERS__RUNPOD__ENABLED": "true"})
    built = build_all(settings.providers)
    assert built.providers == {}
    assert "RUNPOD_API_KEY" in built.skipped["runpod"]


async def test_a_cloud_with_credentials_is_built() -> None:
    providers = ProvidersSettings(
        fake=FakeProviderConfig(), runpod=RunPodConfig(api_key=SecretStr("rp-test-key"))
    )
    built = build_all(providers)
    try:
        assert sorted(built.providers) == ["fake", "runpod"]
        assert built.skipped == {}
    finally:
        for provider in built.providers.values():
            await provider.aclose()


async def test_offers_say_which_clouds_were_skipped(client: Client, task_queue: str) -> None:
    cloud = FakeCloud(fast_cloud())
    skipped = {"runpod": "no API key: set RUNPOD_API_KEY, or api_key_file or api_key"}
    with tempfile.TemporaryDirectory() as data_dir:
        records = open_records(f"sqlite:///{data_dir}/gpuprov.db")
        worker = build_worker(
            client, task_queue, {"fake": cloud}, records, api_url="http://x", skipped=skipped
        )
        async with worker:
            query = OffersQuery(request=ResourceRequest(gpu="H100", gpus_per_node=8))
            result = await GpuprovClient(client, task_queue).offers(query)
            narrowed = OffersQuery(
                request=ResourceRequest(gpu="H100", gpus_per_node=8, providers=["fake"])
            )
            only_fake = await GpuprovClient(client, task_queue).offers(narrowed)
        records.db.dispose()
    await cloud.aclose()
    assert len(result.offers) == 3
    assert result.skipped == skipped
    assert only_fake.skipped == {}  # a cloud the query did not ask for is not mentioned
