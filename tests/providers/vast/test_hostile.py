"""Hostile answers (hypothesis): whatever Vast sends back — truncated JSON, wrong types, missing
fields, huge or non-finite numbers, any status — each primitive either returns its documented
type or, through the activities' scrubbing, fails classified (never another exception), short
and without the key."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import respx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.exceptions import ApplicationError

from activities.redaction import scrubbed
from providers.base import InstanceSpec, Location, Observed, Offer, ResourceRequest
from providers.errors import MAX_MESSAGE_CHARS, ErrorKind
from providers.vast.cloud import VastCloud
from tests.providers.vast import fixtures
from tests.providers.vast.conftest import vast_config

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

HERE = Location(provider="vast", region="US")
SPEC = InstanceSpec(vm="h-a1-n0-abc", job="h", node_index=0, attempt=1)
KINDS = {kind.value for kind in ErrorKind}
OFFER = Offer(
    id="vast/5",
    provider="vast",
    region="US",
    instance_type="H100_SXMx8",
    detail={"ask_id": 5, "disk_gb": 50.0, "image": "img", "runtype": "ssh_direct"},
)
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
LISTING_KEYS = [
    "gpu_name",
    "num_gpus",
    "gpu_ram",
    "cpu_cores",
    "cpu_cores_effective",
    "cpu_ram",
    "disk_space",
    "dph_total",
    "geolocation",
    "machine_id",
    "reliability2",
]
INSTANCE_KEYS = [
    "actual_status",
    "intended_status",
    "status_msg",
    "public_ipaddr",
    "ports",
    "ssh_host",
    "ssh_port",
]
# Ids are mostly usable, so that most listings and instances get read field by field.
ids = st.integers(min_value=1, max_value=10**12) | json_values
listings = st.fixed_dictionaries({"id": ids}, optional=dict.fromkeys(LISTING_KEYS, json_values))
instances = st.fixed_dictionaries(
    {
        "id": ids,
        "label": st.sampled_from(["gpuprov-h-a1-n0-abc", "gpuprov-other", "mine"]) | json_values,
    },
    optional=dict.fromkeys(INSTANCE_KEYS, json_values),
)
offer_bodies = st.fixed_dictionaries({"offers": st.lists(listings, max_size=4) | json_values})
instance_bodies = st.fixed_dictionaries(
    {"instances": st.lists(instances, max_size=4) | json_values},
    optional={"next_token": st.none() | json_values, "success": json_values},
)
answer_bodies = st.fixed_dictionaries(
    {},
    optional={
        "success": st.booleans() | json_values,
        "new_contract": st.integers(min_value=-5, max_value=10**20) | json_values,
        "error": st.sampled_from(["no_such_ask", "not_found", "invalid_args"]) | json_values,
        "msg": json_values,
    },
)
shaped_bodies = st.one_of(offer_bodies, instance_bodies, answer_bodies, json_values)
statuses = st.sampled_from([200, 201, 204, 400, 401, 403, 404, 410, 429, 500, 503])
mostly_ok = st.sampled_from([200, 200, 200, 200, 404, 429, 500])
# The answers each primitive reads, so that most examples get past the first check.
BODIES_FOR = {
    "plan": offer_bodies,
    "create": answer_bodies,
    "observe": instance_bodies,
    "observe_region": instance_bodies,
    "delete": answer_bodies,
}

Primitive = Callable[[VastCloud], Awaitable[Any]]
PRIMITIVES: dict[str, tuple[Primitive, Callable[[Any], bool]]] = {
    "plan": (
        lambda c: c.plan(ResourceRequest(gpu="H100", gpus_per_node=8)),
        lambda r: isinstance(r, list) and all(isinstance(o, Offer) for o in r),
    ),
    "create": (
        lambda c: c.create(OFFER, {}, SPEC),
        lambda r: isinstance(r, list) and len(r) == 1 and r[0].isdigit(),
    ),
    "observe": (
        lambda c: c.observe(HERE, SPEC.vm),
        lambda r: isinstance(r, list) and all(isinstance(o, Observed) for o in r),
    ),
    "observe_region": (
        lambda c: c.observe_region(HERE),
        lambda r: (
            isinstance(r, dict) and all(isinstance(o, Observed) for v in r.values() for o in v)
        ),
    ),
    "delete": (lambda c: c.delete(HERE, SPEC.vm, ["5", "6"]), lambda r: r is None),
}


class HostileVast:
    """One adapter, one event loop and one respx route for a whole hypothesis run (building
    an httpx client costs an SSL context, too slow to repeat per example); every call the
    adapter makes is answered with the current (status, content)."""

    def __init__(self) -> None:
        self.answer = httpx.Response(200)
        self.loop = asyncio.new_event_loop()
        self.mock = respx.mock(assert_all_mocked=True, assert_all_called=False)
        self.mock.start()
        self.route = self.mock.route(host="vast.test").mock(side_effect=lambda request: self.answer)
        self.cloud = VastCloud(vast_config(), api_key=fixtures.API_KEY)

    def close(self) -> None:
        self.loop.run_until_complete(self.cloud.aclose())
        self.loop.close()
        self.mock.stop()

    def outcome(self, name: str, status: int, content: bytes) -> Any:
        self.answer = httpx.Response(status, content=content)
        primitive, _ = PRIMITIVES[name]
        before = self.route.call_count
        try:
            return self.loop.run_until_complete(self._scrubbed(primitive))
        except ApplicationError as failure:
            return failure
        finally:
            # every primitive here reads an answer: one that made no call proves nothing
            assert self.route.call_count > before, f"{name} made no call"

    async def _scrubbed(self, primitive: Primitive) -> Any:
        with scrubbed(self.cloud, spec=SPEC):  # as the activities run every primitive
            return await primitive(self.cloud)

    def check(self, name: str, status: int, content: bytes) -> None:
        result = self.outcome(name, status, content)
        if isinstance(result, ApplicationError):
            assert result.type in KINDS  # classified: no other exception escapes
            assert fixtures.API_KEY not in result.message
            assert len(result.message) <= MAX_MESSAGE_CHARS
            return
        assert PRIMITIVES[name][1](result), result


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileVast]:
    harness = HostileVast()
    yield harness
    harness.close()


def test_answers_shaped_like_each_calls_are_a_result_or_a_classified_error(hostile):
    @SETTINGS
    @given(
        st.sampled_from(sorted(PRIMITIVES)).flatmap(
            lambda name: st.tuples(st.just(name), mostly_ok, BODIES_FOR[name])
        )
    )
    def answers(case: tuple[str, int, Any]) -> None:
        name, status, body = case
        hostile.check(name, status, json.dumps(body).encode())

    answers()


def test_any_answer_even_truncated_or_binary_is_classified(hostile):
    @SETTINGS
    @given(st.sampled_from(sorted(PRIMITIVES)), statuses, shaped_bodies, st.data())
    def answers(name: str, status: int, body: Any, data: st.DataObject) -> None:
        whole = json.dumps(body).encode()
        if data.draw(st.booleans()):
            cut = data.draw(st.integers(min_value=0, max_value=max(len(whole) - 1, 0)))
            whole = whole[:cut] + data.draw(st.binary(max_size=16))
        hostile.check(name, status, whole)

    answers()


def test_a_realistic_listing_with_huge_numbers_still_plans(hostile):
    body = {
        "offers": [
            fixtures.h100_listing(
                10**12, 1e308, gpu_ram=10**400, cpu_ram=1e308, cpu_cores=1e-308, num_gpus=8
            )
        ]
    }
    result = hostile.outcome("plan", 200, json.dumps(body).encode())
    assert isinstance(result, list) and len(result) == 1
    assert result[0].gpu_memory_gb is None and result[0].price is None  # 1e308 is no price
