"""RunPodCloud over HTTP (respx, no network): construction, plan, prepare and create, with
create's error paths."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

from gpuprov.config import ProvidersSettings
from providers import build_all
from providers.base import NodeBootstrap, ResourceRequest
from providers.errors import ErrorKind, ProviderError
from providers.runpod.cloud import RunPodCloud
from providers.runpod.config import RunPodConfig
from providers.settings import MissingCredentials
from tests.providers.runpod import samples
from tests.providers.runpod.fake_api import FakeRunPod
from tests.providers.runpod.support import H100, SPEC, an_offer, problem_response, routed
from tests.providers.wire import assert_never_sent, carries

# --------------------------------------------------------------------------- construction


def test_registry_builds_runpod_only_with_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    built = build_all(ProvidersSettings(runpod=RunPodConfig()))
    assert "runpod" not in built.providers
    assert "RUNPOD_API_KEY" in built.skipped["runpod"]

    key_file = tmp_path / "runpod.key"
    key_file.write_text(samples.API_KEY + "\n")
    built = build_all(ProvidersSettings(runpod=RunPodConfig(api_key_file=str(key_file))))
    assert isinstance(built.providers["runpod"], RunPodCloud)


def test_missing_credentials_says_how_to_supply_them(monkeypatch):
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    with pytest.raises(MissingCredentials, match="RUNPOD_API_KEY.*api_key_file.*api_key"):
        RunPodCloud(RunPodConfig())


async def test_the_key_is_sent_as_a_bearer_token_and_nowhere_else(api):
    cloud = api.cloud()
    await cloud.plan(H100)
    await cloud.aclose()
    request, _ = api.exchanges[0]
    assert request.headers["Authorization"] == f"Bearer {samples.API_KEY}"
    assert samples.API_KEY not in str(request.url)
    # every request, as sent: the key in its Authorization header and in nothing else
    assert api.exchanges
    for request, _ in api.exchanges:
        assert request.headers["Authorization"] == f"Bearer {samples.API_KEY}"
        assert not carries(request, samples.API_KEY, omit_headers=("authorization",)), request


def test_capabilities_are_the_configured_timing_hints():
    cloud = RunPodCloud(
        RunPodConfig(boot_timeout=600, delete_timeout=120, poll_interval=5), api_key="k"
    )
    hints = cloud.capabilities()
    assert (hints.boot_timeout, hints.delete_timeout, hints.poll_interval) == (600, 120, 5)
    assert hints.node_agent is True  # started over SSH: the section's ssh_bootstrap is on
    assert cloud.config.ssh_bootstrap is True
    # RunPod bills compute per second, no minimum stated.
    assert (hints.billing.granularity_seconds, hints.billing.minimum_seconds) == (1, 0)
    assert RunPodCloud(RunPodConfig(), api_key="k").capabilities().boot_timeout == 900


def test_sweep_regions_are_the_configured_data_centres_without_a_call():
    assert RunPodCloud(RunPodConfig(), api_key="k").sweep_regions() == []
    cloud = RunPodCloud(RunPodConfig(data_centers=["US-KS-2", "EU-RO-1"]), api_key="k")
    assert cloud.sweep_regions() == ["US-KS-2", "EU-RO-1"]


# --------------------------------------------------------------------------- plan


async def test_plan_asks_the_catalog_for_pod_stock_of_n_gpus_per_cloud_type(api):
    cloud = api.cloud(cloud_types=["SECURE", "COMMUNITY"], min_cuda_version="12.4")
    offers = await cloud.plan(ResourceRequest(gpu="H100", gpus_per_node=4))
    await cloud.aclose()
    queries = [dict(r.url.params) for r, _ in api.exchanges]
    assert queries == [
        {
            "include": "AVAILABILITY",
            "product": "POD",
            "count": "4",
            "cloud": cloud_type,
            "minCudaVersion": "12.4",
        }
        for cloud_type in ("SECURE", "COMMUNITY")
    ]
    assert {o.detail["cloud"] for o in offers} == {"SECURE", "COMMUNITY"}


async def test_plan_is_cheapest_first_and_only_the_asked_gpu(api):
    cloud = api.cloud()
    offers = await cloud.plan(H100)
    await cloud.aclose()
    assert [o.id for o in offers] == [
        "runpod/US-KS-2/secure/8x-NVIDIA-H100-PCIe",
        "runpod/EU-RO-1/secure/8x-NVIDIA-H100-80GB-HBM3",
        "runpod/US-TX-3/secure/8x-NVIDIA-H100-80GB-HBM3",
    ]
    assert [o.price.amount for o in offers if o.price] == pytest.approx([19.12, 21.52, 21.52])


async def test_plan_raises_the_disk_to_the_jobs_minimum(api):
    cloud = api.cloud(disk_gb=50)
    (offer, *_) = await cloud.plan(H100.model_copy(update={"min_disk_gb": 499.5}))
    (small, *_) = await cloud.plan(H100)
    await cloud.aclose()
    assert (offer.disk_gb, offer.detail["disk_gb"]) == (500, 500)
    assert small.detail["disk_gb"] == 50


async def test_a_job_without_gpus_still_asks_for_one(api):
    cloud = api.cloud()
    await cloud.plan(ResourceRequest(gpu=None, gpus_per_node=0))
    await cloud.aclose()
    assert api.exchanges[0][0].url.params["count"] == "1"


# --------------------------------------------------------------------------- prepare / create


async def test_prepare_resolves_the_image_and_calls_nothing(api):
    offer = await an_offer(api)
    cloud = api.cloud(image="my/image:1")
    calls = len(api.exchanges)
    assert await cloud.prepare(offer, SPEC) == {"image": "my/image:1"}
    assert await cloud.prepare(offer, SPEC.model_copy(update={"image": "job/image"})) == {
        "image": "job/image"
    }
    await cloud.aclose()
    assert len(api.exchanges) == calls


async def test_prepare_refuses_an_offer_it_did_not_make(api):
    offer = (await an_offer(api)).model_copy(update={"detail": {"gpu_id": "x"}})
    cloud = api.cloud()
    with pytest.raises(ProviderError) as raised:
        await cloud.prepare(offer, SPEC)
    await cloud.aclose()
    assert raised.value.kind is ErrorKind.INVALID_REQUEST


async def test_create_names_the_pod_marks_it_and_passes_the_vm_key_in_env(api):
    offer = await an_offer(api)
    cloud = api.cloud()
    ids = await cloud.create(offer, await cloud.prepare(offer, SPEC), SPEC)
    await cloud.aclose()
    assert ids == ["rp00000001"]
    (body,) = api.created
    assert body == {
        "name": samples.LABEL,
        "image": "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404",
        "gpu": {"id": "NVIDIA H100 PCIe", "count": 8},
        "cloud": "SECURE",
        "dataCenterIds": ["US-KS-2"],
        "disk": 100,
        "ports": ["22/tcp"],
        "env": {"GPUPROV_VM": samples.VM, "PUBLIC_KEY": f"{samples.VM_KEY}\n{samples.USER_KEY}"},
        "startSsh": True,
    }


async def test_create_boots_the_jobs_image_and_publishes_its_ports_beside_ssh(api):
    offer = await an_offer(api)
    cloud = api.cloud(image="configured/image:1")
    spec = SPEC.model_copy(update={"image": "ghcr.io/me/serve:2", "ports": [8000, 22, 8000, 6006]})
    await cloud.create(offer, await cloud.prepare(offer, spec), spec)
    await cloud.aclose()
    (body,) = api.created
    assert body["image"] == "ghcr.io/me/serve:2"
    # "port/protocol", as RunPod documents; 22 once, repeats dropped, the job's order kept
    assert body["ports"] == ["22/tcp", "8000/tcp", "6006/tcp"]


async def test_runpod_declares_neither_image_nor_ports_unsupported(api):
    cloud = api.cloud()
    assert not {"image", "ports"} & set(cloud.capabilities().unsupported)
    await cloud.aclose()


async def test_create_never_writes_the_accounts_ssh_keys(api):
    offer = await an_offer(api)
    cloud = api.cloud()
    await cloud.create(offer, {}, SPEC)
    await cloud.aclose()
    methods = {(r.method, r.url.path) for r, _ in api.exchanges}
    assert ("GET", "/v2/account/ssh-keys") in methods
    assert not any(path == "/v2/account/ssh-keys" and m != "GET" for m, path in methods)


async def test_create_without_account_keys_sends_only_the_vm_key(api):
    offer = await an_offer(api)
    cloud = api.cloud(include_account_ssh_keys=False)
    await cloud.create(offer, {}, SPEC)
    await cloud.aclose()
    assert api.created[0]["env"]["PUBLIC_KEY"] == samples.VM_KEY
    assert api.calls("GET", "/v2/account/ssh-keys") == 0


@pytest.mark.parametrize(
    ("answer", "created"),
    [
        (problem_response(samples.FORBIDDEN_403, 403), True),
        (httpx.Response(200, json={"keys": "not a list"}), True),
        (problem_response(samples.RATE_LIMITED_429, 429), False),  # Transient: create retried
    ],
)
async def test_account_keys_that_cannot_be_read_leave_the_vm_key_alone(answer, created):
    router = respx.MockRouter(base_url=samples.BASE_URL)
    router.get("/v2/account/ssh-keys").mock(return_value=answer)
    create = router.post("/v2/pods").respond(201, json=samples.pod(status="PROVISIONING"))
    cloud = routed(router)
    offer = await an_offer(FakeRunPod())
    try:
        assert await cloud.create(offer, {}, SPEC) == ["7h9k2m4n6p"]
    except ProviderError as error:
        assert not created and error.kind is ErrorKind.TRANSIENT
    await cloud.aclose()
    assert create.called is created
    if created:
        sent = json.loads(create.calls.last.request.content)
        assert sent["env"]["PUBLIC_KEY"] == samples.VM_KEY


async def test_create_without_a_vm_key_leaves_ssh_to_the_account_keys(api):
    offer = await an_offer(api)
    cloud = api.cloud()
    await cloud.create(offer, {}, SPEC.model_copy(update={"ssh_public_key": None}))
    await cloud.aclose()
    assert "PUBLIC_KEY" not in api.created[0]["env"]
    assert api.created[0]["startSsh"] is True
    assert api.calls("GET", "/v2/account/ssh-keys") == 0


async def test_create_does_not_put_the_join_token_or_user_data_anywhere(api):
    secret = "join-token-SECRET-123"
    user_data = "#!/bin/sh\necho user-data-must-stay-home"
    spec = SPEC.model_copy(
        update={
            "bootstrap": NodeBootstrap(api_url="http://api", join_token=secret),
            "user_data": user_data,
        }
    )
    offer = await an_offer(api)
    cloud = api.cloud()
    await cloud.create(offer, {}, spec)
    await cloud.aclose()
    assert api.calls("POST", "/v2/pods") == 1  # the create was sent (and scanned below)
    assert all(secret not in r.content.decode() for r, _ in api.exchanges)
    # anywhere: URL, headers and body of every request, as respx captured them
    assert_never_sent(secret, (call.request for call in api.router.calls))
    assert_never_sent(user_data, (call.request for call in api.router.calls))


async def test_create_with_min_cuda_version_pins_the_host_cuda(api):
    offer = await an_offer(api)
    cloud = api.cloud(min_cuda_version="12.4")
    await cloud.create(offer, {}, SPEC)
    await cloud.aclose()
    assert api.created[0]["gpu"]["minCudaVersion"] == "12.4"


async def test_create_stockout_is_capacity_with_runpods_words(api):
    offer = await an_offer(api)
    api.stockouts.add(("NVIDIA H100 PCIe", "US-KS-2"))
    cloud = api.cloud()
    with pytest.raises(ProviderError) as raised:
        await cloud.create(offer, {}, SPEC)
    await cloud.aclose()
    assert raised.value.kind is ErrorKind.CAPACITY
    assert samples.STOCKOUT in raised.value.message
    assert api.pods == {}


CREATE_FAILURES = [
    (problem_response(samples.VALIDATION_422, 422), ErrorKind.INVALID_REQUEST),
    (problem_response(samples.RULE_400, 400), ErrorKind.UNAVAILABLE),  # "Try your next candidate"
    (problem_response(samples.BAD_REQUEST_400, 400), ErrorKind.UNAVAILABLE),
    (problem_response(samples.UNAUTHORIZED_401, 401), ErrorKind.CREDENTIALS),
    (problem_response(samples.FORBIDDEN_403, 403), ErrorKind.UNAVAILABLE),  # "Skip this candidate"
    (problem_response(samples.BALANCE_402, 402), ErrorKind.QUOTA),
    (problem_response(samples.INTERNAL_500, 500), ErrorKind.TRANSIENT),
    (httpx.Response(502, content=samples.BAD_GATEWAY_HTML), ErrorKind.TRANSIENT),
    (httpx.Response(201, content=b'{"id": '), ErrorKind.FAILED),  # truncated answer
    (httpx.Response(201, json={"name": samples.LABEL}), ErrorKind.FAILED),  # no id
    (httpx.ConnectError("connection refused"), ErrorKind.TRANSIENT),
    (httpx.ReadTimeout("timed out"), ErrorKind.TRANSIENT),
]


@pytest.mark.parametrize(("answer", "kind"), CREATE_FAILURES)
async def test_create_failures_are_classified(api, answer, kind):
    offer = await an_offer(api)
    router = respx.MockRouter(base_url=samples.BASE_URL)
    router.get("/v2/account/ssh-keys").respond(json={"keys": []})
    router.post("/v2/pods").mock(side_effect=[answer])
    cloud = routed(router)
    with pytest.raises(ProviderError) as raised:
        await cloud.create(offer, {}, SPEC)
    await cloud.aclose()
    assert raised.value.kind is kind
    assert samples.API_KEY not in str(raised.value)


async def test_rate_limited_create_is_transient_with_retry_after(api):
    offer = await an_offer(api)
    router = respx.MockRouter(base_url=samples.BASE_URL)
    router.get("/v2/account/ssh-keys").respond(json={"keys": []})
    router.post("/v2/pods").mock(
        return_value=problem_response(samples.RATE_LIMITED_429, 429, **{"Retry-After": "12"})
    )
    cloud = routed(router)
    with pytest.raises(ProviderError) as raised:
        await cloud.create(offer, {}, SPEC)
    await cloud.aclose()
    assert (raised.value.kind, raised.value.retry_after) == (ErrorKind.TRANSIENT, 12.0)


@pytest.mark.parametrize(
    ("answer", "retry_after"),
    [
        (problem_response(samples.INTERNAL_500, 500, **{"Retry-After": "7"}), 7.0),
        (problem_response(samples.problem(503, "Service Unavailable", "try again"), 503), None),
    ],
)
async def test_a_5xx_on_create_is_transient_and_keeps_retry_after(api, answer, retry_after):
    # createPod's own table: "5xx: Transient upstream failure. Retry the same candidate with
    # backoff." The retry observes first, so a pod the failed call did make is adopted.
    offer = await an_offer(api)
    router = respx.MockRouter(base_url=samples.BASE_URL)
    router.get("/v2/account/ssh-keys").respond(json={"keys": []})
    router.post("/v2/pods").mock(return_value=answer)
    cloud = routed(router)
    with pytest.raises(ProviderError) as raised:
        await cloud.create(offer, {}, SPEC)
    await cloud.aclose()
    assert (raised.value.kind, raised.value.retry_after) == (ErrorKind.TRANSIENT, retry_after)


async def test_a_refused_key_on_create_is_credentials_in_runpods_words(api):
    # An echoed key is scrubbed by the core: tests/providers/runpod/test_redaction.py.
    offer = await an_offer(api)
    router = respx.MockRouter(base_url=samples.BASE_URL)
    router.get("/v2/account/ssh-keys").respond(json={"keys": []})
    refusal = samples.problem(401, "Unauthorized", "invalid API key")
    router.post("/v2/pods").mock(return_value=problem_response(refusal, 401))
    cloud = routed(router)
    with pytest.raises(ProviderError) as raised:
        await cloud.create(offer, {}, SPEC)
    await cloud.aclose()
    assert raised.value.kind is ErrorKind.CREDENTIALS
    assert raised.value.message == "RunPod 401 on POST /v2/pods: Unauthorized: invalid API key"
