"""observe_side_resources on Lambda Cloud: the per-VM firewall rulesets (of the region asked)
and SSH keys (account-wide) named `gpuprov-<vm>`, from FakeLambda's documented answers."""

from __future__ import annotations

from providers.base import InstanceSpec, Location

from .fake_lambda import region_body
from .fixtures import VM_PUBLIC_KEY
from .test_cloud_plan_prepare import offer

VM = "train-a1-n0-abc123"
ELSEWHERE = "train-a1-n1-abc123"
HERE = Location(provider="lambda", region="us-east-3")


async def test_rulesets_of_the_region_and_per_vm_keys_are_listed_by_vm(account, cloud):
    """The configured key, a user's key, a shortened name and another region's ruleset are
    not listed; cleanup empties the listing."""
    target = await offer(cloud)
    spec = InstanceSpec(
        vm=VM, job="train", node_index=0, attempt=1, ssh_public_key=VM_PUBLIC_KEY, ports=[8000]
    )
    await cloud.prepare(target, spec)
    account.keys["ops"] = {"id": "ops", "name": "ops-team", "public_key": "ssh-ed25519 AAAAops"}
    account.keys["long"] = {"id": "long", "name": "gpuprov-" + "x" * 47 + "~0a1b2c3d"}
    account.rulesets["far"] = {
        "id": "far",
        "name": f"gpuprov-{ELSEWHERE}",
        "region": region_body("us-west-1"),
        "rules": [],
        "created": "2026-08-20T10:00:00+00:00",
        "instance_ids": [],
    }
    [ruleset_id] = [r["id"] for r in account.rulesets.values() if r["name"] == f"gpuprov-{VM}"]

    assert await cloud.observe_side_resources(HERE) == {
        VM: [f"firewall-ruleset {ruleset_id} gpuprov-{VM}", f"ssh-key gpuprov-{VM}"]
    }
    far = Location(provider="lambda", region="us-west-1")
    assert await cloud.observe_side_resources(far) == {
        ELSEWHERE: [f"firewall-ruleset far gpuprov-{ELSEWHERE}"],
        VM: [f"ssh-key gpuprov-{VM}"],  # keys are the account's, listed in every region
    }

    await cloud.cleanup(HERE, VM)
    assert await cloud.observe_side_resources(HERE) == {}
