"""LambdaCloud over respx: create (launch body, errors, pacing), observe, observe_region,
delete (one id per call) and diagnose."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging

import httpx
import pytest

from activities.cloud import CloudActivities, VmInput
from gpuprov.policy import Failure, Stage, decide
from providers import agent_artifact, node_agent
from providers.base import (
    InstanceSpec,
    InstanceStatus,
    Location,
    NodeBootstrap,
    ResourceRequest,
    Severity,
    Verdict,
)
from providers.errors import ErrorKind, ProviderError
from tests import cloudinit
from tests.providers.scrubbing import activity_failure
from tests.providers.wire import assert_never_sent, carries

from . import fixtures as fx
from .fake_lambda import FakeLambda

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

LambdaClient = importlib.import_module("providers.lambdalabs.client").LambdaClient

VM = "train-a1-n0-abc123"
EAST = Location(provider="lambda", region="us-east-3")
SOUTH = Location(provider="lambda", region="us-south-2")
TOKEN = "join-token-must-never-leak-4242"


def spec(vm: str = VM, **fields) -> InstanceSpec:
    labels = {"gpuprov-job": "train", "Bad Key": "x"}
    return InstanceSpec(vm=vm, job="train", node_index=0, attempt=1, labels=labels, **fields)


async def launch(cloud, vm: str = VM, offer_id: str = "lambda/us-east-3/gpu_8x_h100_sxm5", **kw):
    offer = next(o for o in await cloud.plan(ResourceRequest()) if o.id == offer_id)
    the_spec = spec(vm, **kw)
    return await cloud.create(offer, await cloud.prepare(offer, the_spec), the_spec)


def tagged(vm: str) -> list[dict[str, str]]:
    return [{"key": "gpuprov-vm", "value": vm}]


# ---------------------------------------------------------------- create


async def test_create_launches_once_with_identity_key_and_tags(account: FakeLambda, cloud):
    ids = await launch(cloud)
    assert ids == list(account.instances)
    (body,) = account.launches
    assert body == {
        "region_name": "us-east-3",
        "instance_type_name": "gpu_8x_h100_sxm5",
        "ssh_key_names": ["ops-team"],
        "name": f"gpuprov-{VM}",
        "tags": [{"key": "gpuprov-vm", "value": VM}, {"key": "gpuprov-job", "value": "train"}],
    }  # "Bad Key" is no valid Lambda tag key: left out, not mangled


async def test_create_hands_user_data_and_bootstrap_to_the_machine_and_nowhere_else(
    account, cloud, caplog
):
    caplog.set_level(logging.DEBUG)
    bootstrap = NodeBootstrap(api_url="https://gpuprov.example:8080", join_token=TOKEN)
    ids = await launch(cloud, user_data="#!/bin/sh\necho hi\n", bootstrap=bootstrap)
    user_data = account.launches[0]["user_data"]
    assert isinstance(user_data, str)  # Lambda takes plain text only, so never gzip here
    read = cloudinit.processed(user_data)
    assert read.part_types() == ["text/x-shellscript", "text/cloud-config"]
    files = {entry["path"]: entry for entry in read.config["write_files"]}
    assert f"GPUPROV_JOIN_TOKEN={TOKEN}" in files[node_agent.JOIN_ENV_PATH]["content"]
    assert agent_artifact.sha256() in files[node_agent.UNIT_PATH]["content"]
    assert node_agent.FETCH_PATH in files and cloudinit.schema_errors(read.config) == ""
    assert TOKEN not in caplog.text and TOKEN not in json.dumps(ids)
    # On the wire: only the launch body carries it; not its URL or headers, no other request.
    sent = [request for request, _ in account.calls()]
    (launched,) = [r for r in sent if r.url.path.endswith("/instance-operations/launch")]
    assert carries(launched, TOKEN) and not carries(launched, TOKEN, body=False)
    assert_never_sent(TOKEN, [r for r in sent if r is not launched])


async def test_create_on_a_stockout_is_capacity_in_lambdas_words(account, cloud):
    account.launch_answers[("us-east-3", "gpu_8x_h100_sxm5")] = (400, fx.INSUFFICIENT_CAPACITY)
    with pytest.raises(ProviderError) as caught:
        await launch(cloud)
    assert caught.value.kind is ErrorKind.CAPACITY
    assert "instance-operations/launch/insufficient-capacity" in caught.value.message
    assert "Not enough capacity" in caught.value.message
    assert account.live() == []


LAUNCH_ERRORS = [
    (400, fx.QUOTA_EXCEEDED, {}, ErrorKind.QUOTA),
    (400, fx.INVALID_PARAMETERS, {}, ErrorKind.INVALID_REQUEST),
    (404, fx.LAUNCH_RESOURCE_MISSING, {}, ErrorKind.INVALID_REQUEST),
    (400, fx.FILE_SYSTEM_WRONG_REGION, {}, ErrorKind.INVALID_REQUEST),
    (401, fx.INVALID_API_KEY, {}, ErrorKind.CREDENTIALS),
    (403, fx.ACCOUNT_INACTIVE, {}, ErrorKind.CREDENTIALS),
    (403, fx.INVALID_ADDRESS, {}, ErrorKind.CREDENTIALS),
    (403, fx.FORBIDDEN, {}, ErrorKind.CREDENTIALS),
    (409, fx.CONFLICT, {}, ErrorKind.FAILED),
    (500, fx.INTERNAL, {}, ErrorKind.TRANSIENT),
    (503, fx.PROVIDER_UNAVAILABLE, {}, ErrorKind.TRANSIENT),
    (400, fx.PROVIDER_UNAVAILABLE, {}, ErrorKind.TRANSIENT),  # code beats status
    (429, None, {"Retry-After": "12"}, ErrorKind.TRANSIENT),
    (400, fx.error("instance-operations/launch/brand-new", "?"), {}, ErrorKind.FAILED),
]


@pytest.mark.parametrize(("status", "body", "headers", "kind"), LAUNCH_ERRORS)
async def test_launch_errors_are_classified_by_code(account, cloud, status, body, headers, kind):
    answer = httpx.Response(status, json=body, headers=headers) if body else None
    answer = answer or httpx.Response(status, text="slow down", headers=headers)
    account.router.post("/instance-operations/launch").mock(return_value=answer)
    with pytest.raises(ProviderError) as caught:
        await launch(cloud)
    assert caught.value.kind is kind
    if headers:
        assert caught.value.retry_after == 12.0


async def test_a_lost_launch_answer_is_transient_and_the_instance_is_found_by_name(account, cloud):
    real = account._launch

    def lost(request: httpx.Request) -> httpx.Response:
        real(request)
        raise httpx.ReadTimeout("timed out", request=request)

    account.router.post("/instance-operations/launch").mock(side_effect=lost)
    with pytest.raises(ProviderError) as caught:
        await launch(cloud)
    assert caught.value.kind is ErrorKind.TRANSIENT
    found = await cloud.observe(EAST, VM)  # what the core's retried create does first
    assert [o.id for o in found] == list(account.instances)


async def test_launches_are_spaced_by_the_minimum_interval_without_global_state(account):
    now = [1000.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    def client() -> object:
        return LambdaClient(
            fx.API_KEY,
            fx.BASE_URL,
            min_launch_interval=12.0,
            transport=account.transport(),
            clock=lambda: now[0],
            sleep=sleep,
        )

    body = {"region_name": "us-east-1", "instance_type_name": "gpu_8x_h100_sxm5",
            "ssh_key_names": ["ops-team"]}  # fmt: skip

    async def stockout(client) -> None:  # no capacity there: failed launches count too
        with pytest.raises(ProviderError):
            await client.launch(body)

    first, other = client(), client()
    await stockout(first)
    now[0] += 5
    await stockout(other)  # another adapter (account) keeps its own pace
    assert slept == []
    await asyncio.gather(stockout(first), stockout(first))
    assert slept == [7.0, 12.0]
    now[0] += 60
    await stockout(first)
    assert slept == [7.0, 12.0]
    assert len(account.launches) == 5
    await first.aclose()
    await other.aclose()


# ---------------------------------------------------------------- observe


async def test_observe_follows_booting_to_running_with_the_ssh_endpoint(account, cloud):
    (instance_id,) = await launch(cloud)
    (booting,) = await cloud.observe(EAST, VM)
    assert (booting.id, booting.status, booting.ssh) == (instance_id, InstanceStatus.PENDING, None)
    (running,) = await cloud.observe(EAST, VM)
    assert running.status is InstanceStatus.RUNNING
    assert running.ssh is not None and (running.ssh.user, running.ssh.port) == ("ubuntu", 22)
    assert running.ssh.host == account.instances[instance_id]["ip"]
    assert await cloud.observe(SOUTH, VM) == []  # same identity, other region: not here


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("booting", InstanceStatus.PENDING),
        ("terminating", InstanceStatus.STOPPING),
        ("unhealthy", InstanceStatus.FAILED),
        ("preempted", InstanceStatus.FAILED),
        ("terminated", None),
    ],
)
async def test_observe_maps_lambda_statuses(account, cloud, status, expected):
    account.plant(fx.instance("i1", status=status, tags=tagged(VM)))
    found = await cloud.observe(EAST, VM)
    assert [o.status for o in found] == ([expected] if expected else [])


async def test_observe_finds_by_name_or_tag_and_ignores_everything_else(account, cloud):
    account.plant(
        fx.instance("by-name", name=f"gpuprov-{VM}"),
        fx.instance("by-tag", name="renamed by a human", tags=tagged(VM)),
        fx.instance("other-vm", name="gpuprov-other-a1-n0-def456"),
        fx.instance("users", name="My Instance"),
        {"id": "weird", "status": 42},  # not ours: never read
    )
    assert sorted(o.id for o in await cloud.observe(EAST, VM)) == ["by-name", "by-tag"]


async def test_observe_reports_an_unreadable_instance_of_ours_instead_of_hiding_it(account, cloud):
    account.plant({"id": "bad", "name": f"gpuprov-{VM}", "status": 7})
    with pytest.raises(ProviderError) as caught:
        await cloud.observe(EAST, VM)
    assert caught.value.kind is ErrorKind.TRANSIENT and VM in caught.value.message


async def test_observe_region_lists_every_gpuprov_vm_of_the_region_in_one_call(account, cloud):
    await launch(cloud, "a-a1-n0-000001")
    await launch(cloud, "b-a1-n0-000002")
    await launch(cloud, "c-a1-n0-000003", offer_id="lambda/us-south-2/gpu_8x_h100_sxm5")
    account.plant(fx.instance("users", name="My Instance"))
    before = len(account.router.calls)
    listing = await cloud.observe_region(EAST)
    assert sorted(listing) == ["a-a1-n0-000001", "b-a1-n0-000002"]
    assert len(account.router.calls) == before + 1


# ---------------------------------------------------------------- delete


async def test_delete_terminates_one_id_per_call_and_gone_ids_are_success(account, cloud):
    (first,) = await launch(cloud)
    await cloud.delete(EAST, VM, [first, "0" * 32, first])
    terminate_bodies = [
        json.loads(call.request.content)
        for call in account.router.calls
        if call.request.url.path.endswith("/terminate")
    ]
    assert terminate_bodies == [{"instance_ids": [first]}, {"instance_ids": ["0" * 32]}]
    assert account.instances[first]["status"] == "terminating"


async def test_delete_tries_every_id_then_raises_the_first_failure(account, cloud):
    (instance_id,) = await launch(cloud)
    calls = []

    def flaky(request: httpx.Request) -> httpx.Response:
        ids = json.loads(request.content)["instance_ids"]
        calls.append(ids)
        if ids == ["broken"]:
            return httpx.Response(500, json=fx.INTERNAL)
        return account._terminate(request)

    account.router.post("/instance-operations/terminate").mock(side_effect=flaky)
    with pytest.raises(ProviderError) as caught:
        await cloud.delete(EAST, VM, ["broken", instance_id])
    assert caught.value.kind is ErrorKind.TRANSIENT
    assert calls == [["broken"], [instance_id]]
    assert account.instances[instance_id]["status"] == "terminating"


async def test_delete_with_a_revoked_key_is_credentials(account, cloud):
    account.router.post("/instance-operations/terminate").mock(
        return_value=httpx.Response(401, json=fx.INVALID_API_KEY)
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.delete(EAST, VM, ["x"])
    assert caught.value.kind is ErrorKind.CREDENTIALS


@pytest.mark.parametrize("route", ["terminate", "list"])
async def test_invalid_parameters_during_a_teardown_is_failed_so_the_teardown_gets_its_rounds(
    account, cloud, route
):
    # The vendor document's 400 for both calls is ApiErrorInvalidParameters; the parameters are
    # ours (instance ids), so the teardown is retried, not stopped as if the job's ask were bad.
    refusal = httpx.Response(400, json=fx.INVALID_PARAMETERS)
    if route == "terminate":
        account.router.post("/instance-operations/terminate").mock(return_value=refusal)
    else:
        account.router.get("/instances").mock(return_value=refusal)
    activities = CloudActivities({"lambda": cloud})
    failure = await activity_failure(activities.retire, VmInput(location=EAST, vm=VM, ids=["x"]))
    assert failure.type == ErrorKind.FAILED.value
    assert "global/invalid-parameters" in failure.message
    assert decide(Failure(ErrorKind(failure.type), Stage.TEARDOWN, rounds_done=1)).retry


# ---------------------------------------------------------------- diagnose


@pytest.mark.parametrize(
    ("status", "ip", "code", "severity", "verdict"),
    [
        ("preempted", "198.51.100.9", "preempted", Severity.CRITICAL, Verdict.UNHEALTHY),
        ("unhealthy", "198.51.100.9", "unhealthy", Severity.CRITICAL, Verdict.UNHEALTHY),
        ("booting", None, "booting", Severity.WARN, Verdict.DEGRADED),
        ("active", None, "no-public-ip", Severity.WARN, Verdict.DEGRADED),
        ("rebooting", None, "unknown-status", Severity.WARN, Verdict.DEGRADED),
    ],
)
async def test_diagnose_reads_lambdas_status(account, cloud, status, ip, code, severity, verdict):
    account.plant(fx.instance("i1", status=status, ip=ip, tags=tagged(VM)))
    diagnosis = await cloud.diagnose(EAST, VM)
    assert [(f.code, f.severity) for f in diagnosis.findings] == [(code, severity)]
    assert diagnosis.verdict is verdict


async def test_diagnose_healthy_gone_and_duplicates(account, cloud):
    assert (await cloud.diagnose(EAST, VM)).verdict is Verdict.GONE
    account.plant(fx.instance("i1", tags=tagged(VM)), fx.instance("i2", tags=tagged(VM)))
    assert (await cloud.diagnose(EAST, VM, "i1")).verdict is Verdict.HEALTHY
    both = await cloud.diagnose(EAST, VM)
    assert [f.code for f in both.findings] == ["duplicate"]
