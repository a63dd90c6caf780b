"""A job's `image` and `ports` on EC2, against moto (server mode, loopback) through the front:
the AMI RunInstances boots (an id, an SSM parameter, a name), and the job's ports as ingress
rules of the VM's own security group, gone with it at cleanup."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from providers.base import InstanceSpec, ResourceRequest
from providers.errors import ErrorKind, ProviderError
from tests.providers.aws.stack import (
    BOTO_CONFIG,
    MOTO_AMI,
    MOTO_IMAGE_NAME,
    REGION,
    aws_cloud,
    ec2,
    gpuprov_security_groups,
)

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

H100X8 = ResourceRequest(gpu="H100", gpus_per_node=8)
# Parameters moto serves as AWS publishes them (Amazon Linux, /aws/service/...).
AL2_X86 = "/aws/service/ami-amazon-linux-latest/amzn2-ami-hvm-x86_64-gp2"
AL2023_ARM = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-6.1-arm64"


def spec(**fields: Any) -> InstanceSpec:
    return InstanceSpec(vm="web-a1-n0-c0ffee", job="web", node_index=0, attempt=1, **fields)


def ssm_value(url: str, name: str) -> str:
    client = boto3.client(
        "ssm",
        region_name=REGION,
        endpoint_url=url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=BOTO_CONFIG,
    )
    return client.get_parameter(Name=name)["Parameter"]["Value"]


async def launch(front: Any, node: InstanceSpec, **config: Any) -> dict[str, Any]:
    """prepare + create on the first offer; what RunInstances was sent."""
    adapter = aws_cloud(front.url, **config)
    try:
        offer = (await adapter.plan(H100X8))[0]
        await adapter.create(offer, await adapter.prepare(offer, node), node)
    finally:
        await adapter.aclose()
    (run,) = front.requests("RunInstances")
    return run.params


async def test_an_ami_id_the_job_names_is_booted_instead_of_the_configured_one(front):
    chosen = ssm_value(front.upstream, AL2_X86)
    assert chosen != MOTO_AMI
    sent = await launch(front, spec(image=chosen))
    assert sent["ImageId"] == chosen
    # the root volume is sized on the AMI's own root device (Amazon Linux: /dev/xvda)
    assert sent["BlockDeviceMapping.1.DeviceName"] == "/dev/xvda"
    (lookup,) = front.requests("DescribeImages")
    assert lookup.params["ImageId.1"] == chosen


async def test_resolve_ssm_reads_the_ami_id_from_parameter_store(front):
    sent = await launch(front, spec(image=f"resolve:ssm:{AL2_X86}"))
    (read,) = front.requests("GetParameter")
    assert read.json_body == {"Name": AL2_X86} and read.region == REGION
    assert sent["ImageId"] == ssm_value(front.upstream, AL2_X86)


async def test_a_name_the_job_gives_is_looked_up_even_where_an_ami_is_configured(front):
    sent = await launch(front, spec(image=MOTO_IMAGE_NAME), images={REGION: "ami-00000000"})
    (lookup,) = front.requests("DescribeImages")
    assert lookup.params["Filter.1.Name"] == "name"
    assert lookup.params["Filter.1.Value.1"] == MOTO_IMAGE_NAME
    assert sent["ImageId"].startswith("ami-")


async def test_an_ami_for_another_architecture_is_unavailable_for_that_offer(front):
    adapter = aws_cloud(front.url)
    try:
        offer = (await adapter.plan(H100X8))[0]  # p5.48xlarge: x86_64
        with pytest.raises(ProviderError) as caught:
            await adapter.prepare(offer, spec(image=f"resolve:ssm:{AL2023_ARM}"))
    finally:
        await adapter.aclose()
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert "arm64" in caught.value.message and "x86_64" in caught.value.message
    assert front.requests("CreateSecurityGroup") == []  # nothing made for it


@pytest.mark.parametrize(
    ("image", "needle"),
    [
        ("resolve:ssm:/gpuprov/no-such-parameter", "ParameterNotFound"),
        ("ami-0123456789abcdef0", "InvalidAMIID.NotFound"),
    ],
)
async def test_an_image_aws_does_not_know_is_an_invalid_request(front, image, needle):
    adapter = aws_cloud(front.url)
    try:
        offer = (await adapter.plan(H100X8))[0]
        with pytest.raises(ProviderError) as caught:
            await adapter.prepare(offer, spec(image=image))
    finally:
        await adapter.aclose()
    assert caught.value.kind is ErrorKind.INVALID_REQUEST
    assert needle in caught.value.message


async def test_the_jobs_ports_are_ingress_rules_of_the_vms_group_gone_at_cleanup(front):
    adapter = aws_cloud(front.url, ports_cidrs=["203.0.113.0/24"])
    node = spec(ports=[8002, 8000, 8001, 9000, 22])
    try:
        offer = (await adapter.plan(H100X8))[0]
        prepared = await adapter.prepare(offer, node)
        assert await adapter.prepare(offer, node) == prepared  # a repeat adds nothing
        (group,) = ec2(front.upstream).describe_security_groups(
            GroupIds=[prepared["security_group_id"]]
        )["SecurityGroups"]
        rules = {
            (rule["FromPort"], rule["ToPort"]): [r["CidrIp"] for r in rule["IpRanges"]]
            for rule in group["IpPermissions"]
        }
        # SSH keeps its own rule (ssh_cidrs); the job's ports are ranges from ports_cidrs
        assert rules == {
            (22, 22): ["0.0.0.0/0"],
            (8000, 8002): ["203.0.113.0/24"],
            (9000, 9000): ["203.0.113.0/24"],
        }
        authorize = front.requests("AuthorizeSecurityGroupIngress")
        assert len(authorize) == 4  # SSH and the job's ports, twice (the repeat: Duplicate)
        assert all(seen.params["IpPermissions.1.IpProtocol"] == "tcp" for seen in authorize)
        await adapter.create(offer, prepared, node)
        (run,) = front.requests("RunInstances")
        assert run.params["SecurityGroupId.1"] == prepared["security_group_id"]

        await adapter.cleanup(offer.location, node.vm)
        await adapter.cleanup(offer.location, node.vm)  # idempotent
    finally:
        await adapter.aclose()
    assert gpuprov_security_groups(front.upstream) == []  # the group, rules and all


async def test_without_ports_the_group_opens_ssh_only(front):
    adapter = aws_cloud(front.url)
    try:
        offer = (await adapter.plan(H100X8))[0]
        prepared = await adapter.prepare(offer, spec())
    finally:
        await adapter.aclose()
    (group,) = ec2(front.upstream).describe_security_groups(
        GroupIds=[prepared["security_group_id"]]
    )["SecurityGroups"]
    assert [(r["FromPort"], r["ToPort"]) for r in group["IpPermissions"]] == [(22, 22)]
    assert len(front.requests("AuthorizeSecurityGroupIngress")) == 1


def test_aws_declares_neither_image_nor_ports_unsupported():
    hints = aws_cloud("http://127.0.0.1:9").capabilities()
    assert not {"image", "ports"} & set(hints.unsupported)
