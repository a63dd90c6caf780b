"""The adapter against recorded EC2 answers served over loopback HTTP: stockouts, quotas,
throttling, credentials, idempotency (moto does not de-duplicate ClientToken), pagination,
partial failures, and hostile bodies. Each error must reach the core classified, and the SDK
must not retry anything on its own."""

from __future__ import annotations

import json
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from providers.aws.cloud import client_token
from providers.base import (
    InstanceSpec,
    InstanceStatus,
    Location,
    NodeBootstrap,
    Offer,
    ResourceRequest,
    Severity,
)
from providers.errors import ErrorKind, ProviderError
from tests.providers.aws.stack import (
    REGION,
    Reply,
    Seen,
    aws_cloud,
    error_reply,
    recorded,
)

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

VM = "train-a1-n0-c0ffee"
WHERE = Location(provider="aws", region=REGION, zone="us-east-1a")
OFFER = Offer(
    id="aws/us-east-1a/p5.48xlarge",
    provider="aws",
    region=REGION,
    zone="us-east-1a",
    instance_type="p5.48xlarge",
    gpu_name="NVIDIA H100",
    gpu_count=8,
    detail={"instance_type": "p5.48xlarge", "architecture": "x86_64", "root_volume_gb": 200},
)
PREPARED = {
    "image_id": "ami-0abcdef1234567890",
    "root_device": "/dev/sda1",
    "security_group_id": "sg-0123456789abcdef0",
    "key_name": None,
}


def spec(attempt: int = 1, token: str = "tok-1") -> InstanceSpec:
    node = InstanceSpec(vm=VM, job="train", node_index=0, attempt=attempt)
    return node.model_copy(
        update={"bootstrap": NodeBootstrap(api_url="https://api.test", join_token=token)}
    )


def instances_page(instance: str, state: str = "running", next_token: str = "", **extra: str):
    codes = {"pending": "0", "running": "16", "stopped": "80", "terminated": "48"}
    values = {
        "instance": instance,
        "vm": VM,
        "state": state,
        "state_code": codes[state],
        "ip": "54.210.1.2",
        "dashed_ip": "54-210-1-2",
        "transition": "",
        "state_reason": "",
        "next_token": f"<nextToken>{next_token}</nextToken>" if next_token else "",
    }
    values.update(extra)
    return Reply(200, recorded("describe_instances_page.xml", **values))


@pytest.fixture
async def cloud(bare_front):
    adapter = aws_cloud(bare_front.url)
    yield adapter
    await adapter.aclose()


async def test_a_stockout_is_capacity_with_the_clouds_words_and_one_request(cloud, bare_front):
    bare_front.answer("RunInstances", error_reply(500, "insufficient_instance_capacity.xml"))
    with pytest.raises(ProviderError) as raised:
        await cloud.create(OFFER, PREPARED, spec())
    assert raised.value.kind is ErrorKind.CAPACITY
    assert "InsufficientInstanceCapacity: We currently do not have sufficient" in str(raised.value)
    assert len(bare_front.requests("RunInstances")) == 1  # the SDK did not retry the 500


@pytest.mark.parametrize(
    ("fixture", "status", "kind"),
    [
        ("vcpu_limit_exceeded.xml", 400, ErrorKind.QUOTA),
        ("max_spot_instance_count_exceeded.xml", 400, ErrorKind.QUOTA),
        ("unsupported.xml", 400, ErrorKind.UNAVAILABLE),
        ("request_limit_exceeded.xml", 503, ErrorKind.TRANSIENT),
        ("internal_error.xml", 500, ErrorKind.TRANSIENT),
        ("auth_failure.xml", 401, ErrorKind.CREDENTIALS),
        ("unauthorized_operation.xml", 403, ErrorKind.CREDENTIALS),
        ("idempotent_parameter_mismatch.xml", 400, ErrorKind.FAILED),
    ],
)
async def test_create_errors_are_classified_and_never_retried_by_the_sdk(
    cloud, bare_front, fixture, status, kind
):
    bare_front.answer("RunInstances", error_reply(status, fixture))
    with pytest.raises(ProviderError) as raised:
        await cloud.create(OFFER, PREPARED, spec())
    assert raised.value.kind is kind
    assert len(bare_front.requests("RunInstances")) == 1


class IdempotentEc2:
    """RunInstances as EC2 documents ClientToken: the same token with the same parameters
    answers the first launch again; with other parameters, IdempotentParameterMismatch."""

    def __init__(self) -> None:
        self.launched: dict[str, tuple[dict[str, str], str]] = {}

    def __call__(self, seen: Seen) -> Reply:
        token = seen.params["ClientToken"]
        params = {k: v for k, v in seen.params.items() if k != "ClientToken"}
        if token not in self.launched:
            self.launched[token] = (params, f"i-{len(self.launched):017x}")
        first, instance = self.launched[token]
        if first != params:
            return error_reply(400, "idempotent_parameter_mismatch.xml")
        return Reply(200, recorded("run_instances.xml", instance=instance, vm=VM, token=token))


async def test_a_retried_create_reuses_its_client_token_and_gets_the_same_instance(
    cloud, bare_front
):
    ec2 = IdempotentEc2()
    bare_front.answer("RunInstances", ec2)
    first = await cloud.create(OFFER, PREPARED, spec())
    again = await cloud.create(OFFER, PREPARED, spec())
    assert first == again == ["i-00000000000000000"]
    assert len(ec2.launched) == 1
    tokens = {seen.params["ClientToken"] for seen in bare_front.requests("RunInstances")}
    assert tokens == {client_token(spec())}
    # another attempt of the same node is another launch
    assert await cloud.create(OFFER, PREPARED, spec(attempt=2)) == ["i-00000000000000001"]


async def test_a_retry_with_other_parameters_under_the_same_token_is_failed(cloud, bare_front):
    bare_front.answer("RunInstances", IdempotentEc2())
    await cloud.create(OFFER, PREPARED, spec(token="tok-1"))
    with pytest.raises(ProviderError) as raised:  # a new join token: other user data
        await cloud.create(OFFER, PREPARED, spec(token="tok-2"))
    assert raised.value.kind is ErrorKind.FAILED
    assert "IdempotentParameterMismatch" in raised.value.message
    assert "tok-" not in raised.value.message  # user data never in a message


def test_client_tokens_are_short_ascii_and_distinct_per_vm_and_attempt():
    tokens = {
        client_token(InstanceSpec(vm=vm, job="j", node_index=0, attempt=attempt))
        for vm in ("a" * 300, "b-a1-n0-000000", "b-a1-n1-000000")
        for attempt in (1, 2)
    }
    assert len(tokens) == 6
    assert all(len(token) <= 64 and token.isascii() for token in tokens)


async def test_observe_reads_every_page_of_describe_instances(cloud, bare_front):
    pages = iter([instances_page("i-1", next_token="page-2"), instances_page("i-2", "pending")])
    bare_front.answer("DescribeInstances", lambda seen: next(pages))
    found = await cloud.observe(WHERE, VM)
    assert [(o.id, o.status) for o in found] == [
        ("i-1", InstanceStatus.RUNNING),
        ("i-2", InstanceStatus.PENDING),
    ]
    first, second = bare_front.requests("DescribeInstances")
    assert "NextToken" not in first.params and second.params["NextToken"] == "page-2"
    assert first.params["Filter.1.Name"] == "tag:gpuprov-vm"
    assert first.params["Filter.1.Value.1"] == VM
    assert first.params["Filter.2.Name"] == "instance-state-name"
    assert "terminated" not in [v for k, v in first.params.items() if k.startswith("Filter.2")]


async def test_a_throttled_observe_is_transient(cloud, bare_front):
    bare_front.answer("DescribeInstances", error_reply(503, "request_limit_exceeded.xml"))
    with pytest.raises(ProviderError) as raised:
        await cloud.observe_region(WHERE)
    assert raised.value.kind is ErrorKind.TRANSIENT


async def test_a_missing_image_is_invalid_request(cloud, bare_front):
    bare_front.answer("DescribeImages", error_reply(400, "invalid_ami_not_found.xml"))
    with pytest.raises(ProviderError) as raised:
        await cloud.prepare(OFFER, spec())
    assert raised.value.kind is ErrorKind.INVALID_REQUEST


async def test_diagnose_reports_a_spot_interruption_and_impaired_checks(cloud, bare_front):
    reason = (
        "<stateReason><code>Server.SpotInstanceTermination</code>"
        "<message>Server.SpotInstanceTermination: Spot instance termination</message>"
        "</stateReason>"
    )
    bare_front.answer("DescribeInstances", instances_page("i-1", "stopped", state_reason=reason))
    status = recorded("describe_instance_status.xml", instance="i-1")
    bare_front.answer("DescribeInstanceStatus", Reply(200, status))
    diagnosis = await cloud.diagnose(WHERE, VM)
    codes = {(f.severity, f.code) for f in diagnosis.findings}
    assert (Severity.CRITICAL, "spot-interrupted") in codes
    assert (Severity.CRITICAL, "failed") in codes  # stopped
    assert (Severity.CRITICAL, "system-status-impaired") in codes
    assert (Severity.WARN, "scheduled-instance-retirement") in codes
    assert not any(code == "scheduled-system-reboot" for _, code in codes)  # [Completed]


async def test_a_terminated_instance_is_gone_but_diagnose_still_says_why(cloud, bare_front):
    reason = (
        "<stateReason><code>Server.InsufficientInstanceCapacity</code>"
        "<message>Server.InsufficientInstanceCapacity: Insufficient capacity.</message>"
        "</stateReason>"
    )
    bare_front.answer("DescribeInstances", instances_page("i-1", "terminated", state_reason=reason))
    assert await cloud.observe(WHERE, VM) == []
    diagnosis = await cloud.diagnose(WHERE, VM)
    assert diagnosis.instance is None
    assert [f.code for f in diagnosis.findings] == ["capacity"]
    assert bare_front.requests("DescribeInstanceStatus") == []


async def test_an_unreachable_endpoint_is_transient():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    adapter = aws_cloud(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(ProviderError) as raised:
            await adapter.observe(WHERE, VM)
    finally:
        await adapter.aclose()
    assert raised.value.kind is ErrorKind.TRANSIENT


# ---------------------------------------------------------------- hostile bodies

RUN_OK = recorded("run_instances.xml", instance="i-0123456789abcdef0", vm=VM, token="t")
LIST_OK = instances_page("i-1").body
hostile_bodies = (
    st.integers(min_value=0, max_value=len(RUN_OK)).map(lambda n: RUN_OK[:n])
    | st.integers(min_value=0, max_value=len(LIST_OK)).map(lambda n: LIST_OK[:n])
    | st.binary(max_size=64)
    | st.sampled_from(
        [
            b"<Response/>",
            b"<RunInstancesResponse><instancesSet><item/></instancesSet></RunInstancesResponse>",
            LIST_OK.replace(b"running", b"\xff\xfe"),
            LIST_OK.replace(b"<instanceId>i-1</instanceId>", b""),
            b'{"PriceList": 7}',
        ]
    )
)


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=hostile_bodies, status=st.sampled_from([200, 200, 400, 500, 503]))
async def test_hostile_answers_become_classified_errors_never_other_exceptions(
    cloud, bare_front, body, status
):
    bare_front.rules.clear()
    for action in ("RunInstances", "DescribeInstances"):
        bare_front.answer(action, Reply(status, body))
    for call in (
        lambda: cloud.create(OFFER, PREPARED, spec()),
        lambda: cloud.observe(WHERE, VM),
    ):
        try:
            result = await call()
        except ProviderError:
            continue
        assert isinstance(result, list)


async def test_a_throttled_price_list_leaves_offers_unpriced_instead_of_failing_the_plan(front):
    throttled = json.dumps({"__type": "ThrottlingException", "Message": "Rate exceeded"})
    front.answer("GetProducts", Reply(400, throttled.encode(), "application/x-amz-json-1.1"))
    adapter = aws_cloud(front.url)
    try:
        offers = await adapter.plan(ResourceRequest(gpu="H100", gpus_per_node=8))
    finally:
        await adapter.aclose()
    assert offers and all(o.price is None for o in offers)


async def test_plan_keeps_the_regions_that_answer_and_fails_only_when_none_do(front):
    opt_in = error_reply(401, "error.xml", code="OptInRequired", message="not subscribed")
    front.answer("DescribeInstanceTypeOfferings", opt_in, region="eu-west-1")
    adapter = aws_cloud(front.url, regions=[REGION, "eu-west-1"], zones={})
    try:
        offers = await adapter.plan(ResourceRequest(gpu="H100", gpus_per_node=8))
        assert offers and {o.region for o in offers} == {REGION}

        denied = error_reply(401, "auth_failure.xml")
        front.rules.clear()
        front.answer("DescribeInstanceTypeOfferings", denied)
        fresh = aws_cloud(front.url, regions=["us-west-2", "eu-west-1"], zones={})
        with pytest.raises(ProviderError) as raised:
            await fresh.plan(ResourceRequest(gpu="H100"))
        await fresh.aclose()
    finally:
        await adapter.aclose()
    assert raised.value.kind is ErrorKind.CREDENTIALS


async def test_cleanup_waits_out_a_group_still_in_use(front):
    adapter = aws_cloud(front.url)
    try:
        node = spec()
        await adapter.prepare(OFFER.model_copy(update={"detail": OFFER.detail}), node)
        busy = error_reply(400, "dependency_violation.xml", group="sg-1")
        front.answer("DeleteSecurityGroup", busy, times=1)
        with pytest.raises(ProviderError) as raised:
            await adapter.cleanup(WHERE, VM)
        assert raised.value.kind is ErrorKind.TRANSIENT
        await adapter.cleanup(WHERE, VM)  # the retry succeeds
        assert len(front.requests("DeleteSecurityGroup")) == 2
    finally:
        await adapter.aclose()
