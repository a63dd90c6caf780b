"""plan: offers from the machineTypes/acceleratorTypes APIs, prices from the Billing Catalog
(matched by SKU id, region and usage type, else None), and the configuration."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import respx
from pydantic import ValidationError

from providers.base import ResourceRequest, compatibility_reasons
from providers.errors import ErrorKind, ProviderError
from providers.gce.auth import StaticToken
from providers.gce.cloud import GceCloud
from providers.gce.config import GceConfig, GceMachineType, PriceComponent
from providers.settings import MissingCredentials
from tests.providers.gce.fake_gce import (
    BASE_URL,
    BILLING_URL,
    GPU_SKU_AMERICAS,
    GPU_SKU_EMEA,
    LINK,
    PROJECT,
    FakeGce,
    gpu_sku,
    h100_accelerator,
    h100_machine,
)

P = f"{BASE_URL}/projects/{PROJECT}"
SKUS = f"{BILLING_URL}/services/6F81-5844-456A/skus"
T4 = "nvidia-tesla-t4"
SPOT_SKU = "2A1B-2C3D-4E5F"


def n1(zone: str) -> dict:
    return {
        "name": "n1-standard-8",
        "zone": zone,
        "guestCpus": 8,
        "memoryMb": 30720,
        "selfLink": f"{LINK}/zones/{zone}/machineTypes/n1-standard-8",
    }


def t4(zone: str, cards: int = 4) -> dict:
    return {
        "name": T4,
        "description": "NVIDIA T4",
        "zone": f"{LINK}/zones/{zone}",
        "maximumCardsPerInstance": cards,
    }


def query(request: httpx.Request) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(str(request.url)).query).items()}


@pytest.fixture
def api() -> respx.MockRouter:
    router = respx.MockRouter(assert_all_called=False)
    machines = {
        None: {
            "items": {
                "zones/us-central1-a": {"machineTypes": [h100_machine("us-central1-a")]},
                "zones/us-central1-b": {"machineTypes": [n1("us-central1-b")]},
            },
            "nextPageToken": "2",
        },
        "2": {
            "items": {
                "zones/europe-west4-a": {
                    "machineTypes": [h100_machine("europe-west4-a"), n1("europe-west4-a")]
                },
                "zones/asia-east1-a": {"machineTypes": [h100_machine("asia-east1-a")]},
                "zones/us-east4-c": {"warning": {"code": "NO_RESULTS_ON_PAGE"}},
            }
        },
    }
    router.get(url__startswith=f"{P}/aggregated/machineTypes").mock(
        side_effect=lambda r: httpx.Response(200, json=machines[query(r).get("pageToken")])
    )
    accelerators = {
        "zones/us-central1-a": {"acceleratorTypes": [h100_accelerator("us-central1-a")]},
        "zones/us-central1-b": {"acceleratorTypes": [t4("us-central1-b")]},
        "zones/europe-west4-a": {
            "acceleratorTypes": [h100_accelerator("europe-west4-a"), t4("europe-west4-a", 1)]
        },
    }
    router.get(url__startswith=f"{P}/aggregated/acceleratorTypes").mock(
        return_value=httpx.Response(200, json={"items": accelerators})
    )
    skus = [
        gpu_sku(GPU_SKU_AMERICAS, ["us-central1"], 1.0, "Americas"),
        gpu_sku(GPU_SKU_EMEA, ["europe-west4"], 1.25, "EMEA"),
        gpu_sku(SPOT_SKU, ["us-central1", "europe-west4"], 0.4, "Americas", spot=True),
    ]
    router.get(url__startswith=SKUS).mock(
        side_effect=lambda r: httpx.Response(
            200,
            json={"skus": skus[:2], "nextPageToken": "b"}
            if "pageToken" not in query(r)
            else {"skus": skus[2:]},
        )
    )
    return router


def catalogue() -> list[GceMachineType]:
    gpu = PriceComponent(quantity=8, skus=[GPU_SKU_AMERICAS, GPU_SKU_EMEA])
    spot = PriceComponent(quantity=8, skus=[SPOT_SKU])
    return [
        GceMachineType(machine_type="a3-highgpu-8g", price_skus=[gpu], spot_price_skus=[spot]),
        GceMachineType(machine_type="n1-standard-8", accelerator_type=T4, accelerator_count=2),
    ]


@pytest.fixture
async def make(api: respx.MockRouter) -> AsyncIterator:
    built: list[GceCloud] = []

    def make_cloud(**overrides) -> GceCloud:
        settings = {
            "zones": ["us-central1-a", "us-central1-b", "europe-west4-a"],
            "machine_types": catalogue(),
        }
        settings.update(overrides)
        config = FakeGce().config(**settings)
        transport = httpx.MockTransport(api.async_handler)
        cloud = GceCloud(
            config, tokens=StaticToken("t"), http=httpx.AsyncClient(transport=transport)
        )
        built.append(cloud)
        return cloud

    yield make_cloud
    for cloud in built:
        await cloud.aclose()


async def test_offers_come_from_the_api_in_allowed_zones_cheapest_first(api, make):
    offers = await make().plan(ResourceRequest())
    assert [(o.id, o.price.amount if o.price else None) for o in offers] == [
        ("gce/us-central1-a/a3-highgpu-8g", 8.0),
        ("gce/europe-west4-a/a3-highgpu-8g", 10.0),
        ("gce/us-central1-b/n1-standard-8+2xnvidia-tesla-t4", None),
    ]  # asia-east1-a is not allowed; europe-west4-a allows only 1 T4 per instance
    h100, _, n1_offer = offers
    assert (h100.gpu_name, h100.gpu_count, h100.vcpus, h100.memory_gb) == (
        "NVIDIA H100 80GB",
        8,
        208,
        1872.0,
    )
    assert (h100.region, h100.zone, h100.disk_gb) == ("us-central1", "us-central1-a", 200.0)
    assert h100.detail == {
        "machine_type": "a3-highgpu-8g",
        "accelerator_type": None,
        "accelerator_count": 0,
        "spot": False,
    }
    assert (n1_offer.gpu_name, n1_offer.gpu_count) == ("NVIDIA T4", 2)
    assert h100.price.source.startswith("cloudbilling.googleapis.com")
    assert compatibility_reasons(h100, ResourceRequest(gpu="H100", gpus_per_node=8)) == []
    machine_filter = query(api.calls[0].request)["filter"]
    assert machine_filter == '(name = "a3-highgpu-8g") OR (name = "n1-standard-8")'


async def test_without_a_zone_list_every_zone_that_has_the_type_is_offered(make):
    offers = await make(zones=[]).plan(ResourceRequest())
    assert "gce/asia-east1-a/a3-highgpu-8g" in {o.id for o in offers}


async def test_spot_offers_use_the_preemptible_skus(make):
    offers = await make(spot=True).plan(ResourceRequest(spot=True))
    spot = {o.id: o for o in offers if o.spot}
    quote = spot["gce/us-central1-a/a3-highgpu-8g/spot"].price
    assert quote is not None and quote.amount == pytest.approx(3.2)
    assert spot["gce/us-central1-a/a3-highgpu-8g/spot"].detail["spot"] is True


async def test_a_sku_that_does_not_serve_the_region_gives_no_price(make):
    only_americas = PriceComponent(quantity=8, skus=[GPU_SKU_AMERICAS])
    entry = GceMachineType(machine_type="a3-highgpu-8g", price_skus=[only_americas])
    offers = {o.id: o.price for o in await make(machine_types=[entry]).plan(ResourceRequest())}
    assert offers["gce/us-central1-a/a3-highgpu-8g"] is not None
    assert offers["gce/europe-west4-a/a3-highgpu-8g"] is None


async def test_usage_type_and_unknown_skus_give_no_price(make):
    wrong_usage = GceMachineType(
        machine_type="a3-highgpu-8g",
        price_skus=[PriceComponent(quantity=8, skus=[SPOT_SKU])],  # a Preemptible SKU
    )
    unknown = GceMachineType(
        machine_type="a3-highgpu-8g",
        price_skus=[PriceComponent(quantity=8, skus=["FFFF-FFFF-FFFF"])],
    )
    for entry in (wrong_usage, unknown):
        offers = await make(machine_types=[entry]).plan(ResourceRequest())
        assert offers and all(o.price is None for o in offers)


async def test_a_billing_catalog_failure_leaves_offers_unpriced_not_missing(api, make):
    api.get(url__startswith=SKUS).mock(
        return_value=httpx.Response(
            403,
            json={
                "error": {
                    "code": 403,
                    "message": "Cloud Billing API has not been used in project 1",
                    "errors": [{"reason": "accessNotConfigured", "message": "disabled"}],
                }
            },
        )
    )
    offers = await make().plan(ResourceRequest())
    assert len(offers) == 3 and all(o.price is None for o in offers)


async def test_the_price_catalogue_is_cached(api, make):
    cloud = make()
    await cloud.plan(ResourceRequest())
    await cloud.plan(ResourceRequest())
    skus = [c for c in api.calls if str(c.request.url).startswith(SKUS)]
    assert len(skus) == 2  # two pages, read once


async def test_plan_errors_are_classified(api, make):
    api.get(url__startswith=f"{P}/aggregated/machineTypes").mock(
        return_value=httpx.Response(
            401, json={"error": {"code": 401, "errors": [{"reason": "authError"}]}}
        )
    )
    with pytest.raises(ProviderError) as caught:
        await make().plan(ResourceRequest())
    assert caught.value.kind is ErrorKind.CREDENTIALS


# ---------------------------------------------------------------- configuration


def test_config_needs_a_project_and_checks_its_zones_and_catalogue():
    with pytest.raises(ValidationError):
        GceConfig()
    with pytest.raises(ValidationError):
        GceConfig(project="p", zones=["us-central1"])  # a region is not a zone
    with pytest.raises(ValidationError):
        GceMachineType(machine_type="n1-standard-8", accelerator_type=T4)  # count missing
    with pytest.raises(ValidationError):
        PriceComponent(quantity=1, skus=["not-a-sku"])
    config = GceConfig(project="p", zones=["us-central1-a", "us-central1-b", "europe-west4-a"])
    assert config.regions == ["us-central1", "europe-west4"]
    assert {m.machine_type for m in config.machine_types} >= {"a3-highgpu-8g", "g2-standard-4"}


def test_no_credentials_is_missing_credentials_with_how_to_fix(monkeypatch):
    import google.auth
    from google.auth import exceptions

    def no_adc(**_kwargs):
        raise exceptions.DefaultCredentialsError("Could not automatically determine credentials")

    monkeypatch.setattr(google.auth, "default", no_adc)
    with pytest.raises(MissingCredentials, match="credentials_file"):
        GceCloud(GceConfig(project="p"))


def test_an_unreadable_credentials_file_is_missing_credentials(tmp_path):
    path = tmp_path / "key.json"
    path.write_text("{not json")
    with pytest.raises(MissingCredentials, match="cannot read credentials_file"):
        GceCloud(GceConfig(project="p", credentials_file=str(path)))
    with pytest.raises(MissingCredentials):
        GceCloud(GceConfig(project="p", credentials_file=str(tmp_path / "absent.json")))


async def test_the_registry_builds_gce_from_its_section(monkeypatch):
    import google.auth

    from gpuprov.config import ProvidersSettings
    from providers import build_all

    class Credentials:
        valid, token = True, "adc-token"

    monkeypatch.setattr(google.auth, "default", lambda **_: (Credentials(), "p"))
    built = build_all(ProvidersSettings(gce=GceConfig(project="p")))
    assert isinstance(built.providers["gce"], GceCloud)
    assert await built.providers["gce"].client._tokens.token() == "adc-token"
    await built.providers["gce"].aclose()


async def test_google_tokens_refresh_in_a_thread_through_the_httpx_transport():
    import threading

    from providers.gce.auth import GoogleTokens, HttpxRequest

    class Credentials:
        valid, token = False, None
        refreshed_in: list[str] = []

        def refresh(self, request: HttpxRequest) -> None:
            self.refreshed_in.append(threading.current_thread().name)
            with respx.mock(base_url="https://oauth2.test") as mock:
                mock.post("/token").respond(json={"access_token": "fresh", "expires_in": 3600})
                response = request("https://oauth2.test/token", method="POST", body=b"grant")
            assert response.status == 200 and b"fresh" in response.data
            self.valid, self.token = True, "fresh"

    credentials = Credentials()
    tokens = GoogleTokens(credentials)
    assert await tokens.token() == "fresh"
    assert await tokens.token() == "fresh"  # still valid: no second refresh
    assert len(credentials.refreshed_in) == 1
    assert credentials.refreshed_in[0] != threading.current_thread().name
    await tokens.aclose()


async def test_a_sku_priced_at_zero_gives_no_price(api, make):
    free = gpu_sku(GPU_SKU_AMERICAS, ["us-central1"], 0.0, "Americas")
    api.get(url__startswith=SKUS).mock(return_value=httpx.Response(200, json={"skus": [free]}))
    offers = {o.id: o.price for o in await make().plan(ResourceRequest())}
    assert offers["gce/us-central1-a/a3-highgpu-8g"] is None
