"""Answers Vast's OpenAPI files declare, over respx, read as Vast means them: the search's 404
(an invalid or missing key) and listings whose price is no price."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from providers.base import ResourceRequest
from providers.errors import ErrorKind, ProviderError
from tests.providers.vast import fixtures

H100X8 = ResourceRequest(gpu="H100", gpus_per_node=8)
SEARCH = "/api/v0/bundles/"


async def test_a_404_from_the_search_is_an_invalid_key(cloud, vast_api):
    # search_offers.yaml: "404: Unauthorized - invalid or missing API key", {error, msg}.
    vast_api.script("POST", SEARCH, httpx.Response(404, json={"msg": "Invalid user key"}))
    with pytest.raises(ProviderError) as caught:
        await cloud.plan(H100X8)
    assert caught.value.kind is ErrorKind.CREDENTIALS
    assert "Invalid user key" in caught.value.message


def listed(dph_total: Any) -> httpx.Response:
    # json.dumps writes inf and nan as Infinity and NaN, which Python's JSON reader (and so
    # httpx) reads back: a host's listing can carry them.
    body = json.dumps({"offers": [fixtures.h100_listing(101, dph_total)]})
    return httpx.Response(200, content=body, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(
    "dph_total", [1e308, 2**64, float("inf"), float("nan"), -2.5, 80_000.01], ids=str
)
async def test_an_absurd_price_leaves_the_listing_unpriced(cloud, vast_api, dph_total):
    vast_api.script("POST", SEARCH, listed(dph_total))
    [offer] = await cloud.plan(H100X8)  # the offer stays; only its price goes
    assert offer.price is None


async def test_a_dear_but_real_price_for_eight_gpus_is_kept(cloud, vast_api):
    vast_api.script("POST", SEARCH, listed(79_999.0))
    [offer] = await cloud.plan(H100X8)
    assert offer.price is not None and offer.price.amount == 79_999.0
