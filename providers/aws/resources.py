"""Per-VM side resources (prepare and cleanup) and image resolution, each idempotent.

- security group `gpuprov-<vm>` in the region's default VPC, tagged `gpuprov-vm=<vm>`:
  CreateSecurityGroup (`InvalidGroup.Duplicate` = made before: found again with
  DescribeSecurityGroups), AuthorizeSecurityGroupIngress tcp 22 from `ssh_cidrs`, and one more
  for the spec's ports (as ranges) from `ports_cidrs` (`InvalidPermission.Duplicate` = success);
  removed, rules and all, with DeleteSecurityGroup (`InvalidGroup.NotFound` = gone).
- key pair `gpuprov-<vm>` from the spec's public key, tagged likewise: ImportKeyPair
  (`InvalidKeyPair.Duplicate` = success); removed with DescribeKeyPairs + DeleteKeyPair.
- image: DescribeImages, for an AMI id (to learn its root device and architecture), one read
  from SSM (GetParameter, for `resolve:ssm:<parameter>`), or, by name and owner, the newest
  available image for the instance type's architecture.

Only resources that carry both our name and our tag are ever deleted: the user's own key pairs,
groups and VPCs are never touched. The reconciler's listing (`side_resources`) holds to the same
rule, so every VM it names is one whose cleanup removes what it listed: DescribeSecurityGroups
and DescribeKeyPairs, each filtered to tag-key gpuprov-vm.
"""

from __future__ import annotations

from typing import Any

from providers.aws import parse
from providers.aws.client import Ec2Api
from providers.aws.config import AwsConfig
from providers.base import InstanceSpec, port_ranges, vm_label
from providers.errors import ErrorKind, ProviderError

GROUP_DUPLICATE = frozenset({"InvalidGroup.Duplicate"})
PERMISSION_DUPLICATE = frozenset({"InvalidPermission.Duplicate"})
KEY_DUPLICATE = frozenset({"InvalidKeyPair.Duplicate"})
GROUP_GONE = frozenset({"InvalidGroup.NotFound", "InvalidGroupId.NotFound"})
KEY_GONE = frozenset({"InvalidKeyPair.NotFound"})
DEFAULT_ROOT_DEVICE = "/dev/sda1"
SSH_PORT = 22
SSM_PREFIX = "resolve:ssm:"


def identity_tags(spec_vm: str, extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    """The tags every gpuprov resource carries: gpuprov-vm=<vm>, Name=gpuprov-<vm>, + labels."""
    tags = {key: value[:256] for key, value in (extra or {}).items() if not key.startswith("aws:")}
    tags.update({parse.VM_TAG: spec_vm, "Name": f"gpuprov-{spec_vm}"})
    return [{"Key": key, "Value": value} for key, value in sorted(tags.items())]


async def security_group(api: Ec2Api, config: AwsConfig, region: str, spec: InstanceSpec) -> str:
    """The VM's security group id, created (with SSH open to `ssh_cidrs`) if needed."""
    created = await api.call(
        region,
        "CreateSecurityGroup",
        ok_codes=GROUP_DUPLICATE,
        GroupName=spec.label,
        Description=f"gpuprov: SSH to {spec.vm}"[:255],
        TagSpecifications=[
            {"ResourceType": "security-group", "Tags": identity_tags(spec.vm, spec.labels)}
        ],
    )
    if created is not None:
        with parse.reading("CreateSecurityGroup"):
            group_id = str(created["GroupId"])
    else:
        group_id = await _existing_group(api, region, spec)
    await _authorize(api, region, group_id, [(22, 22)], config.ssh_cidrs, "gpuprov ssh")
    # The job's ports, SSH's own rule aside (22 stays open to ssh_cidrs only). One call for
    # all: EC2 adds all of its rules or none, so a Duplicate means an earlier try added them.
    job_ports = [port for port in spec.ports if port != SSH_PORT]
    if job_ports:
        ranges = port_ranges(job_ports)
        await _authorize(api, region, group_id, ranges, config.ports_cidrs, "gpuprov job port")
    return group_id


async def _authorize(
    api: Ec2Api,
    region: str,
    group_id: str,
    ranges: list[tuple[int, int]],
    cidrs: list[str],
    description: str,
) -> None:
    await api.call(
        region,
        "AuthorizeSecurityGroupIngress",
        ok_codes=PERMISSION_DUPLICATE,
        GroupId=group_id,
        IpPermissions=[
            {
                "IpProtocol": "tcp",
                "FromPort": first,
                "ToPort": last,
                "IpRanges": [{"CidrIp": cidr, "Description": description} for cidr in cidrs],
            }
            for first, last in ranges
        ],
    )


async def _existing_group(api: Ec2Api, region: str, spec: InstanceSpec) -> str:
    groups = await api.pages(
        region,
        "DescribeSecurityGroups",
        "SecurityGroups",
        Filters=[{"Name": "group-name", "Values": [spec.label]}],
    )
    with parse.reading("DescribeSecurityGroups"):
        for group in groups:
            if _tagged(group, spec.vm):
                return str(group["GroupId"])
    if groups:
        raise ProviderError(
            ErrorKind.FAILED,
            f"a security group named {spec.label} exists without tag {parse.VM_TAG}={spec.vm}: "
            "gpuprov did not make it and will not use it",
        )
    # EC2 said Duplicate but cannot list it yet (eventual consistency): try the step again.
    raise ProviderError(ErrorKind.TRANSIENT, f"security group {spec.label} not listed yet")


async def key_pair(api: Ec2Api, config: AwsConfig, region: str, spec: InstanceSpec) -> str | None:
    """The key pair to launch with: the spec's public key imported as `gpuprov-<vm>`, else the
    configured `key_name` (the user's, never deleted), else none."""
    if not spec.ssh_public_key:
        return config.key_name
    await api.call(
        region,
        "ImportKeyPair",
        ok_codes=KEY_DUPLICATE,
        KeyName=spec.label,
        PublicKeyMaterial=spec.ssh_public_key.encode(),
        TagSpecifications=[
            {"ResourceType": "key-pair", "Tags": identity_tags(spec.vm, spec.labels)}
        ],
    )
    return spec.label


async def image(
    api: Ec2Api, config: AwsConfig, region: str, spec: InstanceSpec, architecture: str
) -> tuple[str, str]:
    """(AMI id, root device name) of what the VM boots: the spec's image, else the region's
    configured AMI, else the newest available AMI named `image_name`. The spec's image is an
    AMI id (`ami-...`), `resolve:ssm:<parameter>` (an AMI id held in SSM Parameter Store, as AWS
    publishes its own under /aws/service/...: EC2's RunInstances syntax), or an AMI name (`*`
    wildcards), the newest for the architecture among those owned by `image_owner`."""
    asked = spec.image.strip() if spec.image and spec.image.strip() else None
    name: str | None = None
    if asked is None:
        explicit = config.images.get(region)
        name = None if explicit else config.image_name
    elif asked.startswith(SSM_PREFIX):
        explicit = await _ssm_image(api, region, asked)
    elif asked.startswith("ami-"):
        explicit = asked
    else:
        explicit, name = None, asked
    if name is not None:
        return await _image_by_name(api, config, region, name, architecture)
    assert explicit is not None
    found = await api.must(region, "DescribeImages", ImageIds=[explicit])
    with parse.reading("DescribeImages"):
        candidates = found.get("Images") or []
        if not candidates:
            raise ProviderError(ErrorKind.INVALID_REQUEST, f"image {explicit} not in {region}")
        chosen = candidates[0]
        built_for = chosen.get("Architecture")
        if built_for and built_for != architecture:
            # Another instance type of the job's may fit it: this offer only.
            raise ProviderError(
                ErrorKind.UNAVAILABLE,
                f"image {explicit} is built for {built_for}; this instance type is {architecture}",
            )
        return str(chosen["ImageId"]), str(chosen.get("RootDeviceName") or DEFAULT_ROOT_DEVICE)


async def _ssm_image(api: Ec2Api, region: str, asked: str) -> str:
    parameter = asked.removeprefix(SSM_PREFIX)
    value = (await api.ssm_parameter(region, parameter)).strip()
    if not value.startswith("ami-"):
        raise ProviderError(
            ErrorKind.INVALID_REQUEST, f"SSM parameter {parameter} holds no AMI id: {value[:64]!r}"
        )
    return value


async def _image_by_name(
    api: Ec2Api, config: AwsConfig, region: str, name: str, architecture: str
) -> tuple[str, str]:
    found = await api.must(
        region,
        "DescribeImages",
        Owners=[config.image_owner],
        Filters=[
            {"Name": "name", "Values": [name]},
            {"Name": "state", "Values": ["available"]},
            {"Name": "architecture", "Values": [architecture]},
        ],
    )
    with parse.reading("DescribeImages"):
        candidates = found.get("Images") or []
        if not candidates:
            raise ProviderError(
                ErrorKind.UNAVAILABLE,
                f"no available {architecture} image named {name!r} owned by "
                f"{config.image_owner} in {region}",
            )
        newest = max(candidates, key=lambda i: str(i.get("CreationDate") or ""))
        return str(newest["ImageId"]), str(newest.get("RootDeviceName") or DEFAULT_ROOT_DEVICE)


async def delete_key_pairs(api: Ec2Api, region: str, vm: str, label: str) -> None:
    pairs = await api.pages(
        region, "DescribeKeyPairs", "KeyPairs", Filters=[{"Name": "key-name", "Values": [label]}]
    )
    with parse.reading("DescribeKeyPairs"):
        ours = [str(pair["KeyName"]) for pair in pairs if _tagged(pair, vm)]
    for name in ours:  # key names are unique per region; this one carries our tag
        await api.call(region, "DeleteKeyPair", ok_codes=KEY_GONE, KeyName=name)


async def delete_security_groups(api: Ec2Api, region: str, vm: str, label: str) -> None:
    groups = await api.pages(
        region,
        "DescribeSecurityGroups",
        "SecurityGroups",
        Filters=[{"Name": "group-name", "Values": [label]}],
    )
    with parse.reading("DescribeSecurityGroups"):
        ours = [str(group["GroupId"]) for group in groups if _tagged(group, vm)]
    for group_id in ours:
        # DependencyViolation (the instance's interface is still detaching) is Transient.
        await api.call(region, "DeleteSecurityGroup", ok_codes=GROUP_GONE, GroupId=group_id)


async def side_resources(api: Ec2Api, region: str) -> dict[str, list[str]]:
    """The region's security groups and key pairs tagged gpuprov-vm=<vm> AND named
    gpuprov-<vm>, by VM: "security-group <id> <name>", "key-pair <name>"."""
    tagged = [{"Name": "tag-key", "Values": [parse.VM_TAG]}]
    groups = await api.pages(region, "DescribeSecurityGroups", "SecurityGroups", Filters=tagged)
    pairs = await api.pages(region, "DescribeKeyPairs", "KeyPairs", Filters=tagged)
    by_vm: dict[str, list[str]] = {}
    with parse.reading("DescribeSecurityGroups"):
        for group in groups:
            vm = _vm_named(group, str(group["GroupName"]))
            if vm is not None:
                by_vm.setdefault(vm, []).append(f"security-group {group['GroupId']} {vm_label(vm)}")
    with parse.reading("DescribeKeyPairs"):
        for pair in pairs:
            vm = _vm_named(pair, str(pair["KeyName"]))
            if vm is not None:
                by_vm.setdefault(vm, []).append(f"key-pair {vm_label(vm)}")
    return by_vm


def _vm_named(resource: dict[str, Any], name: str) -> str | None:
    """The VM a resource is ours for: its gpuprov-vm tag, where its name is gpuprov-<that vm>."""
    vm = next(
        (str(tag["Value"]) for tag in resource.get("Tags") or [] if tag["Key"] == parse.VM_TAG),
        None,
    )
    return vm if vm and name == vm_label(vm) else None


def _tagged(resource: dict[str, Any], vm: str) -> bool:
    return any(
        tag["Key"] == parse.VM_TAG and tag["Value"] == vm for tag in resource.get("Tags") or []
    )
