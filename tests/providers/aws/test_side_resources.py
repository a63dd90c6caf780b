"""observe_side_resources on AWS: the per-VM security groups and key pairs prepare made, listed
by the gpuprov-vm tag, from EC2's documented response documents and against moto."""

from __future__ import annotations

import pytest

from providers.base import InstanceSpec, Location, ResourceRequest
from providers.errors import ErrorKind, ProviderError
from tests.providers.aws.stack import REGION, Reply, aws_cloud, ec2, recorded

HERE = Location(provider="aws", region=REGION)
VM = "train-a1-n0-c0ffee"
OTHER = "train-a1-n1-c0ffee"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl t"


def groups_page(vm: str, group_id: str, name: str | None = None, next_token: str = "") -> Reply:
    return Reply(
        200,
        recorded(
            "describe_security_groups_page.xml",
            vm=vm,
            group_id=group_id,
            group_name=name or f"gpuprov-{vm}",
            next_token=f"<nextToken>{next_token}</nextToken>" if next_token else "",
        ),
    )


def key_pairs(vm: str, name: str | None = None) -> Reply:
    return Reply(200, recorded("describe_key_pairs.xml", vm=vm, key_name=name or f"gpuprov-{vm}"))


@pytest.fixture
async def recorded_cloud(bare_front):
    adapter = aws_cloud(bare_front.url)
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def cloud(front):
    adapter = aws_cloud(front.url)
    yield adapter
    await adapter.aclose()


async def test_groups_and_key_pairs_are_listed_by_tag_across_pages(recorded_cloud, bare_front):
    """Two pages of groups, then the key pairs; a group carrying our tag under another name
    (not one cleanup would delete) is left out."""
    bare_front.answer(
        "DescribeSecurityGroups", groups_page(VM, "sg-0aaa", next_token="t2"), times=1
    )
    bare_front.answer(
        "DescribeSecurityGroups", groups_page(OTHER, "sg-0bbb"), times=1, NextToken="t2"
    )
    bare_front.answer("DescribeKeyPairs", key_pairs(VM))

    listed = await recorded_cloud.observe_side_resources(HERE)

    assert listed == {
        VM: [f"security-group sg-0aaa gpuprov-{VM}", f"key-pair gpuprov-{VM}"],
        OTHER: [f"security-group sg-0bbb gpuprov-{OTHER}"],
    }
    first, second = bare_front.requests("DescribeSecurityGroups")
    for request in (first, second, *bare_front.requests("DescribeKeyPairs")):
        assert request.params["Filter.1.Name"] == "tag-key"
        assert request.params["Filter.1.Value.1"] == "gpuprov-vm"
        assert request.region == REGION
    assert second.params["NextToken"] == "t2"


async def test_resources_named_otherwise_are_not_ours_to_list(recorded_cloud, bare_front):
    bare_front.answer("DescribeSecurityGroups", groups_page(VM, "sg-0aaa", name="launch-wizard-1"))
    bare_front.answer("DescribeKeyPairs", key_pairs(VM, name="alice-laptop"))

    assert await recorded_cloud.observe_side_resources(HERE) == {}


async def test_a_body_missing_the_group_id_is_a_classified_error(recorded_cloud, bare_front):
    body = recorded(
        "describe_security_groups_page.xml", vm=VM, group_name=f"gpuprov-{VM}", next_token=""
    ).replace(b"<groupId>{group_id}</groupId>", b"")
    bare_front.answer("DescribeSecurityGroups", Reply(200, body))
    bare_front.answer("DescribeKeyPairs", key_pairs(VM))

    with pytest.raises(ProviderError) as raised:
        await recorded_cloud.observe_side_resources(HERE)
    assert raised.value.kind is ErrorKind.FAILED


async def test_what_prepare_made_is_listed_until_cleanup_removes_it(cloud, front):
    offer = (await cloud.plan(ResourceRequest(gpu="H100", gpus_per_node=8)))[0]
    for vm, key in ((VM, PUBLIC_KEY), (OTHER, None)):
        spec = InstanceSpec(vm=vm, job="train", node_index=0, attempt=1, ssh_public_key=key)
        await cloud.prepare(offer, spec)
    # the user's own group, named like ours but untagged, is never listed
    ec2(front.upstream).create_security_group(GroupName="gpuprov-not-ours", Description="mine")

    listed = await cloud.observe_side_resources(HERE)
    assert sorted(listed) == [VM, OTHER]
    assert [entry.split()[0] for entry in listed[VM]] == ["security-group", "key-pair"]
    assert [entry.split()[0] for entry in listed[OTHER]] == ["security-group"]

    await cloud.cleanup(HERE, VM)
    assert sorted(await cloud.observe_side_resources(HERE)) == [OTHER]
