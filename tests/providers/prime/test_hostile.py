"""Hostile answers (truncated, wrong types, missing fields, huge numbers, junk) become a classified
ProviderError or a valid result, never another exception."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from providers.base import InstanceSpec, Location, Observed, Offer, ResourceRequest
from providers.errors import ErrorKind, ProviderError
from providers.prime.cloud import PrimeCloud
from providers.prime.config import PrimeConfig
from tests.providers.prime import bodies
from tests.providers.prime.fake_api import API_KEY

HYPOTHESIS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LABEL = "gpuprov-h-a1-n0-000000"
HERE = Location(provider="prime", region="canada")
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
SPEC = InstanceSpec(
    vm="h-a1-n0-000000", job="h", node_index=0, attempt=1, ssh_public_key=bodies.PUBLIC_KEY
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def mutated(draw: st.DrawFn, body: Any) -> Any:
    """A realistic body with a few fields dropped or replaced by junk of any type."""
    body = copy.deepcopy(body)
    for _ in range(draw(st.integers(1, 4))):
        target = body
        path = draw(st.lists(st.integers(0, 30), min_size=1, max_size=4))
        for step in path[:-1]:
            if isinstance(target, dict) and target:
                target = target[sorted(target)[step % len(target)]]
            elif isinstance(target, list) and target:
                target = target[step % len(target)]
        if isinstance(target, dict) and target:
            key = sorted(target)[path[-1] % len(target)]
            if draw(st.booleans()):
                del target[key]
            else:
                target[key] = draw(json_values)
        elif isinstance(target, list) and target:
            target[path[-1] % len(target)] = draw(json_values)
    return body


def answers(body: Any, truncate: int | None) -> httpx.MockTransport:
    text = json.dumps(body, default=str)
    if truncate is not None:
        text = text[: truncate % (len(text) + 1)]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=text, headers={"content-type": "application/json"})

    return httpx.MockTransport(handler)


def run(primitive: str, body: Any, truncate: int | None) -> Any:
    async def go() -> Any:
        cloud = PrimeCloud(
            PrimeConfig(max_pages=3), api_key=API_KEY, transport=answers(body, truncate)
        )
        try:
            if primitive == "plan":
                return await cloud.plan(ResourceRequest())
            if primitive == "observe":
                return await cloud.observe_region(HERE)
            if primitive == "prepare":
                return await cloud.prepare(OFFER, SPEC)
            return await cloud.create(OFFER, {"image": "ubuntu_22_cuda_12"}, SPEC)
        finally:
            await cloud.aclose()

    try:
        return asyncio.run(go())
    except ProviderError as error:
        assert API_KEY not in error.message
        assert isinstance(error.kind, ErrorKind)
        return error


truncations = st.none() | st.integers(min_value=0, max_value=10_000)
availability = bodies.availability(
    bodies.HYPERSTACK_H100, bodies.RUNPOD_H100, bodies.COMMUNITY_RTX4090
)
pods = bodies.pods_page(
    bodies.pod("p-1", LABEL, "ACTIVE", "FINISHED", ssh="root@203.0.113.5 -p 22"),
    bodies.pod("p-2", "someone-else", "ACTIVE", "FINISHED"),
)


@HYPOTHESIS
@given(st.one_of(json_values, mutated(availability)), truncations)
def test_plan_survives_any_availability_answer(body, truncate):
    result = run("plan", body, truncate)
    if not isinstance(result, ProviderError):
        assert all(isinstance(offer, Offer) for offer in result)


@HYPOTHESIS
@given(st.one_of(json_values, mutated(pods)), truncations)
def test_observe_survives_any_pods_answer(body, truncate):
    result = run("observe", body, truncate)
    if not isinstance(result, ProviderError):
        assert all(isinstance(o, Observed) for found in result.values() for o in found)


@HYPOTHESIS
@given(st.one_of(json_values, mutated(bodies.pod("p-1", LABEL))), truncations)
def test_create_survives_any_answer_and_never_claims_success_without_an_id(body, truncate):
    result = run("create", body, truncate)
    if isinstance(result, ProviderError):
        assert result.kind is ErrorKind.FAILED  # a pod may exist: the core tears down by name
    else:
        assert len(result) == 1 and isinstance(result[0], str) and result[0]


@HYPOTHESIS
@given(st.one_of(json_values, mutated(bodies.keys_page(bodies.ssh_key("k-1", LABEL)))), truncations)
def test_prepare_survives_any_ssh_keys_answer(body, truncate):
    result = run("prepare", body, truncate)
    if not isinstance(result, ProviderError):
        assert isinstance(result["ssh_key_id"], str)
