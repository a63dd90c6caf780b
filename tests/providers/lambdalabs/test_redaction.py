"""Lambda echoing a secret in an error: the API key (plan, behind `gpuprov offers`) or the
node's join token (create) never reaches an activity's failure, whole or in part, however long
the cloud's words are."""

from __future__ import annotations

import httpx
import pytest

from activities.cloud import CloudActivities, CreateInput
from providers.base import InstanceSpec, NodeBootstrap, ResourceRequest
from tests.providers.scrubbing import activity_failure, assert_scrubbed, echoes, plan_failure

from .fake_lambda import FakeLambda
from .fixtures import API_KEY, INVALID_API_KEY, error

JOIN_TOKEN = "join-token-lambda-0123456789abcdef"
OFFER_ID = "lambda/us-east-3/gpu_8x_h100_sxm5"


@pytest.mark.parametrize("words", echoes(API_KEY).values(), ids=list(echoes(API_KEY)))
async def test_a_key_echoed_at_plan_never_reaches_the_offers_failure(account: FakeLambda, words):
    body = INVALID_API_KEY | {"error": INVALID_API_KEY["error"] | {"message": words}}
    account.router.get("/instance-types").mock(return_value=httpx.Response(401, json=body))
    cloud = account.cloud()
    try:
        failure = await plan_failure(cloud, ResourceRequest())
    finally:
        await cloud.aclose()
    assert failure.type == "Credentials"
    assert "global/invalid-api-key" in failure.message
    assert_scrubbed(failure, API_KEY)


@pytest.mark.parametrize("words", echoes(JOIN_TOKEN).values(), ids=list(echoes(JOIN_TOKEN)))
async def test_user_data_echoed_at_create_never_carries_the_join_token(account, words):
    answer = error("global/invalid-parameters", f"user_data rejected: {words}", API_KEY)
    account.launch_answers[("us-east-3", "gpu_8x_h100_sxm5")] = (400, answer)
    cloud = account.cloud(ssh_key_name="ops-team")
    try:
        offer = next(o for o in await cloud.plan(ResourceRequest()) if o.id == OFFER_ID)
        spec = InstanceSpec(
            vm="train-a1-n0-abc123",
            job="train",
            node_index=0,
            attempt=1,
            bootstrap=NodeBootstrap(api_url="https://api.example", join_token=JOIN_TOKEN),
        )
        prepared = await cloud.prepare(offer, spec)
        activities = CloudActivities({"lambda": cloud})
        create = CreateInput(offer=offer, prepared=prepared, spec=spec)
        failure = await activity_failure(activities.create, create)
    finally:
        await cloud.aclose()
    assert failure.type == "InvalidRequest"
    assert "global/invalid-parameters" in failure.message
    assert_scrubbed(failure, JOIN_TOKEN, API_KEY)


def test_the_adapter_names_the_key_it_resolved_and_the_sections_secrets() -> None:
    cloud = FakeLambda().cloud()
    assert API_KEY in cloud.secrets()
