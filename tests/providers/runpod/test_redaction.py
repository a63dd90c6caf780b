"""RunPod echoing a secret in a problem document: the API key never reaches the failure of the
plan activity (behind `gpuprov offers`) or of create, whole or in part, however long the
cloud's words are."""

from __future__ import annotations

import pytest
import respx

from activities.cloud import CloudActivities, CreateInput
from tests.providers.runpod import samples
from tests.providers.runpod.fake_api import FakeRunPod
from tests.providers.runpod.support import H100, SPEC, an_offer, problem_response, routed
from tests.providers.scrubbing import activity_failure, assert_scrubbed, echoes, plan_failure

ECHOES = echoes(samples.API_KEY)


@pytest.mark.parametrize("words", ECHOES.values(), ids=list(ECHOES))
async def test_a_key_echoed_at_plan_never_reaches_the_offers_failure(words):
    router = respx.MockRouter(base_url=samples.BASE_URL)
    echo = samples.problem(401, "Unauthorized", words)
    router.get("/v2/catalog/gpus").mock(return_value=problem_response(echo, 401))
    cloud = routed(router)
    try:
        failure = await plan_failure(cloud, H100)
    finally:
        await cloud.aclose()
    assert failure.type == "Credentials" and "RunPod 401" in failure.message
    assert_scrubbed(failure, samples.API_KEY)


@pytest.mark.parametrize("words", ECHOES.values(), ids=list(ECHOES))
async def test_a_key_echoed_at_create_never_reaches_the_create_failure(api: FakeRunPod, words):
    offer = await an_offer(api)
    router = respx.MockRouter(base_url=samples.BASE_URL)
    router.get("/v2/account/ssh-keys").respond(json={"keys": []})
    echo = samples.problem(401, "Unauthorized", words)
    router.post("/v2/pods").mock(return_value=problem_response(echo, 401))
    cloud = routed(router)
    try:
        activities = CloudActivities({"runpod": cloud})
        create = CreateInput(offer=offer, prepared={}, spec=SPEC)
        failure = await activity_failure(activities.create, create)
    finally:
        await cloud.aclose()
    assert failure.type == "Credentials"
    assert_scrubbed(failure, samples.API_KEY)


def test_the_adapter_names_the_key_it_was_given() -> None:
    assert samples.API_KEY in routed(respx.MockRouter(base_url=samples.BASE_URL)).secrets()
