"""Contract: every request the adapter sends, and every body these tests answer with, is valid
against RunPod's own OpenAPI document for REST v2 (openapi-core, document unmodified)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openapi_core.templating.paths.exceptions import PathNotFound
from openapi_core.validation.request.exceptions import InvalidRequestBody

from providers.base import InstanceSpec, Location, ResourceRequest
from providers.errors import ProviderError
from tests.providers.runpod import samples
from tests.providers.runpod.fake_api import FakeRunPod
from tests.providers.runpod.openapi import validate_request, validate_response

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

SPEC = InstanceSpec(
    vm=samples.VM, job="train-7b", node_index=0, attempt=1, ssh_public_key=samples.VM_KEY
)


async def run_every_primitive(api: FakeRunPod, **settings: Any) -> None:
    """plan (both cloud types), a stockout create, a create, observe until Running,
    observe_region, delete (incl. an id already gone), cleanup."""
    api.stockouts.add(("NVIDIA H100 PCIe", "US-KS-2"))
    cloud = api.cloud(cloud_types=["SECURE", "COMMUNITY"], **settings)
    offers = await cloud.plan(ResourceRequest(gpu="H100", gpus_per_node=8))
    with pytest.raises(ProviderError):
        await cloud.create(offers[0], await cloud.prepare(offers[0], SPEC), SPEC)
    offer = offers[1]
    ids = await cloud.create(offer, await cloud.prepare(offer, SPEC), SPEC)
    for _ in range(3):
        await cloud.observe(offer.location, SPEC.vm)
    await cloud.observe_region(Location(provider="runpod", region=offer.region))
    await cloud.delete(offer.location, SPEC.vm, [*ids, "gone0000"])
    await cloud.cleanup(offer.location, SPEC.vm)
    await cloud.aclose()


@pytest.mark.parametrize(
    "settings",
    [{}, {"min_cuda_version": "12.4", "disk_gb": 20, "image": "ghcr.io/me/train:1"}],
    ids=["defaults", "cuda-disk-image"],
)
async def test_every_request_and_answer_matches_runpods_openapi(settings):
    api = FakeRunPod()
    await run_every_primitive(api, **settings)
    sent = {(r.method, r.url.path) for r, _ in api.exchanges}
    assert sent >= {
        ("GET", "/v2/catalog/gpus"),
        ("GET", "/v2/account/ssh-keys"),
        ("POST", "/v2/pods"),
        ("GET", "/v2/pods"),
        ("DELETE", "/v2/pods/gone0000"),
    }
    statuses = {r.status_code for _, r in api.exchanges}
    assert statuses >= {200, 201, 204, 400, 404}
    for request, response in api.exchanges:
        validate_request(request)
        validate_response(request, response)


async def test_a_pod_with_the_jobs_image_and_ports_matches_runpods_openapi():
    api = FakeRunPod()
    cloud = api.cloud()
    spec = SPEC.model_copy(update={"image": "nvcr.io/nvidia/pytorch:24.05-py3", "ports": [8888]})
    offer = (await cloud.plan(ResourceRequest(gpu="H100", gpus_per_node=8)))[0]
    await cloud.create(offer, await cloud.prepare(offer, spec), spec)
    await cloud.aclose()
    (body,) = api.created
    assert body["image"] == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert body["ports"] == ["22/tcp", "8888/tcp"]
    for request, response in api.exchanges:
        validate_request(request)
        validate_response(request, response)


def test_the_validator_rejects_what_runpod_would_reject():
    """The check can fail: a v1-style body, an unknown field, a v1 path."""
    headers = {"Authorization": "Bearer x"}
    v1_body = {"name": "x", "imageName": "i", "gpuTypeIds": ["g"], "gpuCount": 1}
    with pytest.raises(InvalidRequestBody):
        validate_request(
            httpx.Request("POST", f"{samples.BASE_URL}/v2/pods", json=v1_body, headers=headers)
        )
    with pytest.raises(PathNotFound):
        validate_request(httpx.Request("GET", f"{samples.BASE_URL}/v1/pods", headers=headers))
    bad_cloud = f"{samples.BASE_URL}/v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=ALL"
    with pytest.raises(Exception, match="cloud"):
        validate_request(httpx.Request("GET", bad_cloud, headers=headers))


def _answer(method: str, path: str, status: int, body: bytes, problem: bool) -> None:
    request = httpx.Request(
        method, f"{samples.BASE_URL}{path}", headers={"Authorization": "Bearer x"}
    )
    content_type = "application/problem+json" if problem else "application/json"
    validate_response(
        request, httpx.Response(status, content=body, headers={"Content-Type": content_type})
    )


def test_the_sample_catalog_matches_the_documented_schema():
    _answer("GET", "/v2/catalog/gpus", 200, json.dumps(samples.CATALOG).encode(), False)


@pytest.mark.parametrize(
    ("status", "direct", "data_center"),
    [
        ("PROVISIONING", False, None),
        ("STARTING", False, "US-KS-2"),
        ("RUNNING", False, "US-KS-2"),
        ("RUNNING", True, "US-KS-2"),
        ("EXITED", False, "US-KS-2"),
        ("ERROR", False, "US-KS-2"),
        ("TERMINATED", False, "US-KS-2"),
    ],
)
def test_the_sample_pods_match_the_documented_schema(status, direct, data_center):
    document = samples.pod(status=status, direct=direct, data_center=data_center)
    _answer("GET", "/v2/pods", 200, json.dumps({"pods": [document]}).encode(), False)
    _answer("GET", "/v2/pods/7h9k2m4n6p", 200, json.dumps(document).encode(), False)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v2/pods", samples.STOCKOUT_400),
        ("POST", "/v2/pods", samples.DISK_STOCKOUT_400),
        ("POST", "/v2/pods", samples.HOST_GPUS_400),
        ("POST", "/v2/pods", samples.RULE_400),
        ("POST", "/v2/pods", samples.UNAUTHORIZED_401),
        ("POST", "/v2/pods", samples.FORBIDDEN_403),
        ("POST", "/v2/pods", samples.VALIDATION_422),
        ("POST", "/v2/pods", samples.RATE_LIMITED_429),
        ("POST", "/v2/pods", samples.INTERNAL_500),
        ("POST", "/v2/pods", samples.BALANCE_402),
        ("DELETE", "/v2/pods/p1", samples.NOT_FOUND_404),
        ("DELETE", "/v2/pods/p1", samples.CLUSTER_409),
    ],
)
def test_the_sample_problems_match_the_documented_schema(method, path, body):
    _answer(method, path, json.loads(body)["status"], body, True)
