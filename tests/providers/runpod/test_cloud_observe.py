"""RunPodCloud over HTTP (respx, no network): observe, observe_region, delete, cleanup,
diagnose, and any HTTP answer at all becoming a result or a classified ProviderError."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import respx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from providers.base import InstanceStatus, Offer
from providers.errors import ErrorKind, ProviderError
from tests.providers.runpod import samples
from tests.providers.runpod.support import (
    H100,
    KS,
    SPEC,
    an_offer,
    listing,
    problem_response,
    routed,
)

# --------------------------------------------------------------------------- observe


async def test_observe_follows_a_pod_from_provisioning_to_running_with_ssh(api):
    offer = await an_offer(api)
    cloud = api.cloud()
    (pod_id,) = await cloud.create(offer, {}, SPEC)
    seen = [await cloud.observe(KS, samples.VM) for _ in range(3)]
    await cloud.aclose()
    assert [[o.status for o in s] for s in seen] == [
        [InstanceStatus.PENDING],
        [InstanceStatus.PENDING],  # RUNNING, but ssh.direct not there yet
        [InstanceStatus.RUNNING],
    ]
    assert all(s[0].id == pod_id for s in seen)
    assert seen[2][0].ssh is not None and seen[2][0].ssh.user == "root"


async def test_observe_finds_by_name_and_leaves_out_terminated_and_others():
    router = listing(
        samples.pod("p1"),
        samples.pod("p2", status="TERMINATED", direct=False),
        samples.pod("p3", name="my-notebook", vm_marker=None),
        samples.pod("p4", name="gpuprov-other-vm", vm_marker="other-vm"),
        samples.pod("p5", vm_marker="renamed-by-hand"),  # its marker names another VM
        samples.pod("p6", status="PROVISIONING", direct=False, data_center=None),
    )
    cloud = routed(router)
    found = await cloud.observe(KS, samples.VM)
    await cloud.aclose()
    assert [(o.id, o.status) for o in found] == [
        ("p1", InstanceStatus.RUNNING),
        ("p6", InstanceStatus.PENDING),  # not placed yet: no data centre
    ]
    assert router.calls.call_count == 1


async def test_a_pod_placed_outside_the_asked_data_centre_is_still_seen():
    """dataCenterIds is a placement preference: the name alone is the identity."""
    cloud = routed(listing(samples.pod("p1", data_center="EU-RO-1")))
    found = await cloud.observe(KS, samples.VM)
    await cloud.aclose()
    assert [o.id for o in found] == ["p1"]


async def test_observe_reports_broken_pods_as_failed():
    cloud = routed(listing(samples.pod("p1", status="ERROR", direct=False)))
    (found,) = await cloud.observe(KS, samples.VM)
    await cloud.aclose()
    assert found.status is InstanceStatus.FAILED


async def test_observe_region_groups_every_gpuprov_pod_of_the_account_in_one_call():
    router = listing(
        samples.pod("p1"),
        samples.pod("p2", name="gpuprov-job-a1-n1-abc123", vm_marker="job-a1-n1-abc123"),
        samples.pod("p3", name="gpuprov-job-a1-n1-abc123", vm_marker=None, status="STARTING"),
        samples.pod("p4", name="my-notebook", vm_marker=None),
        samples.pod("p5", name="gpuprov-elsewhere", vm_marker=None, data_center="EU-RO-1"),
        samples.pod("p6", name="gpuprov-gone", status="TERMINATED", direct=False),
    )
    cloud = routed(router)
    by_vm = await cloud.observe_region(KS)
    await cloud.aclose()
    assert {vm: [o.id for o in found] for vm, found in by_vm.items()} == {
        samples.VM: ["p1"],
        "job-a1-n1-abc123": ["p2", "p3"],
        "elsewhere": ["p5"],  # GET /v2/pods is account-wide; the name is the identity
    }
    assert router.calls.call_count == 1


READ_FAILURES = [
    (problem_response(samples.UNAUTHORIZED_401, 401), ErrorKind.CREDENTIALS),
    (problem_response(samples.FORBIDDEN_403, 403), ErrorKind.CREDENTIALS),
    (problem_response(samples.INTERNAL_500, 500), ErrorKind.TRANSIENT),
    (httpx.Response(503, content=samples.BAD_GATEWAY_HTML), ErrorKind.TRANSIENT),
    (problem_response(samples.RATE_LIMITED_429, 429, **{"Retry-After": "7"}), ErrorKind.TRANSIENT),
    (httpx.Response(200, content=b"<html>maintenance</html>"), ErrorKind.TRANSIENT),
    (httpx.Response(200, json=[samples.pod()]), ErrorKind.TRANSIENT),
    (httpx.ConnectTimeout("timed out"), ErrorKind.TRANSIENT),
    (problem_response(samples.RULE_400, 400), ErrorKind.FAILED),
]


@pytest.mark.parametrize(("answer", "kind"), READ_FAILURES)
async def test_observe_failures_are_classified(answer, kind):
    router = respx.MockRouter(base_url=samples.BASE_URL)
    router.get("/v2/pods").mock(side_effect=[answer])
    cloud = routed(router)
    with pytest.raises(ProviderError) as raised:
        await cloud.observe(KS, samples.VM)
    await cloud.aclose()
    assert raised.value.kind is kind


@pytest.mark.parametrize(("answer", "kind"), READ_FAILURES)
async def test_plan_failures_are_classified(answer, kind):
    router = respx.MockRouter(base_url=samples.BASE_URL)
    router.get("/v2/catalog/gpus").mock(side_effect=[answer])
    cloud = routed(router)
    with pytest.raises(ProviderError) as raised:
        await cloud.plan(H100)
    await cloud.aclose()
    assert raised.value.kind is kind


async def test_observe_rate_limit_keeps_retry_after():
    router = respx.MockRouter(base_url=samples.BASE_URL)
    router.get("/v2/pods").mock(
        return_value=problem_response(samples.RATE_LIMITED_429, 429, **{"Retry-After": "7"})
    )
    cloud = routed(router)
    with pytest.raises(ProviderError) as raised:
        await cloud.observe_region(KS)
    await cloud.aclose()
    assert raised.value.retry_after == 7.0


# --------------------------------------------------------------------------- delete / cleanup


async def test_delete_terminates_each_pod_and_gone_pods_are_success(api):
    offer = await an_offer(api)
    cloud = api.cloud()
    (pod_id,) = await cloud.create(offer, {}, SPEC)
    await cloud.delete(KS, samples.VM, [pod_id, "already-gone", pod_id, ""])
    assert await cloud.observe(KS, samples.VM) == []
    await cloud.aclose()
    assert api.deleted == [pod_id]
    assert api.calls("DELETE", "/v2/pods/already-gone") == 1


async def test_delete_escapes_ids_into_one_path_segment():
    router = respx.MockRouter(base_url=samples.BASE_URL)
    route = router.route(method="DELETE").respond(204)
    cloud = routed(router)
    await cloud.delete(KS, samples.VM, ["../account/ssh-keys"])
    await cloud.aclose()
    assert route.calls.last.request.url.raw_path == b"/v2/pods/..%2Faccount%2Fssh-keys"


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (problem_response(samples.CLUSTER_409, 409), ErrorKind.FAILED),
        (problem_response(samples.INTERNAL_500, 500), ErrorKind.TRANSIENT),
        (problem_response(samples.FORBIDDEN_403, 403), ErrorKind.CREDENTIALS),
        (httpx.ReadError("reset"), ErrorKind.TRANSIENT),
    ],
)
async def test_delete_failures_are_classified(answer, kind):
    router = respx.MockRouter(base_url=samples.BASE_URL)
    router.delete("/v2/pods/p1").mock(side_effect=[answer])
    cloud = routed(router)
    with pytest.raises(ProviderError) as raised:
        await cloud.delete(KS, samples.VM, ["p1"])
    await cloud.aclose()
    assert raised.value.kind is kind


async def test_cleanup_has_nothing_to_remove_and_calls_nothing():
    router = respx.MockRouter(base_url=samples.BASE_URL, assert_all_mocked=True)
    cloud = routed(router)
    await cloud.cleanup(KS, samples.VM)
    await cloud.aclose()
    assert router.calls.call_count == 0


async def test_diagnose_reports_a_running_pod_healthy():
    cloud = routed(listing(samples.pod("p1")))
    diagnosis = await cloud.diagnose(KS, samples.VM)
    await cloud.aclose()
    assert diagnosis.instance is not None and diagnosis.verdict.value == "healthy"


# --------------------------------------------------------------------------- hostile HTTP

ANSWERS = st.builds(
    lambda status, body: (status, body),
    st.sampled_from([200, 201, 204, 400, 401, 402, 403, 404, 409, 418, 422, 429, 500, 502, 503]),
    st.one_of(
        st.binary(max_size=64),
        st.sampled_from(
            [
                samples.STOCKOUT_400,
                b"{}",
                b"null",
                b'{"pods": [1]}',
                b'{"gpus": "x"}',
                json.dumps({"pods": [samples.pod()]}).encode(),
                b'{"id": 7}',
                b"[" * 5000,
            ]
        ),
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANSWERS)
def test_any_http_answer_is_a_result_or_a_classified_provider_error(answer):
    status, body = answer

    async def run() -> None:
        router = respx.MockRouter(base_url=samples.BASE_URL, assert_all_called=False)
        answer = router.route().mock(return_value=httpx.Response(status, content=body))
        cloud = routed(router)
        offer = Offer.model_validate(
            {
                "id": "o",
                "provider": "runpod",
                "region": "US-KS-2",
                "instance_type": "t",
                "detail": {
                    "gpu_id": "g",
                    "gpu_count": 1,
                    "cloud": "SECURE",
                    "data_center": "US-KS-2",
                    "disk_gb": 10,
                },
            }
        )
        calls = [
            lambda: cloud.plan(H100),
            lambda: cloud.create(offer, {}, SPEC),
            lambda: cloud.observe(KS, samples.VM),
            lambda: cloud.observe_region(KS),
            lambda: cloud.delete(KS, samples.VM, ["p1"]),
        ]
        for call in calls:
            before = answer.call_count
            try:
                await call()
            except ProviderError as error:
                assert error.kind in ErrorKind
            assert answer.call_count > before  # the hostile answer was read, not avoided
        await cloud.aclose()

    asyncio.run(run())
