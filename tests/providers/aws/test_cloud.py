"""The AWS adapter against moto's EC2 (server mode, loopback), through the recording front:
plan, prepare, create, observe, observe_region, delete, cleanup, diagnose — the happy paths."""

from __future__ import annotations

import base64
import re

import pytest

from providers import node_agent
from providers.aws.cloud import client_token
from providers.aws.pricing import ON_DEMAND_SOURCE, SPOT_SOURCE
from providers.base import (
    InstanceSpec,
    InstanceStatus,
    Location,
    NodeBootstrap,
    ResourceRequest,
    Verdict,
)
from tests import cloudinit
from tests.providers.aws.conftest import P5_PRICE
from tests.providers.aws.stack import (
    MOTO_IMAGE_NAME,
    REGION,
    aws_cloud,
    ec2,
    gpuprov_key_pairs,
    gpuprov_security_groups,
    live_instances,
)

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

H100X8 = ResourceRequest(gpu="H100", gpus_per_node=8)
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl t"


def spec(vm: str = "train-a1-n0-c0ffee", **fields) -> InstanceSpec:
    return InstanceSpec(vm=vm, job="train", node_index=0, attempt=1, **fields)


@pytest.fixture
async def cloud(front):
    adapter = aws_cloud(front.url)
    yield adapter
    await adapter.aclose()


async def test_plan_offers_each_zone_with_shapes_from_ec2_and_the_price_list_price(cloud, front):
    offers = await cloud.plan(H100X8)
    assert [o.id for o in offers] == ["aws/us-east-1a/p5.48xlarge", "aws/us-east-1b/p5.48xlarge"]
    first = offers[0]
    assert (first.provider, first.region, first.zone) == ("aws", REGION, "us-east-1a")
    assert (first.gpu_name, first.gpu_count, first.gpu_memory_gb) == ("NVIDIA H100", 8, 80.0)
    assert (first.vcpus, first.memory_gb, first.disk_gb) == (192, 2048.0, 200.0)
    assert first.price is not None
    assert (first.price.amount, first.price.source) == (P5_PRICE, ON_DEMAND_SOURCE)
    assert first.detail == {
        "instance_type": "p5.48xlarge",
        "architecture": "x86_64",
        "root_volume_gb": 200,
    }
    (lookup,) = front.requests("GetProducts")  # one per (region, type), then cached
    filters = {f["Field"]: f["Value"] for f in lookup.json_body["Filters"]}
    assert lookup.json_body["ServiceCode"] == "AmazonEC2"
    assert filters["instanceType"] == "p5.48xlarge" and filters["regionCode"] == REGION
    assert filters["operatingSystem"] == "Linux" and filters["tenancy"] == "Shared"
    assert lookup.region == "us-east-1"  # the Price List endpoint's region

    again = await cloud.plan(H100X8)
    assert [o.id for o in again] == [o.id for o in offers]
    assert len(front.requests("DescribeInstanceTypes")) == 1  # the catalogue is cached
    assert len(front.requests("GetProducts")) == 1


async def test_plan_leaves_an_offer_unpriced_when_the_price_list_has_no_price(front):
    front.prices.clear()
    adapter = aws_cloud(front.url)
    try:
        offers = await adapter.plan(H100X8)
    finally:
        await adapter.aclose()
    assert offers and all(o.price is None for o in offers)


async def test_spot_offers_are_priced_per_zone_from_the_spot_price_history(front):
    adapter = aws_cloud(front.url, spot=True, zones={})
    try:
        offers = await adapter.plan(H100X8.model_copy(update={"spot": True}))
    finally:
        await adapter.aclose()
    spot = [o for o in offers if o.spot]
    assert spot and all(o.id.endswith("/spot") and o.detail["spot"] is True for o in spot)
    # moto's history has every zone but us-east-1e (a dummy 0.00001): exactly those are priced.
    history = ec2(front.upstream).describe_spot_price_history(InstanceTypes=["p5.48xlarge"])
    zones = {entry["AvailabilityZone"] for entry in history["SpotPriceHistory"]}
    assert {o.zone for o in spot if o.price} == zones
    priced = [o for o in spot if o.price]
    assert priced and all(o.price.source == SPOT_SOURCE for o in priced if o.price)
    # on-demand offers the spot job cannot use are not priced (no Price List call at all)
    assert front.requests("GetProducts") == []


async def test_plan_only_asks_the_regions_the_request_allows(front):
    adapter = aws_cloud(
        front.url, regions=[REGION, "eu-west-1"], zones={}, instance_types=["g5.xlarge"]
    )
    try:
        offers = await adapter.plan(ResourceRequest(gpu="A10G", regions=["eu-west-1"]))
    finally:
        await adapter.aclose()
    assert offers and {o.region for o in offers} == {"eu-west-1"}
    assert {seen.region for seen in front.requests("DescribeInstanceTypeOfferings")} == {
        "eu-west-1"
    }


async def test_prepare_opens_ssh_in_a_per_vm_group_and_imports_the_key_idempotently(cloud, front):
    offer = (await cloud.plan(H100X8))[0]
    node = spec(ssh_public_key=PUBLIC_KEY)
    prepared = await cloud.prepare(offer, node)
    assert await cloud.prepare(offer, node) == prepared  # Duplicate codes are success
    assert prepared["image_id"] == "ami-1e749f67" and prepared["root_device"] == "/dev/sda1"
    assert prepared["key_name"] == "gpuprov-train-a1-n0-c0ffee"
    (group,) = ec2(front.upstream).describe_security_groups(
        GroupIds=[prepared["security_group_id"]]
    )["SecurityGroups"]
    assert group["GroupName"] == "gpuprov-train-a1-n0-c0ffee"
    assert {"Key": "gpuprov-vm", "Value": node.vm} in group["Tags"]
    (rule,) = group["IpPermissions"]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 22, 22)
    assert [r["CidrIp"] for r in rule["IpRanges"]] == ["0.0.0.0/0"]
    assert gpuprov_key_pairs(front.upstream) == ["gpuprov-train-a1-n0-c0ffee"]
    assert len(front.requests("CreateSecurityGroup")) == 2
    assert len(front.requests("DescribeSecurityGroups")) == 1  # found again after Duplicate


async def test_prepare_finds_the_newest_image_by_name_for_the_architecture(front):
    adapter = aws_cloud(front.url, images={}, image_name=MOTO_IMAGE_NAME)
    try:
        offer = (await adapter.plan(H100X8))[0]
        prepared = await adapter.prepare(offer, spec())
    finally:
        await adapter.aclose()
    (lookup,) = front.requests("DescribeImages")
    assert lookup.params["Owner.1"] == "amazon"
    assert lookup.params["Filter.1.Value.1"] == MOTO_IMAGE_NAME
    assert lookup.params["Filter.3.Name"] == "architecture"
    assert lookup.params["Filter.3.Value.1"] == "x86_64"
    assert prepared["image_id"].startswith("ami-")
    assert prepared["key_name"] is None  # no key from the job, none configured


async def test_create_launches_one_tagged_instance_with_the_bootstrap_as_user_data(cloud, front):
    offer = (await cloud.plan(H100X8))[0]
    node = spec(ssh_public_key=PUBLIC_KEY, labels={"gpuprov-job": "train"})
    node = node.model_copy(
        update={"bootstrap": NodeBootstrap(api_url="https://api.test", join_token="tok-s3cret")}
    )
    prepared = await cloud.prepare(offer, node)
    ids = await cloud.create(offer, prepared, node)
    assert len(ids) == 1 and ids[0].startswith("i-")
    (run,) = front.requests("RunInstances")
    sent = run.params
    assert sent["ClientToken"] == client_token(node)
    assert re.fullmatch(r"[\x21-\x7e]{1,64}", sent["ClientToken"])
    assert (sent["MinCount"], sent["MaxCount"]) == ("1", "1")
    assert sent["InstanceType"] == "p5.48xlarge" and sent["ImageId"] == "ami-1e749f67"
    assert sent["Placement.AvailabilityZone"] == "us-east-1a"
    assert sent["SecurityGroupId.1"] == prepared["security_group_id"]
    assert sent["KeyName"] == "gpuprov-train-a1-n0-c0ffee"
    assert sent["BlockDeviceMapping.1.Ebs.VolumeSize"] == "200"
    assert sent["MetadataOptions.HttpTokens"] == "required"
    assert sent["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert "InstanceMarketOptions.MarketType" not in sent
    tag_specs = {sent[f"TagSpecification.{n}.ResourceType"] for n in (1, 2)}
    assert tag_specs == {"instance", "volume"}
    # The node agent's fetch-and-verify step and unit ride in the user data, gzip-compressed
    # (cloud-init undoes it before reading it), far within EC2's 16 KB:
    # tests/providers/test_node_agent.py runs the largest case.
    user_data = base64.b64decode(sent["UserData"])
    assert len(user_data) <= 16 * 1024
    read = cloudinit.processed(user_data)
    assert read.part_types() == ["text/cloud-config"]
    files = {entry["path"]: entry for entry in read.config["write_files"]}
    assert "GPUPROV_JOIN_TOKEN=tok-s3cret" in files["/etc/gpuprov/join.env"]["content"]
    assert files["/etc/gpuprov/join.env"]["permissions"] == "0600"
    assert node_agent.FETCH_PATH in files and node_agent.UNIT_PATH in files
    start = node_agent.unit_command(files[node_agent.UNIT_PATH]["content"], "ExecStart")
    assert "--notices ec2" in " ".join(start)  # the agent watches IMDSv2's spot notices
    assert cloudinit.schema_errors(read.config) == ""
    stored = ec2(front.upstream).describe_instance_attribute(
        InstanceId=ids[0], Attribute="userData"
    )["UserData"]["Value"]
    assert base64.b64decode(stored) == user_data  # what EC2 keeps (and shows, see aws.md)
    assert "tok-s3cret" not in repr(ids) + repr(prepared) + repr(offer)
    (launched,) = live_instances(front.upstream)
    tags = {t["Key"]: t["Value"] for t in launched["Tags"]}
    assert tags == {
        "gpuprov-vm": node.vm,
        "Name": "gpuprov-train-a1-n0-c0ffee",
        "gpuprov-job": "train",
    }
    volume = ec2(front.upstream).describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": ids}]
    )["Volumes"][0]
    assert {"Key": "gpuprov-vm", "Value": node.vm} in volume["Tags"]


async def test_a_spot_offer_launches_a_one_time_spot_instance(front):
    adapter = aws_cloud(front.url, spot=True)
    try:
        offers = await adapter.plan(H100X8.model_copy(update={"spot": True}))
        offer = next(o for o in offers if o.spot)
        await adapter.create(offer, await adapter.prepare(offer, spec()), spec())
    finally:
        await adapter.aclose()
    (run,) = front.requests("RunInstances")
    assert run.params["InstanceMarketOptions.MarketType"] == "spot"
    assert run.params["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert "InstanceInitiatedShutdownBehavior" not in run.params


async def test_observe_finds_the_vm_by_tag_and_reports_ssh_then_gone_after_delete(cloud, front):
    offer = (await cloud.plan(H100X8))[0]
    mine, other = spec(), spec("train-a1-n1-c0ffee")
    ids = await cloud.create(offer, await cloud.prepare(offer, mine), mine)
    other_ids = await cloud.create(offer, await cloud.prepare(offer, other), other)
    where = Location(provider="aws", region=REGION, zone="us-east-1a")

    (seen,) = await cloud.observe(where, mine.vm)
    assert seen.id == ids[0] and seen.status is InstanceStatus.RUNNING
    assert seen.ssh is not None and seen.ssh.user == "ubuntu" and seen.ssh.port == 22
    launched = {i["InstanceId"]: i for i in live_instances(front.upstream)}
    assert seen.ssh.host == launched[ids[0]]["PublicIpAddress"]
    region = await cloud.observe_region(where)
    assert {vm: [o.id for o in found] for vm, found in region.items()} == {
        mine.vm: ids,
        other.vm: other_ids,
    }
    (listing,) = front.requests("DescribeInstances")[-1:]
    assert listing.params["Filter.1.Name"] == "tag-key"

    await cloud.delete(where, mine.vm, ids)
    assert await cloud.observe(where, mine.vm) == []  # terminated is gone
    assert list(await cloud.observe_region(where)) == [other.vm]
    await cloud.delete(where, mine.vm, ids)  # deleting again is fine


async def test_delete_with_an_unknown_id_still_terminates_the_known_ones(cloud, front):
    offer = (await cloud.plan(H100X8))[0]
    node = spec()
    ids = await cloud.create(offer, await cloud.prepare(offer, node), node)
    where = offer.location
    await cloud.delete(where, node.vm, ["i-0123456789abcdef0", *ids])
    assert await cloud.observe(where, node.vm) == []
    assert len(front.requests("TerminateInstances")) == 3  # batch, then one by one


async def test_cleanup_removes_only_this_vms_group_and_key(cloud, front):
    offer = (await cloud.plan(H100X8))[0]
    mine, other = spec(ssh_public_key=PUBLIC_KEY), spec("train-a1-n1-c0ffee")
    await cloud.prepare(offer, mine)
    await cloud.prepare(offer, other)
    user = ec2(front.upstream)
    user.import_key_pair(KeyName="alice-laptop", PublicKeyMaterial=PUBLIC_KEY.encode())
    # a group that borrows our naming but not our tag is never touched
    user.create_security_group(GroupName="gpuprov-not-ours", Description="someone else's")

    await cloud.cleanup(offer.location, mine.vm)
    await cloud.cleanup(offer.location, mine.vm)  # idempotent
    await cloud.cleanup(offer.location, "not-ours")
    assert sorted(gpuprov_security_groups(front.upstream)) == [
        "gpuprov-not-ours",
        "gpuprov-train-a1-n1-c0ffee",
    ]
    assert gpuprov_key_pairs(front.upstream) == []
    pairs = user.describe_key_pairs()["KeyPairs"]
    assert [p["KeyName"] for p in pairs] == ["alice-laptop"]


async def test_diagnose_a_healthy_vm_and_a_gone_one(cloud, front):
    offer = (await cloud.plan(H100X8))[0]
    node = spec()
    ids = await cloud.create(offer, await cloud.prepare(offer, node), node)
    healthy = await cloud.diagnose(offer.location, node.vm)
    assert healthy.verdict is Verdict.HEALTHY and healthy.instance is not None
    (status_call,) = front.requests("DescribeInstanceStatus")
    assert status_call.params["IncludeAllInstances"] == "true"
    await cloud.delete(offer.location, node.vm, ids)
    gone = await cloud.diagnose(offer.location, node.vm)
    assert gone.verdict is Verdict.GONE


def test_capabilities_carry_the_configured_timing_hints():
    nowhere = "http://127.0.0.1:9"  # neither needs a call
    hints = aws_cloud(nowhere, boot_timeout=321, delete_timeout=123).capabilities()
    assert (hints.boot_timeout, hints.delete_timeout, hints.poll_interval) == (321, 123, 0.05)
    assert hints.node_agent is True and hints.cloud_init is True  # the agent is in the user data
    # EC2 Linux: per second, at least 60 s (AWS's per-second billing announcement).
    assert (hints.billing.granularity_seconds, hints.billing.minimum_seconds) == (1, 60)
    assert aws_cloud(nowhere, regions=["us-west-2", REGION], zones={}).sweep_regions() == [
        "us-west-2",
        REGION,
    ]
