"""LambdaCloud over respx: construction, plan, prepare (keys, images) and cleanup."""

from __future__ import annotations

import httpx
import pytest

from providers import build_all
from providers.base import InstanceSpec, Offer, ResourceRequest
from providers.errors import ErrorKind, ProviderError
from providers.settings import MissingCredentials

from .fake_lambda import FakeLambda, LambdaCloud, LambdaConfig
from .fixtures import INVALID_API_KEY, USER_KEY, VM_PUBLIC_KEY

VM = "train-a1-n0-abc123"


def spec(vm: str = VM, **fields) -> InstanceSpec:
    return InstanceSpec(vm=vm, job="train", node_index=0, attempt=1, **fields)


async def offer(cloud, offer_id: str = "lambda/us-east-3/gpu_8x_h100_sxm5") -> Offer:
    return next(o for o in await cloud.plan(ResourceRequest()) if o.id == offer_id)


# ---------------------------------------------------------------- construction


def test_missing_key_is_missing_credentials_naming_where_to_put_it(monkeypatch):
    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    with pytest.raises(MissingCredentials, match="LAMBDA_API_KEY"):
        LambdaCloud(LambdaConfig())


def test_registry_builds_the_adapter_from_its_section():
    from gpuprov.config import ProvidersSettings

    settings = ProvidersSettings.model_validate({"lambda": {"api_key": "k", "regions": ["r"]}})
    built = build_all(settings)
    assert type(built.providers["lambda"]).__name__ == "LambdaCloud"
    assert built.providers["lambda"].sweep_regions() == ["r"]


def test_capabilities_carry_lambda_timing_hints():
    hints = LambdaCloud(LambdaConfig(), api_key="k").capabilities()
    assert (hints.boot_timeout, hints.delete_timeout, hints.poll_interval) == (1800, 900, 10)
    assert hints.node_agent is True and "spot" in hints.unsupported  # agent in the user data
    # Lambda bills on-demand instances in one-minute increments, no minimum stated.
    assert (hints.billing.granularity_seconds, hints.billing.minimum_seconds) == (60, 0)


# ---------------------------------------------------------------- plan


async def test_plan_offers_each_region_with_capacity_cheapest_first(cloud):
    offers = await cloud.plan(ResourceRequest())
    assert [o.id for o in offers] == [
        "lambda/us-east-1/cpu_4x_general",
        "lambda/us-east-1/gpu_1x_a10",
        "lambda/us-west-1/gpu_1x_a10",
        "lambda/us-east-3/gpu_8x_h100_sxm5",
        "lambda/us-south-2/gpu_8x_h100_sxm5",
        "lambda/us-west-1/gpu_8x_h100_sxm5gdr",
    ]  # gpu_8x_example has capacity nowhere: no offer
    h100 = offers[3]
    assert (h100.gpu_name, h100.gpu_count, h100.gpu_memory_gb) == ("H100 SXM5", 8, 80.0)
    assert (h100.vcpus, h100.memory_gb, h100.disk_gb, h100.spot) == (208, 1800.0, 22528.0, False)
    assert h100.price is not None and h100.price.amount == pytest.approx(23.92)
    assert h100.price.currency == "USD" and "instance-types" in h100.price.source
    assert h100.detail == {"instance_type": "gpu_8x_h100_sxm5"}
    assert offers[0].gpu_name is None and offers[0].gpu_count == 0


async def test_plan_keeps_to_the_region_allow_list(account: FakeLambda):
    cloud = account.cloud(regions=["us-south-2", "us-west-1"])
    try:
        ids = [o.id for o in await cloud.plan(ResourceRequest())]
    finally:
        await cloud.aclose()
    assert ids == [
        "lambda/us-west-1/gpu_1x_a10",
        "lambda/us-south-2/gpu_8x_h100_sxm5",
        "lambda/us-west-1/gpu_8x_h100_sxm5gdr",
    ]


async def test_plan_with_a_rejected_key_is_credentials_in_lambdas_words(account, cloud):
    # An echoed key is scrubbed by the core: tests/providers/lambda/test_redaction.py.
    account.router.get("/instance-types").mock(
        return_value=httpx.Response(401, json=INVALID_API_KEY)
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.plan(ResourceRequest())
    assert caught.value.kind is ErrorKind.CREDENTIALS
    assert "global/invalid-api-key" in caught.value.message
    assert "API key was invalid, expired, or deleted." in caught.value.message


async def test_plan_throttled_is_transient_with_retry_after(account, cloud):
    account.router.get("/instance-types").mock(
        return_value=httpx.Response(429, text="Too Many Requests", headers={"Retry-After": "7"})
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.plan(ResourceRequest())
    assert (caught.value.kind, caught.value.retry_after) == (ErrorKind.TRANSIENT, 7.0)


async def test_plan_network_failure_is_transient(account, cloud):
    account.router.get("/instance-types").mock(side_effect=httpx.ConnectError("refused"))
    with pytest.raises(ProviderError) as caught:
        await cloud.plan(ResourceRequest())
    assert caught.value.kind is ErrorKind.TRANSIENT and "ConnectError" in caught.value.message


# ---------------------------------------------------------------- prepare


async def test_prepare_with_the_configured_key_makes_no_call(account, cloud):
    target = await offer(cloud)
    before = len(account.router.calls)
    prepared = await cloud.prepare(target, spec())
    assert prepared == {
        "ssh_key_name": "ops-team",
        "per_vm_key": False,
        "image": None,
        "firewall_ruleset_id": None,  # no ports asked: no ruleset
    }
    assert len(account.router.calls) == before


async def test_prepare_without_any_key_is_invalid_request(account):
    cloud = account.cloud()  # no ssh_key_name configured
    try:
        with pytest.raises(ProviderError) as caught:
            await cloud.prepare(await offer(cloud), spec())
    finally:
        await cloud.aclose()
    assert caught.value.kind is ErrorKind.INVALID_REQUEST and "ssh_key_name" in caught.value.message


async def test_prepare_registers_one_per_vm_key_idempotently(account, cloud):
    target = await offer(cloud)
    first = await cloud.prepare(target, spec(ssh_public_key=VM_PUBLIC_KEY))
    again = await cloud.prepare(target, spec(ssh_public_key=VM_PUBLIC_KEY))
    assert (
        first
        == again
        == {
            "ssh_key_name": f"gpuprov-{VM}",
            "per_vm_key": True,
            "image": None,
            "firewall_ruleset_id": None,
        }
    )
    names = sorted(key["name"] for key in account.keys.values())
    assert names == [f"gpuprov-{VM}", "ops-team"]
    posts = [c for c in account.router.calls if c.request.method == "POST"]
    assert len(posts) == 1


async def test_prepare_replaces_our_stale_key_but_never_a_user_key(account, cloud):
    account.keys["old"] = {
        "id": "old",
        "name": f"gpuprov-{VM}",
        "public_key": "ssh-ed25519 AAAAold",
    }
    await cloud.prepare(await offer(cloud), spec(ssh_public_key=VM_PUBLIC_KEY))
    ours = [k for k in account.keys.values() if k["name"] == f"gpuprov-{VM}"]
    assert [k["public_key"] for k in ours] == [VM_PUBLIC_KEY]
    assert USER_KEY["id"] in account.keys


async def test_prepare_adopts_a_key_an_earlier_lost_answer_added(account, cloud):
    """The first POST landed but its answer was lost and the listing lagged: the retry's POST
    is refused as a duplicate, and the key that is there now is ours."""
    real = account._add_key

    def duplicate(request: httpx.Request) -> httpx.Response:
        real(request)
        return httpx.Response(
            400, json={"error": {"code": "global/invalid-parameters", "message": "name in use"}}
        )

    account.router.post("/ssh-keys").mock(side_effect=duplicate)
    prepared = await cloud.prepare(await offer(cloud), spec(ssh_public_key=VM_PUBLIC_KEY))
    assert prepared["ssh_key_name"] == f"gpuprov-{VM}"


async def test_prepare_key_refused_for_real_is_invalid_request(account, cloud):
    account.router.post("/ssh-keys").mock(
        return_value=httpx.Response(
            400, json={"error": {"code": "global/invalid-parameters", "message": "bad key"}}
        )
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.prepare(await offer(cloud), spec(ssh_public_key="not a key"))
    assert caught.value.kind is ErrorKind.INVALID_REQUEST and "bad key" in caught.value.message


async def test_prepare_resolves_an_image_family_offered_in_the_region(account):
    cloud = account.cloud(ssh_key_name="ops-team", image_family="lambda-stack-24-04")
    try:
        prepared = await cloud.prepare(await offer(cloud), spec())
    finally:
        await cloud.aclose()
    assert prepared["image"] == {"family": "lambda-stack-24-04"}


async def test_prepare_image_missing_in_this_region_is_unavailable_and_registers_nothing(
    account, cloud
):
    with pytest.raises(ProviderError) as caught:
        await cloud.prepare(
            await offer(cloud), spec(image="ubuntu-24-04", ssh_public_key=VM_PUBLIC_KEY)
        )
    assert caught.value.kind is ErrorKind.UNAVAILABLE and "us-east-3" in caught.value.message
    assert [k["name"] for k in account.keys.values()] == ["ops-team"]


async def test_prepare_unknown_image_is_invalid_request_and_uuid_means_id(cloud):
    target = await offer(cloud)
    with pytest.raises(ProviderError) as caught:
        await cloud.prepare(target, spec(image="no-such-family"))
    assert caught.value.kind is ErrorKind.INVALID_REQUEST
    prepared = await cloud.prepare(target, spec(image="43336648-096d-4cba-9aa2-f9bb7727639d"))
    assert prepared["image"] == {"id": "43336648-096d-4cba-9aa2-f9bb7727639d"}


async def test_prepare_refuses_an_offer_of_another_cloud(cloud):
    foreign = Offer(id="fake/r1/gpu8", provider="fake", region="r1", instance_type="gpu8")
    with pytest.raises(ProviderError) as caught:
        await cloud.prepare(foreign, spec())
    assert caught.value.kind is ErrorKind.INVALID_REQUEST


# ---------------------------------------------------------------- cleanup


async def test_cleanup_deletes_exactly_the_per_vm_key(account, cloud):
    target = await offer(cloud)
    await cloud.prepare(target, spec(ssh_public_key=VM_PUBLIC_KEY))
    await cloud.prepare(target, spec("other-a1-n0-def456", ssh_public_key=VM_PUBLIC_KEY))
    await cloud.cleanup(target.location, VM)
    names = sorted(k["name"] for k in account.keys.values())
    assert names == ["gpuprov-other-a1-n0-def456", "ops-team"]
    await cloud.cleanup(target.location, VM)  # idempotent: nothing left to delete
    deletes = [c for c in account.router.calls if c.request.method == "DELETE"]
    assert len(deletes) == 1


async def test_cleanup_counts_a_key_deleted_meanwhile_as_done(account, cloud):
    target = await offer(cloud)
    await cloud.prepare(target, spec(ssh_public_key=VM_PUBLIC_KEY))
    key_id = next(k["id"] for k in account.keys.values() if k["name"] == f"gpuprov-{VM}")
    account.router.delete(f"/ssh-keys/{key_id}").mock(
        return_value=httpx.Response(
            404, json={"error": {"code": "global/not-found", "message": "not found"}}
        )
    )
    await cloud.cleanup(target.location, VM)


async def test_cleanup_never_deletes_the_configured_key_even_if_named_like_ours(account):
    name = f"gpuprov-{VM}"
    account.keys["mine"] = {"id": "mine", "name": name, "public_key": "ssh-ed25519 AAAAuser"}
    cloud = account.cloud(ssh_key_name=name)
    try:
        await cloud.cleanup((await offer(cloud)).location, VM)
    finally:
        await cloud.aclose()
    assert "mine" in account.keys


async def test_cleanup_surfaces_a_server_error_as_transient(account, cloud):
    account.router.get("/ssh-keys").mock(return_value=httpx.Response(502, text="<html>bad</html>"))
    with pytest.raises(ProviderError) as caught:
        await cloud.cleanup((await offer(cloud)).location, VM)
    assert caught.value.kind is ErrorKind.TRANSIENT and "HTTP 502" in caught.value.message


# ---------------------------------------------------------------- the job's ports


async def test_prepare_opens_the_jobs_ports_in_a_per_vm_ruleset_once(account, cloud):
    target = await offer(cloud)
    node = spec(ports=[8002, 8000, 8001, 9000])
    first = await cloud.prepare(target, node)
    again = await cloud.prepare(target, node)  # found by name and region: not made twice
    assert first == again and first["firewall_ruleset_id"] in account.rulesets
    (ruleset,) = account.rulesets.values()
    assert ruleset["name"] == f"gpuprov-{VM}" and ruleset["region"]["name"] == target.region
    assert [(r["protocol"], r["port_range"], r["source_network"]) for r in ruleset["rules"]] == [
        ("tcp", [8000, 8002], "0.0.0.0/0"),
        ("tcp", [9000, 9000], "0.0.0.0/0"),
    ]
    await cloud.create(target, first, node)
    (launch,) = account.launches
    assert launch["firewall_rulesets"] == [{"id": first["firewall_ruleset_id"]}]


async def test_ports_source_networks_narrow_who_reaches_the_jobs_ports(account):
    cloud = account.cloud(
        ssh_key_name="ops-team", ports_source_networks=["203.0.113.0/24", "198.51.100.7/32"]
    )
    try:
        await cloud.prepare(await offer(cloud), spec(ports=[8080]))
    finally:
        await cloud.aclose()
    (ruleset,) = account.rulesets.values()
    assert [r["source_network"] for r in ruleset["rules"]] == ["203.0.113.0/24", "198.51.100.7/32"]


async def test_a_ruleset_made_by_a_lost_answer_is_adopted(account, cloud):
    target = await offer(cloud)
    made = httpx.Response(502, text="<html>bad gateway</html>")

    def lost(request: httpx.Request) -> httpx.Response:
        account._add_ruleset(request)  # Lambda made it; the answer never arrived
        return made

    account.router.post("/firewall-rulesets").mock(side_effect=lost)
    with pytest.raises(ProviderError) as caught:
        await cloud.prepare(target, spec(ports=[8080]))
    assert caught.value.kind is ErrorKind.TRANSIENT  # the core retries the step...
    account.router.post("/firewall-rulesets").mock(side_effect=account._add_ruleset)
    prepared = await cloud.prepare(target, spec(ports=[8080]))  # ...which finds it
    assert list(account.rulesets) == [prepared["firewall_ruleset_id"]]


async def test_cleanup_deletes_the_vms_ruleset_once_its_instance_is_gone(account, cloud):
    target = await offer(cloud)
    node = spec(ports=[8080])
    prepared = await cloud.prepare(target, node)
    await cloud.prepare(target, spec("other-a1-n0-def456", ports=[8080]))
    ids = await cloud.create(target, prepared, node)
    await cloud.delete(target.location, VM, ids)
    with pytest.raises(ProviderError) as caught:  # still attached while it terminates
        await cloud.cleanup(target.location, VM)
    assert caught.value.kind is ErrorKind.TRANSIENT
    assert "firewall-ruleset-in-use" in caught.value.message
    while await cloud.observe(target.location, VM):
        pass  # terminating, terminated, gone
    await cloud.cleanup(target.location, VM)
    await cloud.cleanup(target.location, VM)  # idempotent
    assert [r["name"] for r in account.rulesets.values()] == ["gpuprov-other-a1-n0-def456"]


async def test_cleanup_counts_a_ruleset_deleted_meanwhile_as_done(account, cloud):
    target = await offer(cloud)
    prepared = await cloud.prepare(target, spec(ports=[8080]))
    ruleset_id = prepared["firewall_ruleset_id"]
    account.router.delete(f"/firewall-rulesets/{ruleset_id}").mock(
        return_value=httpx.Response(
            404,
            json={"error": {"code": "global/object-does-not-exist", "message": "gone"}},
        )
    )
    await cloud.cleanup(target.location, VM)


def test_lambda_declares_neither_image_nor_ports_unsupported(cloud):
    assert not {"image", "ports"} & set(cloud.capabilities().unsupported)


async def test_the_jobs_image_family_is_launched_over_the_configured_one(account):
    # the configured family is not offered in the offer's region: only the job's can launch
    cloud = account.cloud(ssh_key_name="ops-team", image_family="ubuntu-24-04")
    try:
        target = await offer(cloud)
        assert target.region == "us-east-3"
        node = spec(image="lambda-stack-24-04")
        await cloud.create(target, await cloud.prepare(target, node), node)
        node = spec("other-a1-n0-def456", image="43336648-096d-4cba-9aa2-f9bb7727639d")
        await cloud.create(target, await cloud.prepare(target, node), node)
    finally:
        await cloud.aclose()
    assert [launch["image"] for launch in account.launches] == [
        {"family": "lambda-stack-24-04"},
        {"id": "43336648-096d-4cba-9aa2-f9bb7727639d"},
    ]
