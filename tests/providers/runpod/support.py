"""Shared pieces of the RunPodCloud HTTP tests: a cloud over a respx router, an offer from the
fake API, and the usual request, location and spec."""

from __future__ import annotations

from typing import Any

import httpx
import respx

from providers.base import InstanceSpec, Location, Offer, ResourceRequest
from providers.runpod.client import RunPodClient
from providers.runpod.cloud import RunPodCloud
from providers.runpod.config import RunPodConfig
from tests.providers.runpod import samples
from tests.providers.runpod.fake_api import FakeRunPod

H100 = ResourceRequest(gpu="H100", gpus_per_node=8)
KS = Location(provider="runpod", region="US-KS-2")
SPEC = InstanceSpec(
    vm=samples.VM, job="train-7b", node_index=0, attempt=1, ssh_public_key=samples.VM_KEY
)


def routed(router: respx.MockRouter, **settings_: Any) -> RunPodCloud:
    client = RunPodClient(
        samples.API_KEY, samples.BASE_URL, transport=httpx.MockTransport(router.async_handler)
    )
    return RunPodCloud(RunPodConfig(base_url=samples.BASE_URL, **settings_), client=client)


async def an_offer(api: FakeRunPod) -> Offer:
    cloud = api.cloud()
    try:
        return (await cloud.plan(H100))[0]
    finally:
        await cloud.aclose()


def problem_response(body: bytes, status: int, **headers: str) -> httpx.Response:
    return httpx.Response(
        status, content=body, headers={"Content-Type": "application/problem+json", **headers}
    )


def listing(*pods: dict[str, Any]) -> respx.MockRouter:
    router = respx.MockRouter(base_url=samples.BASE_URL)
    router.get("/v2/pods").respond(json={"pods": list(pods)})
    return router
