"""Vast echoing a secret in an error: the API key (plan, behind `gpuprov offers`) or a node's
join token (create) never reaches an activity's failure, whole or in part, however long the
cloud's words are."""

from __future__ import annotations

import httpx
import pytest

from activities.cloud import CloudActivities, CreateInput
from providers.base import InstanceSpec, NodeBootstrap, ResourceRequest
from providers.vast.cloud import VastCloud
from tests.providers.scrubbing import activity_failure, assert_scrubbed, echoes, plan_failure
from tests.providers.vast import fixtures
from tests.providers.vast.fake_api import FakeVastApi

H100X8 = ResourceRequest(gpu="H100", gpus_per_node=8)
JOIN_TOKEN = "tok-0123456789-vast-secret"
KEY_ECHOES = echoes(fixtures.API_KEY)
TOKEN_ECHOES = echoes(JOIN_TOKEN)


@pytest.mark.parametrize("words", KEY_ECHOES.values(), ids=list(KEY_ECHOES))
async def test_a_key_echoed_at_plan_never_reaches_the_offers_failure(cloud, vast_api, words):
    echo = {"success": False, "error": "auth_error", "msg": words}
    vast_api.script("POST", "/api/v0/bundles/", httpx.Response(401, json=echo))
    failure = await plan_failure(cloud, H100X8)
    assert failure.type == "Credentials" and "auth_error" in failure.message
    assert_scrubbed(failure, fixtures.API_KEY)
    assert "api_key" not in str(vast_api.requests[0].url)  # the key only ever in a header


@pytest.mark.parametrize("words", KEY_ECHOES.values(), ids=list(KEY_ECHOES))
async def test_a_key_echoed_as_plain_text_is_scrubbed_too(cloud, vast_api, words):
    vast_api.script("POST", "/api/v0/bundles/", httpx.Response(429, text=words))
    failure = await plan_failure(cloud, H100X8)
    assert failure.type == "Transient"
    assert_scrubbed(failure, fixtures.API_KEY)


@pytest.mark.parametrize("words", TOKEN_ECHOES.values(), ids=list(TOKEN_ECHOES))
async def test_a_create_error_echoing_the_join_token_does_not_carry_it(
    cloud: VastCloud, vast_api: FakeVastApi, words: str
):
    vast_api.listings = [fixtures.h100_listing(101, 20.0)]
    (offer,) = await cloud.plan(H100X8)
    echo = {"success": False, "error": "invalid_args", "msg": f"bad env: {words}"}
    vast_api.script("PUT", "/api/v0/asks/101/", httpx.Response(400, json=echo))
    node = InstanceSpec(
        vm="job-a1-n0-abc123",
        job="job",
        node_index=0,
        attempt=1,
        bootstrap=NodeBootstrap(api_url="http://10.0.0.1:8700", join_token=JOIN_TOKEN),
    )
    create = CreateInput(offer=offer, prepared={}, spec=node)
    failure = await activity_failure(CloudActivities({"vast": cloud}).create, create)
    assert failure.type == "InvalidRequest" and "invalid_args" in failure.message
    assert_scrubbed(failure, JOIN_TOKEN, fixtures.API_KEY)


def test_the_adapter_names_the_key_it_was_given(cloud: VastCloud) -> None:
    assert fixtures.API_KEY in cloud.secrets()
