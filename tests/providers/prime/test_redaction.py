"""Prime echoing the API key in an error (its `detail`, a validation list, a plain-text page):
the key never reaches the failure of the plan activity (behind `gpuprov offers`) or of create,
whole or in part, however long the cloud's words are."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import respx

from activities.cloud import CloudActivities, CreateInput
from providers.base import InstanceSpec, Offer, ResourceRequest
from providers.prime.cloud import PrimeCloud
from providers.prime.config import PrimeConfig
from tests.providers.prime.fake_api import API_KEY, BASE_URL
from tests.providers.scrubbing import activity_failure, assert_scrubbed, echoes, plan_failure

ECHOES = echoes(API_KEY)
OFFER = Offer(
    id="prime/hyperstack/CANADA-1/n3-H100x1/1xH100_80GB",
    provider="prime",
    region="canada",
    instance_type="n3-H100x1",
    detail={
        "cloud_id": "n3-H100x1",
        "gpu_type": "H100_80GB",
        "gpu_count": 1,
        "socket": "PCIe",
        "provider_type": "hyperstack",
    },
)


def answering(method: str, path: str, response: httpx.Response) -> PrimeCloud:
    router = respx.Router(base_url=BASE_URL, assert_all_called=False)
    router.route(method=method, path=path).mock(return_value=response)
    transport = httpx.MockTransport(router.async_handler)
    return PrimeCloud(PrimeConfig(), api_key=API_KEY, transport=transport)


def shapes(words: str) -> list[tuple[int, dict[str, Any] | str]]:
    """Prime's error shapes, each carrying `words`."""
    return [
        (401, {"detail": words}),
        (422, {"detail": [{"loc": ["body", "pod", "name"], "msg": words, "type": "x"}]}),
        (400, {"errors": [{"param": "pod", "details": words}]}),
        (502, f"<html><body>{words}</body></html>"),
    ]


def response(status: int, body: dict[str, Any] | str) -> httpx.Response:
    if isinstance(body, str):
        return httpx.Response(status, text=body)
    return httpx.Response(status, json=body)


@pytest.mark.parametrize("words", ECHOES.values(), ids=list(ECHOES))
async def test_a_key_echoed_at_plan_never_reaches_the_offers_failure(words):
    for status, body in shapes(words):
        cloud = answering("GET", "/api/v1/availability/gpus", response(status, body))
        try:
            failure = await plan_failure(cloud, ResourceRequest())
        finally:
            await cloud.aclose()
        assert f"HTTP {status}" in failure.message
        assert_scrubbed(failure, API_KEY)


@pytest.mark.parametrize("words", ECHOES.values(), ids=list(ECHOES))
async def test_a_key_echoed_at_create_never_reaches_the_create_failure(words):
    cloud = answering("POST", "/api/v1/pods/", httpx.Response(401, json={"detail": words}))
    node = InstanceSpec(vm="train-a1-n0-ce4389", job="train", node_index=0, attempt=1)
    create = CreateInput(offer=OFFER, prepared={"image": "ubuntu_22_cuda_12"}, spec=node)
    try:
        failure = await activity_failure(CloudActivities({"prime": cloud}).create, create)
    finally:
        await cloud.aclose()
    assert failure.type == "Credentials"
    assert_scrubbed(failure, API_KEY)


def test_the_adapter_names_the_key_it_was_given() -> None:
    assert API_KEY in PrimeCloud(PrimeConfig(), api_key=API_KEY).secrets()
