"""Contract: what the adapter sends, and the answers our fixtures stand for, against the vendor's
OpenAPI document (tests/fixtures/openapi/prime-intellect/, loaded by fake_api.contract())."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from providers.base import InstanceSpec, ResourceRequest
from providers.prime.cloud import PrimeCloud
from providers.prime.config import PrimeConfig
from tests.providers.prime import bodies
from tests.providers.prime.fake_api import (
    API_KEY,
    BASE_URL,
    FakePrime,
    request_violation,
    response_violation,
)

AUTH = {"Authorization": f"Bearer {API_KEY}"}
ALL_OFFERS = [
    bodies.HYPERSTACK_H100,
    bodies.RUNPOD_H100,
    bodies.DC_ROAN_H100X8,
    bodies.COMMUNITY_RTX4090,
    bodies.SOLD_OUT,
    bodies.PREPAID,
    bodies.UNPRICED,
]


def request(method: str, path: str, **kwargs: Any) -> httpx.Request:
    return httpx.Request(method, f"{BASE_URL}{path}", headers=AUTH, **kwargs)


async def test_every_call_of_every_primitive_is_in_the_vendor_document():
    prime = FakePrime(ALL_OFFERS)
    config = PrimeConfig(
        regions=["united_states", "canada"], security="secure_cloud", team_id="t-1", disk_gb=120
    )
    cloud = PrimeCloud(config, api_key=API_KEY, transport=prime.transport())
    spec = InstanceSpec(
        vm="c-a1-n0-abcdef", job="c", node_index=0, attempt=1, ssh_public_key=bodies.PUBLIC_KEY
    )
    try:
        offers = await cloud.plan(ResourceRequest(gpu="H100"))
        for offer in offers:  # every offer shape makes a valid create body
            prepared = await cloud.prepare(offer, spec)
            ids = await cloud.create(offer, prepared, spec)
            await cloud.observe(offer.location, spec.vm)
            await cloud.observe_region(offer.location)
            await cloud.delete(offer.location, spec.vm, ids)
            await cloud.observe(offer.location, spec.vm)
        await cloud.cleanup(offers[0].location, spec.vm)
    finally:
        await cloud.aclose()
    assert len(offers) == 3
    assert prime.violations == []
    assert {call.split(" ", 1)[0] + " " + _template(call) for call in prime.calls} == {
        "GET /api/v1/availability/gpus",
        "GET /api/v1/ssh_keys/",
        "POST /api/v1/ssh_keys/",
        "POST /api/v1/pods/",
        "GET /api/v1/pods/",
        "DELETE /api/v1/pods/{pod_id}",
    }


def _template(call: str) -> str:
    path = call.split(" ", 1)[1]
    for prefix, name in (("/api/v1/pods/", "{pod_id}"), ("/api/v1/ssh_keys/", "{key_id}")):
        if path.startswith(prefix) and path != prefix:
            return prefix + name
    return path


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/availability/gpus", bodies.availability(*ALL_OFFERS)),
        ("GET", "/api/v1/pods/", bodies.pods_page(bodies.pod("p-1", "gpuprov-x", "PROVISIONING"))),
        ("POST", "/api/v1/pods/", bodies.pod("p-1", "gpuprov-x", "PROVISIONING")),
        ("DELETE", "/api/v1/pods/p-1", {"status": "TERMINATED"}),
        ("GET", "/api/v1/ssh_keys/", bodies.keys_page(bodies.ssh_key("k-1", "gpuprov-x"))),
        ("POST", "/api/v1/ssh_keys/", bodies.ssh_key("k-1", "gpuprov-x")),
    ],
)
def test_fixture_answers_match_the_documented_schemas(method, path, body):
    sent = request(method, path, json={} if method == "POST" else None)
    assert response_violation(sent, 200, body) is None


def test_the_validation_error_fixture_is_the_documented_error_response():
    sent = request("POST", "/api/v1/pods/", json={})
    assert response_violation(sent, 422, bodies.VALIDATION) is None


def test_pods_in_every_state_are_documented_pod_configs():
    states = [("PROVISIONING", "PENDING"), ("ACTIVE", "ACTIVE"), ("ACTIVE", "FINISHED")]
    states += [("DELETING", "FINISHED"), ("TERMINATED", "TERMINATED"), ("ERROR", "ERROR")]
    pods = [bodies.pod(f"p-{i}", "gpuprov-x", s, i_s) for i, (s, i_s) in enumerate(states)]
    assert response_violation(request("GET", "/api/v1/pods/"), 200, bodies.pods_page(*pods)) is None


@pytest.mark.parametrize(
    ("sent", "why"),
    [
        (request("GET", "/api/v1/pods"), "PathNotFound"),  # the slash is part of the path
        (request("GET", "/api/v1/availability/gpus", params={"gpu_type": "H100"}), "gpu_type"),
        (request("GET", "/api/v1/availability/gpus", params={"regions": "mars"}), "regions"),
        (request("GET", "/api/v1/availability/gpus", params={"page_size": 500}), "page_size"),
        (
            request(
                "POST",
                "/api/v1/pods/",
                json={
                    "pod": {
                        "cloudId": "x",
                        "gpuType": "H100_80GB",
                        "socket": "PCIe",
                        "gpuCount": 1,
                        "userData": "#!",
                    },
                    "provider": {"type": "runpod"},
                },
            ),  # fmt: skip
            "userData",
        ),
        (
            httpx.Request(
                "POST",
                f"{BASE_URL}/api/v1/pods/",
                json={
                    "pod": {
                        "cloudId": "x",
                        "gpuType": "H100_80GB",
                        "socket": "PCIe",
                        "gpuCount": 1,
                    },
                    "provider": {"type": "runpod"},
                },
            ),
            "Security",
        ),
    ],
)
def test_the_contract_can_fail(sent, why):
    violation = request_violation(sent)
    assert violation is not None and why in violation


def test_the_duplicated_enum_value_still_validates():
    body = {
        "pod": {"cloudId": "x", "gpuType": "RTX3070_8GB", "socket": "PCIe", "gpuCount": 1},
        "provider": {"type": "runpod"},
    }
    assert request_violation(request("POST", "/api/v1/pods/", json=body)) is None
