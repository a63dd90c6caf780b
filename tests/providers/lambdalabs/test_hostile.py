"""Hostile answers (truncated, wrong types, missing fields, huge numbers, any status, a body
that echoes the API key) become a well-formed result or, through the activities' scrubbing, a
classified failure that never carries the key: never another exception."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from temporalio.exceptions import ApplicationError

from activities.redaction import scrubbed
from providers.base import (
    Diagnosis,
    InstanceSpec,
    Location,
    Observed,
    Offer,
    ResourceRequest,
)
from providers.errors import ErrorKind

from . import fixtures as fx
from .fake_lambda import LambdaCloud, LambdaConfig

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

KINDS = {kind.value for kind in ErrorKind}

VM = "train-a1-n0-abc123"
EAST = Location(provider="lambda", region="us-east-3")
OFFER = Offer(
    id="lambda/us-east-3/gpu_8x_h100_sxm5",
    provider="lambda",
    region="us-east-3",
    instance_type="gpu_8x_h100_sxm5",
)
SPEC = InstanceSpec(vm=VM, job="train", node_index=0, attempt=1, ssh_public_key=fx.VM_PUBLIC_KEY)
PREPARED = {"ssh_key_name": "ops-team", "per_vm_key": False, "image": None}

# Valid `data` payloads to corrupt, per primitive.
VALID: dict[str, Any] = {
    "plan": {name: fx.INSTANCE_TYPES[name] for name in ("gpu_8x_h100_sxm5", "gpu_1x_a10")},
    "observe": [
        fx.instance("i1", name=f"gpuprov-{VM}", tags=[{"key": "gpuprov-vm", "value": VM}]),
        fx.instance("i2", name="My Instance"),
    ],
    "create": {"instance_ids": ["0920582c7ff041399e34823a0be62549"]},
    "keys": [fx.USER_KEY, fx.ssh_key("k2", f"gpuprov-{VM}", fx.VM_PUBLIC_KEY)],
    "delete": {"terminated_instances": [fx.instance("i1")]},
}

hostile_numbers = st.sampled_from([-1, 0, 10**400, -(10**400), 1e308, float("inf"), 2**63])
scalars = st.one_of(
    hostile_numbers,
    hostile_numbers,
    hostile_numbers,
    st.sampled_from(["", "8", fx.API_KEY, "active", "terminated", f"gpuprov-{VM}", "10.0.0.1"]),
    st.none() | st.booleans(),
    st.integers() | st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every node's path; leaves are listed twice, so they are corrupted more often."""
    found = [prefix] if isinstance(value, dict | list) else [prefix, prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


@st.composite
def corrupted(draw: st.DrawFn, primitive: str) -> Any:
    """A valid payload with one to four nodes replaced (or deleted) by something hostile."""
    payload = copy.deepcopy(VALID[primitive])
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_paths(payload)))
        if not path:
            return draw(json_values)
        parent = payload
        for step in path[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and draw(st.integers(0, 3)) == 0:
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(scalars if draw(st.booleans()) else json_values)
    return payload


@st.composite
def success(draw: st.DrawFn, primitive: str) -> httpx.Response:
    """A 200 whose `data` is a documented payload with hostile nodes."""
    return httpx.Response(200, content=json.dumps({"data": draw(corrupted(primitive))}).encode())


@st.composite
def anything(draw: st.DrawFn, primitive: str) -> httpx.Response:
    """Any status, odd Retry-After, and a body that is JSON, truncated, an odd error or bytes."""
    status = draw(st.sampled_from([200, 204, 302, 400, 401, 403, 404, 409, 429, 500, 503]))
    headers = {}
    if draw(st.booleans()):
        headers["Retry-After"] = draw(st.sampled_from(["5", "-1", "1e999", "soon", fx.API_KEY]))
    kind = draw(st.sampled_from(["raw", "truncated", "error", "bytes"]))
    if kind == "raw":
        body = json.dumps(draw(json_values)).encode()
    elif kind == "truncated":
        whole = json.dumps({"data": VALID[primitive]}).encode()
        body = whole[: draw(st.integers(0, max(len(whole) - 1, 0)))]
    elif kind == "error":
        error = {"code": draw(scalars), "message": draw(scalars), "suggestion": draw(scalars)}
        body = json.dumps({"error": error}).encode()
    else:
        body = draw(st.binary(max_size=64))
    return httpx.Response(status, content=body, headers=headers)


async def run(primitive: str, answer: httpx.Response) -> Any:
    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(answer.status_code, content=answer.content, headers=answer.headers)

    config = LambdaConfig(base_url=fx.BASE_URL, min_launch_interval=0, ssh_key_name="ops-team")
    cloud = LambdaCloud(config, api_key=fx.API_KEY, transport=httpx.MockTransport(reply))
    try:
        with scrubbed(cloud, spec=SPEC):  # as the activities run every primitive
            return await _call(cloud, primitive)
    finally:
        await cloud.aclose()


async def _call(cloud: Any, primitive: str) -> Any:
    if primitive == "plan":
        result = await cloud.plan(ResourceRequest())
        assert all(isinstance(o, Offer) for o in result)
    elif primitive == "observe":
        result = await cloud.observe(EAST, VM)
        assert all(isinstance(o, Observed) for o in result)
        listing = await cloud.observe_region(EAST)
        assert all(isinstance(o, Observed) for found in listing.values() for o in found)
        assert isinstance(await cloud.diagnose(EAST, VM), Diagnosis)
    elif primitive == "create":
        ids = await cloud.create(OFFER, PREPARED, SPEC)
        assert ids and all(isinstance(i, str) and i for i in ids)
    elif primitive == "keys":
        await cloud.prepare(OFFER, SPEC)
        await cloud.cleanup(EAST, VM)
    else:
        await cloud.delete(EAST, VM, ["i1", "i2"])
    return None


def _with(primitive: str, *changes: tuple[tuple, Any]) -> httpx.Response:
    payload = copy.deepcopy(VALID[primitive])
    for path, value in changes:
        parent = payload
        for step in path[:-1]:
            parent = parent[step]
        parent[path[-1]] = value
    return httpx.Response(200, content=json.dumps({"data": payload}).encode())


H100 = ("gpu_8x_h100_sxm5", "instance_type")
OURS = (0,)
# Known-nasty answers, always tried first.
EXAMPLES: dict[str, list[httpx.Response]] = {
    "plan": [
        _with("plan", ((*H100, "price_cents_per_hour"), -1)),
        _with("plan", ((*H100, "price_cents_per_hour"), 10**400)),
        _with("plan", ((*H100, "specs", "memory_gib"), 10**400)),
        _with("plan", ((*H100, "specs", "gpus"), "8")),
        _with("plan", ((*H100, "gpu_description"), None)),
        _with("plan", (("gpu_8x_h100_sxm5", "regions_with_capacity_available"), [None])),
    ],
    "observe": [
        _with("observe", ((*OURS, "status"), None)),
        _with("observe", ((*OURS, "region"), "us-east-3")),
        _with("observe", ((*OURS, "ip"), 10**400)),
        _with("observe", ((*OURS, "id"), "")),
        _with("observe", ((*OURS, "tags"), [{"key": "gpuprov-vm", "value": 5}])),
    ],
    "create": [
        _with("create", (("instance_ids",), [])),
        _with("create", (("instance_ids",), [None])),
        _with("create", (("instance_ids",), "0920582c")),
    ],
    "keys": [
        _with("keys", ((1, "id"), None)),
        _with("keys", ((1, "public_key"), 10**400)),
        _with("keys", ((1,), "gpuprov-" + VM)),
    ],
    "delete": [_with("delete", (("terminated_instances",), None))],
}


def hostile(primitive: str, answers):
    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(answer=answers(primitive))
    async def test(answer: httpx.Response) -> None:
        try:
            await run(primitive, answer)
        except ApplicationError as failure:
            assert failure.type in KINDS  # classified: no other exception escapes
            assert fx.API_KEY not in failure.message
            delay = failure.next_retry_delay
            assert delay is None or 0 <= delay.total_seconds() <= 3600

    if answers is success:
        for answer in EXAMPLES[primitive]:
            test = example(answer=answer)(test)
    return test


test_plan_survives_corrupted_data = hostile("plan", success)
test_plan_survives_any_answer = hostile("plan", anything)
test_observe_region_and_diagnose_survive_corrupted_data = hostile("observe", success)
test_observe_region_and_diagnose_survive_any_answer = hostile("observe", anything)
test_create_survives_corrupted_data = hostile("create", success)
test_create_survives_any_answer = hostile("create", anything)
test_prepare_and_cleanup_survive_corrupted_data = hostile("keys", success)
test_prepare_and_cleanup_survive_any_answer = hostile("keys", anything)
test_delete_survives_corrupted_data = hostile("delete", success)
test_delete_survives_any_answer = hostile("delete", anything)
