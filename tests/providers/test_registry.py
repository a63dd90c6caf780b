"""The cloud registry: a configured cloud without credentials is skipped, and says why — in
`build_all`, and through PlanOffers to `gpuprov offers` (the worker holds the credentials)."""

from __future__ import annotations

import tempfile

from pydantic import SecretStr
from temporalio.client import Client

from gpuprov.client import GpuprovClient
from gpuprov.config import FakeProviderConfig, ProvidersSettings, load_settings
from gpuprov.engine import build_worker, open_records
from providers import PROVIDER_IDS, build_all
from providers.base import ResourceRequest
from providers.fake import FakeCloud
from providers.runpod.config import RunPodConfig
from tests.helpers import fast_cloud
from workflows.offers import OffersQuery


def test_every_registered_cloud_has_a_config_section() -> None:
    settings = ProvidersSettings()
    for provider_id in PROVIDER_IDS:
        assert provider_id in ProvidersSettings.model_fields or any(
            field.alias == provider_id for field in ProvidersSettings.model_fields.values()
        ), provider_id
        assert settings.section(provider_id) is None  # absent unless configured


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
