"""Compute Engine echoing a secret in an error: the access token the adapter signed with
(plan, behind `gpuprov offers`) or a node's join token (an insert's metadata) never reaches an
activity's failure, whole or in part, however long the cloud's words are."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import respx

from activities.cloud import CloudActivities, CreateInput
from providers.base import InstanceSpec, NodeBootstrap, Offer, ResourceRequest
from providers.gce.cloud import GceCloud
from tests.providers.gce import bodies
from tests.providers.gce.conftest import respx_cloud
from tests.providers.gce.fake_gce import BASE_URL
from tests.providers.scrubbing import activity_failure, assert_scrubbed, echoes, plan_failure

P = f"{BASE_URL}/projects/{bodies.PROJECT}"
ACCESS_TOKEN = "ya29.a0-test-access-token-0123456789"
JOIN_TOKEN = "join-token-gce-0123456789abcdef"


@pytest.fixture
def api() -> respx.MockRouter:
    return respx.MockRouter(assert_all_called=False)


@pytest.fixture
async def cloud(api: respx.MockRouter) -> AsyncIterator[GceCloud]:
    built = respx_cloud(api, ACCESS_TOKEN)
    yield built
    await built.aclose()


@pytest.mark.parametrize("words", echoes(ACCESS_TOKEN).values(), ids=list(echoes(ACCESS_TOKEN)))
async def test_the_access_token_echoed_at_plan_never_reaches_the_offers_failure(api, cloud, words):
    refusal = bodies.http_error(403, "forbidden", f"Bearer {words} lacks compute.machineTypes")
    api.get(url__startswith=P).mock(return_value=httpx.Response(403, json=refusal))
    failure = await plan_failure(cloud, ResourceRequest(gpu="H100", gpus_per_node=8))
    assert failure.type == "Credentials" and "forbidden" in failure.message
    assert_scrubbed(failure, ACCESS_TOKEN)


@pytest.mark.parametrize("words", echoes(JOIN_TOKEN).values(), ids=list(echoes(JOIN_TOKEN)))
async def test_metadata_echoed_by_an_insert_never_carries_the_join_token(api, cloud, words):
    message = f"Invalid value for field 'resource.metadata': {words}"
    api.post(url__startswith=f"{P}/zones/{bodies.ZONE}/instances").mock(
        return_value=httpx.Response(400, json=bodies.http_error(400, "invalid", message))
    )
    offer = Offer(
        id=f"gce/{bodies.ZONE}/a3-highgpu-8g",
        provider="gce",
        region="us-central1",
        zone=bodies.ZONE,
        instance_type="a3-highgpu-8g",
        detail={"machine_type": "a3-highgpu-8g", "spot": False},
    )
    node = InstanceSpec(
        vm=bodies.VM,
        job="train",
        node_index=0,
        attempt=1,
        bootstrap=NodeBootstrap(api_url="https://gpuprov.example", join_token=JOIN_TOKEN),
    )
    create = CreateInput(offer=offer, prepared={}, spec=node)
    failure = await activity_failure(CloudActivities({"gce": cloud}).create, create)
    assert failure.type == "InvalidRequest" and "resource.metadata" in failure.message
    assert_scrubbed(failure, JOIN_TOKEN, ACCESS_TOKEN)


async def test_the_adapter_names_the_tokens_it_signed_with(api, cloud) -> None:
    assert cloud.secrets() == []  # nothing signed yet
    api.get(url__startswith=P).mock(return_value=httpx.Response(200, json={"items": []}))
    await cloud.client.call("GET", f"{P}/zones", "list zones")
    assert cloud.secrets() == [ACCESS_TOKEN]
