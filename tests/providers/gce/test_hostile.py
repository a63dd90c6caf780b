"""Hostile answers (truncated, wrong types, missing fields, huge numbers, junk, any status) become
a classified ProviderError or a valid result, never another exception, and never leak a token."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from providers.base import (
    Diagnosis,
    InstanceSpec,
    Location,
    NodeBootstrap,
    Observed,
    Offer,
    ResourceRequest,
)
from providers.errors import ErrorKind, ProviderError
from providers.gce.auth import StaticToken
from providers.gce.cloud import GceCloud
from tests.providers.gce import bodies
from tests.providers.gce.fake_gce import FakeGce, h100_accelerator, h100_machine

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

HYPOTHESIS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SECRET = "join-token-never-in-errors"
HERE = Location(provider="gce", region="us-central1", zone=bodies.ZONE)
OFFER = Offer(
    id="gce/us-central1-a/a3-highgpu-8g",
    provider="gce",
    region="us-central1",
    zone=bodies.ZONE,
    instance_type="a3-highgpu-8g",
    detail={"machine_type": "a3-highgpu-8g", "spot": False},
)
SPEC = InstanceSpec(
    vm=bodies.VM,
    job="train",
    node_index=0,
    attempt=1,
    bootstrap=NodeBootstrap(api_url="https://api.example", join_token=SECRET),
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
statuses = st.sampled_from([200, 200, 200, 400, 401, 403, 404, 409, 429, 500, 503])
truncations = st.none() | st.integers(min_value=0, max_value=5_000)


@st.composite
def mutated(draw: st.DrawFn, body: Any) -> Any:
    """A realistic body with a few fields dropped or replaced by junk of any type."""
    body = copy.deepcopy(body)
    for _ in range(draw(st.integers(1, 4))):
        target = body
        path = draw(st.lists(st.integers(0, 30), min_size=1, max_size=5))
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


def run(primitive: str, body: Any, status: int, truncate: int | None) -> Any:
    text = json.dumps(body, default=str)
    if truncate is not None:
        text = text[: truncate % (len(text) + 1)]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, text=text, headers={"content-type": "application/json"})

    async def go() -> Any:
        config = FakeGce().config(operation_timeout=0.05)
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        cloud = GceCloud(config, tokens=StaticToken("t"), http=http)
        try:
            if primitive == "plan":
                return await cloud.plan(ResourceRequest())
            if primitive == "observe":
                return await cloud.observe(HERE, bodies.VM)
            if primitive == "observe_region":
                return await cloud.observe_region(Location(provider="gce", region="us-central1"))
            if primitive == "create":
                return await cloud.create(OFFER, {}, SPEC)
            if primitive == "prepare":
                return await cloud.prepare(OFFER, SPEC)
            if primitive == "delete":
                return await cloud.delete(HERE, bodies.VM, [f"{bodies.ZONE}/{bodies.NAME}"])
            if primitive == "cleanup":
                return await cloud.cleanup(HERE, bodies.VM)
            return await cloud.diagnose(HERE, bodies.VM)
        finally:
            await cloud.aclose()

    try:
        return asyncio.run(go())
    except ProviderError as error:
        assert isinstance(error.kind, ErrorKind)
        assert SECRET not in str(error)
        return error


machine_page = {
    "items": {
        "zones/us-central1-a": {
            "machineTypes": [h100_machine("us-central1-a")],
            "acceleratorTypes": [h100_accelerator("us-central1-a")],
        }
    },
    "skus": [],
}
instance_page = {"items": [bodies.instance(), bodies.instance("TERMINATED")], "nextPageToken": ""}
aggregated_page = {"items": {f"zones/{bodies.ZONE}": {"instances": [bodies.instance()]}}}
operation = bodies.STOCKOUT_DETAILS_OPERATION
error_body = bodies.RATE_LIMITED


def answers(*realistic: Any) -> st.SearchStrategy[Any]:
    return st.one_of(json_values, *[mutated(body) for body in realistic])


@HYPOTHESIS
@given(answers(machine_page), statuses, truncations)
def test_plan_survives_any_answer(body, status, truncate):
    result = run("plan", body, status, truncate)
    assert isinstance(result, ProviderError | list)
    if isinstance(result, list):
        assert all(isinstance(offer, Offer) for offer in result)


@HYPOTHESIS
@given(answers(instance_page, error_body), statuses, truncations)
def test_observe_survives_any_answer(body, status, truncate):
    result = run("observe", body, status, truncate)
    assert isinstance(result, ProviderError) or all(isinstance(o, Observed) for o in result)


@HYPOTHESIS
@given(answers(aggregated_page), statuses, truncations)
def test_observe_region_survives_any_answer(body, status, truncate):
    result = run("observe_region", body, status, truncate)
    assert isinstance(result, ProviderError | dict)


@HYPOTHESIS
@given(answers(operation, bodies.operation("RUNNING"), error_body), statuses, truncations)
def test_create_survives_any_answer_and_never_echoes_the_token(body, status, truncate):
    result = run("create", body, status, truncate)
    assert isinstance(result, ProviderError) or result == [f"{bodies.ZONE}/{bodies.NAME}"]


@HYPOTHESIS
@given(
    st.sampled_from(["prepare", "delete", "cleanup", "diagnose"]),
    answers(bodies.operation("DONE"), instance_page, error_body),
    statuses,
    truncations,
)
def test_the_other_primitives_survive_any_answer(primitive, body, status, truncate):
    result = run(primitive, body, status, truncate)
    assert result is None or isinstance(result, ProviderError | dict | Diagnosis)
