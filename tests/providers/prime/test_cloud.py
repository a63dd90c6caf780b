"""Every HTTP primitive of the Prime adapter over respx: happy paths, pagination, error paths."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx
from pydantic import SecretStr

from gpuprov.config import ProvidersSettings
from providers import build_all
from providers.base import (
    InstanceSpec,
    InstanceStatus,
    Location,
    Offer,
    ResourceRequest,
)
from providers.errors import BlockScope, ErrorKind, ProviderError
from providers.prime.cloud import PrimeCloud
from providers.prime.config import PrimeConfig
from providers.settings import MissingCredentials
from tests.providers.prime import bodies
from tests.providers.prime.fake_api import API_KEY, BASE_URL, FakePrime
from tests.providers.wire import assert_never_sent

VM = "train-a1-n0-ce4389"
LABEL = f"gpuprov-{VM}"
HERE = Location(provider="prime", region="canada", zone="CANADA-1")
OFFER = Offer(
    id="prime/hyperstack/CANADA-1/n3-H100x1/1xH100_80GB",
    provider="prime",
    region="canada",
    instance_type="n3-H100x1",
    detail={
        "cloud_id": "n3-H100x1",
        "gpu_type": "H100_80GB",
        "gpu_count": 1,
        "socket": "PCIe",
        "provider_type": "hyperstack",
    },
)
OFFERS = [
    bodies.RUNPOD_H100,
    bodies.HYPERSTACK_H100,
    bodies.DC_ROAN_H100X8,
    bodies.COMMUNITY_RTX4090,
    bodies.SOLD_OUT,
    bodies.PREPAID,
    bodies.UNPRICED,
]


def spec(**fields: Any) -> InstanceSpec:
    return InstanceSpec(vm=VM, job="train", node_index=0, attempt=1, **fields)


def static(*routes: tuple[str, str, Any]) -> httpx.MockTransport:
    """A transport answering (method, path) with fixed responses (or side effects)."""
    router = respx.Router(base_url=BASE_URL, assert_all_called=False)
    for method, path, response in routes:
        route = router.route(method=method, path=path)
        if callable(response) or isinstance(response, list | Exception):
            route.mock(side_effect=response)
        else:
            route.mock(return_value=response)
    return httpx.MockTransport(router.async_handler)


@pytest.fixture
async def prime() -> FakePrime:
    return FakePrime(OFFERS)


@pytest.fixture
async def cloud(prime: FakePrime) -> AsyncIterator[PrimeCloud]:
    adapter = PrimeCloud(PrimeConfig(), api_key=API_KEY, transport=prime.transport())
    yield adapter
    await adapter.aclose()
    assert prime.violations == []


async def with_transport(transport: httpx.MockTransport, **config: Any) -> PrimeCloud:
    return PrimeCloud(PrimeConfig(**config), api_key=API_KEY, transport=transport)


async def failure(coroutine: Any) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await coroutine
    return caught.value


# ---------------------------------------------------------------------------- construction


def test_registry_builds_the_adapter_from_its_section():
    built = build_all(ProvidersSettings(prime=PrimeConfig(api_key=SecretStr("k"))))
    assert isinstance(built.providers["prime"], PrimeCloud)


def test_without_a_key_the_registry_skips_prime_and_says_how(monkeypatch):
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    with pytest.raises(MissingCredentials, match="PRIME_API_KEY"):
        PrimeCloud(PrimeConfig())
    assert "PRIME_API_KEY" in build_all(ProvidersSettings(prime=PrimeConfig())).skipped["prime"]


async def test_capabilities_are_the_configured_hints_with_the_agent_over_ssh():
    adapter = await with_transport(static(), boot_timeout=900, poll_interval=5)
    hints = adapter.capabilities()
    assert (hints.boot_timeout, hints.delete_timeout, hints.poll_interval) == (900, 600, 5)
    assert hints.node_agent is True and hints.unsupported == ["user_data", "ports"]
    assert adapter.config.ssh_bootstrap is True  # the core starts the agent over SSH
    # Prime documents no billing increment for pods: exact seconds.
    assert (hints.billing.granularity_seconds, hints.billing.minimum_seconds) == (None, 0)
    assert adapter.sweep_regions() == ["global"]
    configured = await with_transport(static(), regions=["canada", "eu_west"])
    assert configured.sweep_regions() == ["canada", "eu_west"]


# ---------------------------------------------------------------------------- plan


async def test_plan_lists_rentable_offers_cheapest_first(cloud):
    offers = await cloud.plan(ResourceRequest())
    assert [o.id for o in offers] == [
        "prime/massedcompute/NL/rtx4090-1x/1xRTX4090_24GB/community/spot",
        "prime/hyperstack/CANADA-1/n3-H100x1/1xH100_80GB",
        "prime/runpod/US-KS-2/NVIDIA_H100_PCIe/1xH100_80GB",
        "prime/dc_roan/us-east-1/8x-h100-sxm5/8xH100_80GB",
        "prime/hyperstack/CANADA-1/n3-A100x1/1xA100_80GB",  # no price: last
    ]  # sold out and prepaid offers are left out


async def test_plan_sends_the_configured_filters(prime):
    adapter = PrimeCloud(
        PrimeConfig(regions=["united_states"], security="secure_cloud"),
        api_key=API_KEY,
        transport=prime.transport(),
    )
    offers = await adapter.plan(ResourceRequest(gpu="H100"))
    request = prime.router.calls.last.request
    assert request.url.params.get_list("regions") == ["united_states"]
    assert request.url.params["gpu_type"] == "H100_80GB"
    assert request.url.params["security"] == "secure_cloud"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert {o.region for o in offers} == {"united_states"}
    assert prime.violations == []


async def test_plan_does_not_narrow_by_an_ambiguous_model(cloud, prime):
    await cloud.plan(ResourceRequest(gpu="A100"))  # A100_80GB and A100_40GB
    assert "gpu_type" not in prime.router.calls.last.request.url.params


async def test_plan_applies_country_provider_and_image_filters(prime):
    config = PrimeConfig(countries=["US"], upstream_providers=["runpod", "dc_roan"])
    adapter = PrimeCloud(config, api_key=API_KEY, transport=prime.transport())
    assert {o.detail["provider_type"] for o in await adapter.plan(ResourceRequest())} == {
        "runpod",
        "dc_roan",
    }
    flux = PrimeCloud(PrimeConfig(image="flux"), api_key=API_KEY, transport=prime.transport())
    imaged = [o.detail["cloud_id"] for o in await flux.plan(ResourceRequest())]
    assert imaged == ["n3-H100x1", "n3-A100x1"]  # the Hyperstack offers list `flux`


async def test_plan_keeps_the_offers_that_list_the_jobs_environment(prime):
    adapter = PrimeCloud(PrimeConfig(), api_key=API_KEY, transport=prime.transport())
    imaged = await adapter.plan(ResourceRequest(image="flux"))
    assert [o.detail["cloud_id"] for o in imaged] == ["n3-H100x1", "n3-A100x1"]
    offer = imaged[0]
    node = spec(image="flux")
    await adapter.create(offer, await adapter.prepare(offer, node), node)
    (created,) = prime.created
    assert created["pod"]["image"] == "flux"  # the job's, not the configured ubuntu_22_cuda_12
    assert prime.violations == []  # an EnvironmentTypeEnum value, as documented


@pytest.mark.parametrize(
    "image", ["nvcr.io/nvidia/pytorch:24.05-py3", "custom_template", "ubuntu:22.04"]
)
async def test_an_image_that_is_not_a_prime_environment_refuses_the_provider_at_plan(prime, image):
    adapter = PrimeCloud(PrimeConfig(), api_key=API_KEY, transport=prime.transport())
    error = await failure(adapter.plan(ResourceRequest(image=image)))
    assert (error.kind, error.block_scope) == (ErrorKind.UNAVAILABLE, BlockScope.PROVIDER)
    assert repr(image) in error.message and "cuda_12_4_pytorch_2_5" in error.message
    assert prime.calls == []  # refused before any call


async def test_plan_reads_every_page(prime):
    many = [{**bodies.RUNPOD_H100, "cloudId": f"h100-{i:03d}"} for i in range(230)]
    prime.offers = many
    adapter = PrimeCloud(PrimeConfig(), api_key=API_KEY, transport=prime.transport())
    offers = await adapter.plan(ResourceRequest())
    assert len(offers) == 230
    pages = [c.request.url.params["page"] for c in prime.router.calls]
    assert pages == ["1", "2", "3"]


async def test_plan_stops_at_max_pages_with_what_it_has(prime):
    prime.offers = [{**bodies.RUNPOD_H100, "cloudId": f"h100-{i:03d}"} for i in range(230)]
    config = PrimeConfig(max_pages=2)
    adapter = PrimeCloud(config, api_key=API_KEY, transport=prime.transport())
    assert len(await adapter.plan(ResourceRequest())) == 200


async def test_plan_skips_unreadable_items_but_keeps_the_rest():
    page = bodies.availability(bodies.RUNPOD_H100, {"cloudId": 5}, "junk", total=3)
    adapter = await with_transport(
        static(("GET", "/api/v1/availability/gpus", httpx.Response(200, json=page)))
    )
    assert [o.detail["cloud_id"] for o in await adapter.plan(ResourceRequest())] == [
        "NVIDIA H100 PCIe"
    ]


@pytest.mark.parametrize("gpu_type", ["H100_80GB", "CPU_NODE"])
async def test_plan_rejects_items_with_no_gpu_since_create_needs_gpu_count_above_0(
    gpu_type, caplog
):
    # GpuAvailability.gpuCount is a bare integer; PodRequestConfig.gpuCount has
    # exclusiveMinimum 0, so an item with 0 could only ever fail at prepare or create.
    gpuless = {**bodies.HYPERSTACK_H100, "cloudId": "n3-none", "gpuType": gpu_type, "gpuCount": 0}
    page = bodies.availability(gpuless, bodies.RUNPOD_H100, total=2)
    adapter = await with_transport(
        static(("GET", "/api/v1/availability/gpus", httpx.Response(200, json=page)))
    )
    with caplog.at_level("WARNING", logger="providers.prime.cloud"):
        offers = await adapter.plan(ResourceRequest(gpus_per_node=0))
    assert [o.detail["cloud_id"] for o in offers] == ["NVIDIA H100 PCIe"]
    assert all(o.detail["gpu_count"] > 0 for o in offers)
    assert "rejected 1 availability items with gpuCount 0 (n3-none)" in caplog.text


async def test_duplicate_offers_keep_the_cheapest():
    dearer = {**bodies.RUNPOD_H100, "prices": {"onDemand": 9.0, "currency": "USD"}}
    page = bodies.availability(dearer, bodies.RUNPOD_H100)
    adapter = await with_transport(
        static(("GET", "/api/v1/availability/gpus", httpx.Response(200, json=page)))
    )
    [offer] = await adapter.plan(ResourceRequest())
    assert offer.price.amount == pytest.approx(2.7012)


@pytest.mark.parametrize(
    ("response", "kind"),
    [
        (httpx.Response(401, json=bodies.UNAUTHORIZED), ErrorKind.CREDENTIALS),
        (
            httpx.Response(429, json={"detail": "slow"}, headers={"Retry-After": "3"}),
            ErrorKind.TRANSIENT,
        ),
        (httpx.Response(500, text="oops"), ErrorKind.TRANSIENT),
        (httpx.ConnectError("refused"), ErrorKind.TRANSIENT),
        (httpx.Response(200, text="<html>maintenance</html>"), ErrorKind.TRANSIENT),
        (httpx.Response(200, json={"items": "nope"}), ErrorKind.TRANSIENT),
    ],
)
async def test_plan_failures_are_classified(response, kind):
    adapter = await with_transport(static(("GET", "/api/v1/availability/gpus", response)))
    error = await failure(adapter.plan(ResourceRequest()))
    assert error.kind is kind
    assert API_KEY not in error.message


# ---------------------------------------------------------------------------- prepare


async def offer_named(cloud: PrimeCloud, cloud_id: str) -> Offer:
    return next(o for o in await cloud.plan(ResourceRequest()) if o.instance_type == cloud_id)


async def test_prepare_without_a_key_calls_nothing(cloud, prime):
    offer = await offer_named(cloud, "n3-H100x1")
    calls = len(prime.calls)
    assert await cloud.prepare(offer, spec()) == {"image": "ubuntu_22_cuda_12"}
    assert len(prime.calls) == calls


async def test_prepare_registers_the_deployment_key_once_for_every_vm(cloud, prime):
    offer = await offer_named(cloud, "n3-H100x1")
    first = await cloud.prepare(offer, spec(ssh_public_key=bodies.PUBLIC_KEY))
    other_vm = InstanceSpec(
        vm="train-a1-n1-ce4389", job="train", node_index=1, attempt=1,
        ssh_public_key=bodies.PUBLIC_KEY,
    )  # fmt: skip
    again = await cloud.prepare(offer, other_vm)
    assert first == again == {"image": "ubuntu_22_cuda_12", "ssh_key_id": "key-0001"}
    [key] = prime.keys.values()
    assert re.fullmatch(r"gpuprov-key-[0-9a-f]{12}", key["name"])
    assert key["publicKey"] == bodies.PUBLIC_KEY


async def test_prepare_reuses_a_key_the_user_already_registered(cloud, prime):
    prime.keys["mine"] = bodies.ssh_key("mine", "laptop", bodies.PUBLIC_KEY + " other-comment")
    offer = await offer_named(cloud, "n3-H100x1")
    prepared = await cloud.prepare(offer, spec(ssh_public_key=bodies.PUBLIC_KEY))
    assert prepared["ssh_key_id"] == "mine"
    assert list(prime.keys) == ["mine"]


async def test_prepare_that_loses_a_registration_race_uses_the_winner_s_key():
    listings = iter([bodies.keys_page(), bodies.keys_page(bodies.ssh_key("k-9", "gpuprov-key-x"))])
    router = respx.Router(base_url=BASE_URL, assert_all_called=False)
    listing = router.get("/api/v1/ssh_keys/").mock(
        side_effect=lambda request: httpx.Response(200, json=next(listings))
    )
    register = router.post("/api/v1/ssh_keys/").mock(
        return_value=httpx.Response(400, json={"detail": "Key already exists"})
    )
    adapter = await with_transport(httpx.MockTransport(router.async_handler))
    prepared = await adapter.prepare(OFFER, spec(ssh_public_key=bodies.PUBLIC_KEY))
    assert prepared["ssh_key_id"] == "k-9"
    # the race as claimed: listed (none), tried to register and lost, listed again
    assert (listing.call_count, register.call_count) == (2, 1)
    assert [call.request.method for call in router.calls] == ["GET", "POST", "GET"]


async def test_prepare_that_cannot_register_the_key_says_why():
    adapter = await with_transport(
        static(
            ("GET", "/api/v1/ssh_keys/", httpx.Response(200, json=bodies.keys_page())),
            ("POST", "/api/v1/ssh_keys/", httpx.Response(403, json={"detail": "no permission"})),
        )
    )
    error = await failure(adapter.prepare(OFFER, spec(ssh_public_key=bodies.PUBLIC_KEY)))
    assert error.kind is ErrorKind.CREDENTIALS and "no permission" in error.message


async def test_prepare_refuses_an_image_the_offer_lacks(cloud):
    offer = await offer_named(cloud, "NVIDIA H100 PCIe")
    error = await failure(cloud.prepare(offer, spec(image="flux")))
    assert error.kind is ErrorKind.UNAVAILABLE and "flux" in error.message


async def test_prepare_refuses_user_data_for_the_whole_provider(cloud):
    offer = await offer_named(cloud, "n3-H100x1")
    error = await failure(cloud.prepare(offer, spec(user_data="#cloud-config\n")))
    assert (error.kind, error.block_scope) == (ErrorKind.UNAVAILABLE, BlockScope.PROVIDER)


async def test_prepare_refuses_an_offer_it_did_not_make(cloud):
    offer = await offer_named(cloud, "n3-H100x1")
    foreign = offer.model_copy(update={"detail": {"instance_type": "x"}})
    assert (await failure(cloud.prepare(foreign, spec()))).kind is ErrorKind.INVALID_REQUEST


# ---------------------------------------------------------------------------- create


async def test_create_sends_the_offer_and_the_identity(prime):
    config = PrimeConfig(team_id="team-42", disk_gb=200)
    adapter = PrimeCloud(config, api_key=API_KEY, transport=prime.transport())
    offer = next(
        o for o in await adapter.plan(ResourceRequest()) if o.instance_type == "NVIDIA H100 PCIe"
    )
    prepared = await adapter.prepare(offer, spec(ssh_public_key=bodies.PUBLIC_KEY))
    assert await adapter.create(offer, prepared, spec()) == ["pod-0002"]
    assert prime.created == [
        {
            "pod": {
                "name": LABEL,
                "cloudId": "NVIDIA H100 PCIe",
                "gpuType": "H100_80GB",
                "socket": "PCIe",
                "gpuCount": 1,
                "image": "ubuntu_22_cuda_12",
                "autoRestart": False,
                "diskSize": 200,
                "vcpus": 16,
                "memory": 251,
                "dataCenterId": "US-KS-2",
                "country": "US",
                "security": "secure_cloud",
                "sshKeyId": "key-0001",
            },
            "provider": {"type": "runpod"},
            "team": {"teamId": "team-42"},
        }
    ]
    assert prime.violations == []


async def test_create_does_not_send_the_bootstrap_secret(cloud, prime):
    from providers.base import NodeBootstrap

    offer = await offer_named(cloud, "n3-H100x1")
    secret = "join-token-must-not-leave"
    with_token = spec(bootstrap=NodeBootstrap(api_url="https://api.example", join_token=secret))
    await cloud.create(offer, await cloud.prepare(offer, with_token), with_token)
    assert secret not in json.dumps(prime.created)
    # ... nor anywhere else in any request: URL, headers or body, as sent
    assert "POST /api/v1/pods/" in prime.calls
    assert_never_sent(secret, (call.request for call in prime.router.calls))


@pytest.mark.parametrize(
    ("response", "kind", "scope"),
    [
        (httpx.Response(400, json=bodies.STOCKOUT), ErrorKind.CAPACITY, None),
        (
            httpx.Response(402, json={"detail": "Payment required"}),
            ErrorKind.QUOTA,
            BlockScope.PROVIDER,
        ),
        (httpx.Response(400, json=bodies.NO_BALANCE), ErrorKind.QUOTA, BlockScope.PROVIDER),
        (httpx.Response(401, json=bodies.UNAUTHORIZED), ErrorKind.CREDENTIALS, None),
        (httpx.Response(422, json=bodies.VALIDATION), ErrorKind.INVALID_REQUEST, None),
        (httpx.Response(500, json={"detail": "Internal Server Error"}), ErrorKind.FAILED, None),
        (httpx.Response(429, json={"detail": "slow"}), ErrorKind.TRANSIENT, None),
        (httpx.ReadTimeout("no answer"), ErrorKind.TRANSIENT, None),
        (httpx.Response(200, json={"name": LABEL}), ErrorKind.FAILED, None),  # no id
        (httpx.Response(200, text="created!"), ErrorKind.FAILED, None),
    ],
)
async def test_create_failures_are_classified(response, kind, scope):
    adapter = await with_transport(static(("POST", "/api/v1/pods/", response)))
    offer_cloud = PrimeCloud(
        PrimeConfig(), api_key=API_KEY, transport=FakePrime(OFFERS).transport()
    )
    offer = await offer_named(offer_cloud, "n3-H100x1")
    error = await failure(adapter.create(offer, {"image": "ubuntu_22_cuda_12"}, spec()))
    assert (error.kind, error.block_scope) == (kind, scope)
    assert API_KEY not in error.message


# ---------------------------------------------------------------------------- observe


def pods_route(*pages: dict[str, Any]) -> tuple[str, str, Any]:
    def answer(request: httpx.Request) -> httpx.Response:
        offset = int(request.url.params["offset"])
        return httpx.Response(200, json=pages[offset // 100])

    return ("GET", "/api/v1/pods/", answer)


async def test_observe_finds_only_this_vm_s_live_pods():
    page = bodies.pods_page(
        bodies.pod("pod-1", LABEL, "ACTIVE", "FINISHED", ssh="root@203.0.113.5 -p 22"),
        bodies.pod("pod-2", LABEL, "TERMINATED", "TERMINATED"),
        bodies.pod("pod-3", "gpuprov-other-a1-n0-000000", "PROVISIONING"),
        bodies.pod("pod-4", "my-notebook", "ACTIVE", "FINISHED"),
    )
    adapter = await with_transport(static(pods_route(page)))
    [pod] = await adapter.observe(HERE, VM)
    assert (pod.id, pod.status, pod.ssh.host, pod.ssh.port) == (
        "pod-1",
        InstanceStatus.RUNNING,
        "203.0.113.5",
        22,
    )


@pytest.mark.parametrize("missing", ["absent", "null"])
async def test_a_pod_that_does_not_say_its_status_is_pending_not_an_unreadable_answer(missing):
    # APIPodConfig documents `status` with default PROVISIONING and `installationStatus` with
    # default PENDING: a pod without them is one Prime has not placed yet.
    fresh = bodies.pod("pod-1", LABEL)
    for field in ("status", "installationStatus"):
        if missing == "absent":
            del fresh[field]
        else:
            fresh[field] = None
    adapter = await with_transport(static(pods_route(bodies.pods_page(fresh))))
    [pod] = await adapter.observe(HERE, VM)
    assert (pod.id, pod.status) == ("pod-1", InstanceStatus.PENDING)
    assert (pod.message or "").startswith("PROVISIONING, installation PENDING")


async def test_observe_reads_every_page_of_pods():
    others = [bodies.pod(f"x-{i}", f"someone-{i}", "ACTIVE") for i in range(100)]
    first = bodies.pods_page(*others, total=101)
    second = bodies.pods_page(bodies.pod("pod-9", LABEL, "DELETING"), offset=100, total=101)
    adapter = await with_transport(static(pods_route(first, second)))
    [pod] = await adapter.observe(HERE, VM)
    assert (pod.id, pod.status) == ("pod-9", InstanceStatus.STOPPING)


async def test_observe_region_groups_every_gpuprov_pod_by_vm():
    page = bodies.pods_page(
        bodies.pod("pod-1", LABEL, "PROVISIONING"),
        bodies.pod("pod-2", LABEL, "ERROR", "ERROR", installationFailure="no GPU found"),
        bodies.pod("pod-3", "gpuprov-other-a1-n0-000000", "PENDING"),
        bodies.pod("pod-4", "my-notebook", "ACTIVE", "FINISHED"),
    )
    adapter = await with_transport(static(pods_route(page)))
    listing = await adapter.observe_region(Location(provider="prime", region="united_states"))
    assert {vm: [(o.id, o.status) for o in pods] for vm, pods in listing.items()} == {
        VM: [("pod-1", InstanceStatus.PENDING), ("pod-2", InstanceStatus.FAILED)],
        "other-a1-n0-000000": [("pod-3", InstanceStatus.PENDING)],
    }


async def test_an_unreadable_pod_of_ours_is_an_error_not_a_missing_pod():
    broken = {"id": "", "name": LABEL, "status": "ACTIVE"}  # no usable id
    page = bodies.pods_page(broken, bodies.pod("pod-2", "someone", "ACTIVE"))
    adapter = await with_transport(static(pods_route(page)))
    assert (await failure(adapter.observe(HERE, VM))).kind is ErrorKind.TRANSIENT


async def test_a_listing_that_never_ends_is_an_error_not_a_partial_answer():
    endless = bodies.pods_page(
        *[bodies.pod(f"x-{i}", "someone", "ACTIVE") for i in range(100)], total=10**6
    )
    adapter = await with_transport(
        static(("GET", "/api/v1/pods/", httpx.Response(200, json=endless))), max_pages=3
    )
    error = await failure(adapter.observe(HERE, VM))
    assert error.kind is ErrorKind.TRANSIENT and "3 pages" in error.message


# ---------------------------------------------------------------------------- delete / cleanup


async def test_whole_lifecycle_on_the_fake_api(cloud, prime):
    offer = await offer_named(cloud, "n3-H100x1")
    [pod_id] = await cloud.create(offer, await cloud.prepare(offer, spec()), spec())
    states = [[o.status for o in await cloud.observe(offer.location, VM)] for _ in range(3)]
    assert states == [[InstanceStatus.PENDING], [InstanceStatus.RUNNING], [InstanceStatus.RUNNING]]
    await cloud.delete(offer.location, VM, [pod_id])
    assert await cloud.observe(offer.location, VM) == []
    assert prime.deleted == [pod_id] and prime.live_pods() == []


async def test_delete_of_pods_already_gone_is_success():
    adapter = await with_transport(
        static(
            ("DELETE", "/api/v1/pods/pod-1", httpx.Response(404, json=bodies.NOT_FOUND)),
            (
                "DELETE",
                "/api/v1/pods/pod-2",
                httpx.Response(400, json={"detail": "Pod already terminated"}),
            ),
            ("DELETE", "/api/v1/pods/pod-3", httpx.Response(200, json={"status": "TERMINATED"})),
        )
    )
    await adapter.delete(HERE, VM, ["pod-1", "pod-2", "pod-3", "../ssh_keys/x"])


@pytest.mark.parametrize(
    ("response", "kind"),
    [
        (httpx.Response(500, text="oops"), ErrorKind.TRANSIENT),
        (httpx.Response(401, json=bodies.UNAUTHORIZED), ErrorKind.CREDENTIALS),
        (httpx.ConnectTimeout("slow"), ErrorKind.TRANSIENT),
    ],
)
async def test_delete_failures_are_classified(response, kind):
    adapter = await with_transport(static(("DELETE", "/api/v1/pods/pod-1", response)))
    assert (await failure(adapter.delete(HERE, VM, ["pod-1"]))).kind is kind


async def test_cleanup_leaves_the_shared_key_and_calls_nothing(cloud, prime):
    offer = await offer_named(cloud, "n3-H100x1")
    await cloud.prepare(offer, spec(ssh_public_key=bodies.PUBLIC_KEY))
    calls = len(prime.calls)
    await cloud.cleanup(offer.location, VM)
    await cloud.cleanup(offer.location, VM)
    assert len(prime.calls) == calls and len(prime.keys) == 1


async def test_diagnose_reports_a_failed_installation():
    page = bodies.pods_page(
        bodies.pod("pod-1", LABEL, "ACTIVE", "ERROR", installationFailure="driver install failed")
    )
    adapter = await with_transport(static(pods_route(page)))
    diagnosis = await adapter.diagnose(HERE, VM)
    assert diagnosis.verdict.value == "unhealthy"
    assert diagnosis.findings[0].message == "driver install failed"


async def test_offers_and_prepared_state_hold_no_secret(cloud):
    offers = await cloud.plan(ResourceRequest())
    prepared = await cloud.prepare(offers[1], spec(ssh_public_key=bodies.PUBLIC_KEY))
    assert API_KEY not in json.dumps([o.model_dump(mode="json") for o in offers])
    assert API_KEY not in json.dumps(prepared)


async def test_a_zero_price_is_no_price_not_a_free_pod():
    # Prices.onDemand is a bare number in the document; 0 is what an unpriced item carries.
    free = {**bodies.HYPERSTACK_H100, "prices": {**bodies.HYPERSTACK_H100["prices"], "onDemand": 0}}
    page = bodies.availability(free, total=1)
    adapter = await with_transport(
        static(("GET", "/api/v1/availability/gpus", httpx.Response(200, json=page)))
    )
    [offer] = await adapter.plan(ResourceRequest())
    assert offer.price is None
