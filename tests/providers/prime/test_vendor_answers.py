"""Answers the vendor document declares, over respx, read as Prime means them: a 422 on a call
made of our own parameters, and availability items whose price is no price."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from providers.base import InstanceSpec, Location, ResourceRequest
from providers.errors import ErrorKind, ProviderError
from providers.prime.cloud import PrimeCloud
from providers.prime.config import PrimeConfig
from tests.providers.prime import bodies
from tests.providers.prime.fake_api import API_KEY, BASE_URL

VM = "train-a1-n0-ce4389"
HERE = Location(provider="prime", region="canada", zone="CANADA-1")
# The document's `ErrorResponse`, its only body for a 422 ("Invalid request data").
INVALID_REQUEST_DATA = {"errors": [{"param": "offset", "details": "Input should be >= 0"}]}


def adapter(method: str, path: str, response: httpx.Response) -> PrimeCloud:
    router = respx.Router(base_url=BASE_URL, assert_all_called=True)
    router.route(method=method, path=path).mock(return_value=response)
    transport = httpx.MockTransport(router.async_handler)
    return PrimeCloud(PrimeConfig(), api_key=API_KEY, transport=transport)


async def test_a_422_on_availability_fails_plan_over_to_other_clouds_not_the_job():
    cloud = adapter(
        "GET", "/api/v1/availability/gpus", httpx.Response(422, json=INVALID_REQUEST_DATA)
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.plan(ResourceRequest(gpu="H100"))
    assert caught.value.kind is ErrorKind.FAILED
    assert "offset: Input should be >= 0" in caught.value.message


async def test_a_422_on_the_pod_list_is_failed_so_a_wait_tears_down_and_a_teardown_goes_on():
    cloud = adapter("GET", "/api/v1/pods/", httpx.Response(422, json=INVALID_REQUEST_DATA))
    with pytest.raises(ProviderError) as caught:
        await cloud.observe(HERE, VM)
    assert caught.value.kind is ErrorKind.FAILED


async def test_a_422_on_delete_is_failed_not_gone_and_not_an_abort():
    cloud = adapter("DELETE", "/api/v1/pods/pod-1", httpx.Response(422, json=INVALID_REQUEST_DATA))
    with pytest.raises(ProviderError) as caught:
        await cloud.delete(HERE, VM, ["pod-1"])
    assert caught.value.kind is ErrorKind.FAILED


async def test_a_422_on_the_key_list_at_prepare_is_failed():
    listing = httpx.Response(200, json=bodies.availability(bodies.HYPERSTACK_H100))
    [offer] = await adapter("GET", "/api/v1/availability/gpus", listing).plan(ResourceRequest())
    cloud = adapter("GET", "/api/v1/ssh_keys/", httpx.Response(422, json=INVALID_REQUEST_DATA))
    spec = InstanceSpec(
        vm=VM, job="train", node_index=0, attempt=1, ssh_public_key=bodies.PUBLIC_KEY
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.prepare(offer, spec)
    assert caught.value.kind is ErrorKind.FAILED


def priced(amount: Any) -> httpx.Response:
    item = {**bodies.HYPERSTACK_H100, "prices": {**bodies.HYPERSTACK_H100["prices"]}}
    item["prices"]["onDemand"] = amount
    # json.dumps writes inf and nan as Infinity and NaN, which Python's JSON reader (and so
    # httpx) reads back: a cloud's answer can carry them.
    body = json.dumps(bodies.availability(item))
    return httpx.Response(200, content=body, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(
    "amount", [1e308, 2**64, float("inf"), float("nan"), -1.9, 10_000.01], ids=str
)
async def test_an_absurd_price_leaves_the_offer_unpriced(amount):
    cloud = adapter("GET", "/api/v1/availability/gpus", priced(amount))
    [offer] = await cloud.plan(ResourceRequest())  # the offer stays; only its price goes
    assert offer.price is None


async def test_a_dear_but_real_price_is_kept():
    cloud = adapter("GET", "/api/v1/availability/gpus", priced(9_999.0))
    [offer] = await cloud.plan(ResourceRequest())
    assert offer.price is not None and offer.price.amount == 9_999.0
