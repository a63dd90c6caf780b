"""Contract tests against Vast's own OpenAPI files (openapi-core): every path and body the
adapter sends is one Vast documents, and our response fixtures are ones it documents."""

from __future__ import annotations

import httpx
import pytest

from providers.base import InstanceSpec, Location, NodeBootstrap, ResourceRequest
from providers.errors import ProviderError
from providers.vast.cloud import VastCloud
from providers.vast.launch import ON_DEMAND
from tests.providers.vast import fixtures
from tests.providers.vast.conftest import vast_config
from tests.providers.vast.contract import (
    documented_example,
    request_violation,
    response_violation,
)
from tests.providers.vast.fake_api import FakeVastApi

HERE = Location(provider="vast", region="US")


@pytest.mark.parametrize("ssh", ["direct", "proxy"])
async def test_every_request_of_a_full_lifecycle_matches_vasts_documentation(router, ssh):
    api = FakeVastApi(listings=[fixtures.h100_listing(101, 20.0), fixtures.h100_listing(102, 21)])
    api.install(router)
    cloud = VastCloud(
        vast_config(ssh=ssh, regions=["US"], datacenter_only=True), api_key=fixtures.API_KEY
    )
    request = ResourceRequest(
        gpu="H100", gpus_per_node=8, min_vcpus=8, min_disk_gb=100, ports=[8888, 6006]
    )
    offer, _ = await cloud.plan(request)
    spec = InstanceSpec(
        vm="c-a1-n0-abc",
        job="c",
        node_index=0,
        attempt=1,
        image="nvidia/cuda:12.4.1-base-ubuntu22.04",
        ports=[8888, 6006],
        ssh_public_key="ssh-ed25519 AAAA k",
        user_data="echo hi",
        bootstrap=NodeBootstrap(api_url="https://api.example:8700", join_token="tok"),
    )
    await cloud.prepare(offer, spec)
    (instance_id,) = await cloud.create(offer, {}, spec)
    await cloud.observe(HERE, "c-a1-n0-abc")
    await cloud.observe_region(HERE)
    await cloud.delete(HERE, "c-a1-n0-abc", [instance_id, "999"])
    await cloud.aclose()

    assert {(r.method, r.url.path) for r in api.requests} == {
        ("POST", "/api/v0/bundles/"),
        ("PUT", "/api/v0/asks/101/"),
        ("GET", "/api/v1/instances/"),
        ("DELETE", f"/api/v0/instances/{instance_id}/"),
        ("DELETE", "/api/v0/instances/999/"),
    }
    assert api.violations == []
    (_, created), *_ = api.created
    assert created["image"] == "nvidia/cuda:12.4.1-base-ubuntu22.04"
    assert created["env"] == "-p 8888:8888 -p 6006:6006"


def test_the_judge_refuses_what_vast_would_refuse():
    """The validator can fail: a type neither the schema nor its example names, a create
    without an image, a path without its trailing slash."""
    url = f"{fixtures.BASE_URL}/api/v0/bundles/"
    bad_type = httpx.Request("POST", url, json={"type": "on_demand"})
    assert "on_demand" in (request_violation(bad_type) or "")
    no_image = httpx.Request("PUT", f"{fixtures.BASE_URL}/api/v0/asks/5/", json={"label": "x"})
    assert "image" in (request_violation(no_image) or "")
    no_slash = httpx.Request("GET", f"{fixtures.BASE_URL}/api/v1/instances")
    assert "not a Vast call" in (request_violation(no_slash) or "")
    assert request_violation(httpx.Request("POST", url, json={"limit": 5})) is None


def test_the_search_type_is_the_one_vasts_own_example_and_client_send():
    """search_offers.yaml contradicts itself (enum `ondemand`, example `on-demand`); Vast's own
    client sends `on-demand`, and so does the adapter. Both spellings pass the judge, and the
    adapter's is the example's."""
    url = f"{fixtures.BASE_URL}/api/v0/bundles/"
    assert documented_example("search_offers.yaml", "type") == ON_DEMAND == "on-demand"
    for spelling in ("on-demand", "ondemand"):
        assert request_violation(httpx.Request("POST", url, json={"type": spelling})) is None


@pytest.mark.parametrize(
    ("method", "path", "status", "body"),
    [
        ("POST", "/api/v0/bundles/", 200, {"offers": [fixtures.h100_listing(1, 2.0)]}),
        ("POST", "/api/v0/bundles/", 200, {"offers": [fixtures.listing(12345678)]}),
        ("PUT", "/api/v0/asks/1/", 200, {"success": True, "new_contract": 1234568}),
        ("PUT", "/api/v0/asks/1/", 400, fixtures.INVALID_ARGS_400),
        ("PUT", "/api/v0/asks/1/", 401, fixtures.AUTH_ERROR_401),
        ("PUT", "/api/v0/asks/1/", 403, fixtures.NOT_YOUR_OWN_403),
        ("PUT", "/api/v0/asks/1/", 404, fixtures.NO_SUCH_ASK_404),
        ("PUT", "/api/v0/asks/1/", 410, fixtures.NO_SUCH_ASK_410),
        ("PUT", "/api/v0/asks/1/", 429, fixtures.TOO_FREQUENT_429),
        ("GET", "/api/v1/instances/", 200, fixtures.page([fixtures.instance(1, "gpuprov-x")])),
        ("GET", "/api/v1/instances/", 200, fixtures.page([fixtures.booting(2, "gpuprov-x")], "t")),
        ("GET", "/api/v1/instances/", 400, fixtures.LIST_BAD_TOKEN_400),
        ("GET", "/api/v1/instances/", 401, fixtures.AUTH_ERROR_401),
        ("DELETE", "/api/v0/instances/1/", 200, fixtures.DESTROYED),
        ("DELETE", "/api/v0/instances/1/", 404, fixtures.DESTROY_NOT_FOUND_404),
        ("DELETE", "/api/v0/instances/1/", 429, fixtures.DESTROY_RATE_LIMITED_429),
    ],
)
def test_response_fixtures_match_the_documented_schemas(method, path, status, body):
    request_body = {"image": "x"} if method == "PUT" else {"limit": 1} if method == "POST" else None
    assert response_violation(method, path, status, body, request_body) is None


def test_the_schema_judge_catches_a_wrong_fixture():
    wrong = fixtures.page([fixtures.instance(1, "gpuprov-x", ssh_port="22")])
    assert response_violation("GET", "/api/v1/instances/", 200, wrong) is not None


async def test_a_wrong_key_is_credentials(router):
    FakeVastApi().install(router)
    cloud = VastCloud(vast_config(), api_key="not-the-key")
    with pytest.raises(ProviderError) as caught:
        await cloud.observe(HERE, "vm")
    assert caught.value.kind.value == "Credentials"
    await cloud.aclose()
