"""Each primitive of the Vast adapter over HTTP (respx): the calls it makes, the answers it
reads, and every error path, against the fake Vast API (which checks each request against
Vast's OpenAPI files)."""

from __future__ import annotations

import json

import asyncssh
import httpx
import pytest

from providers.base import (
    InstanceSpec,
    InstanceStatus,
    Location,
    NodeBootstrap,
    ResourceRequest,
    SshEndpoint,
)
from providers.errors import BlockScope, ErrorKind, ProviderError
from providers.vast.cloud import VastCloud
from tests.providers.vast import fixtures
from tests.providers.vast.conftest import vast_config
from tests.providers.vast.fake_api import FakeVastApi

H100X8 = ResourceRequest(gpu="H100", gpus_per_node=8)
HERE = Location(provider="vast", region="US")
CREATE_PATH = "/api/v0/asks/{}/"
LIST_PATH = "/api/v1/instances/"


def spec(vm: str = "job-a1-n0-abc123", **fields: object) -> InstanceSpec:
    values: dict[str, object] = {"job": "job", "node_index": 0, "attempt": 1, **fields}
    return InstanceSpec(vm=vm, **values)


async def first_offer(cloud: VastCloud, api: FakeVastApi, ask_id: int = 101):
    api.listings = [fixtures.h100_listing(ask_id, 20.0)]
    (offer,) = await cloud.plan(H100X8)
    return offer


# ------------------------------------------------------------------ plan


async def test_plan_searches_once_with_the_nodes_shape_and_returns_cheapest_first(cloud, vast_api):
    vast_api.listings = [
        fixtures.h100_listing(303, 24.5, gpu_name="H100 PCIE"),
        fixtures.h100_listing(101, 18.25),
        fixtures.h100_listing(202, 18.25),
        fixtures.h100_listing(404, 9.0, gpu_name="RTX 4090"),  # not asked for
    ]
    offers = await cloud.plan(H100X8)

    (request,) = vast_api.requests
    body = json.loads(request.content)
    assert request.headers["authorization"] == f"Bearer {fixtures.API_KEY}"
    assert body["type"] == "on-demand"  # what Vast's client and the search's example send
    assert body["order"] == [["dph_total", "asc"], ["id", "asc"]]
    assert body["gpu_name"] == {"in": ["H100 SXM", "H100 PCIE", "H100 NVL", "H100"]}
    assert body["num_gpus"] == {"eq": 8}
    assert body["rentable"] == {"eq": True} and body["rented"] == {"eq": False}
    assert body["verified"] == {"eq": True}
    assert body["reliability"] == {"gte": 0.95}
    assert body["direct_port_count"] == {"gte": 1}
    assert body["allocated_storage"] == 50.0 and body["disk_space"] == {"gte": 50.0}
    assert "geolocation" not in body

    assert [o.id for o in offers] == ["vast/101", "vast/202", "vast/303"]
    cheapest = offers[0]
    assert cheapest.price is not None and cheapest.price.amount == 18.25
    assert cheapest.price.source == "vast: POST /api/v0/bundles/ dph_total"
    assert (cheapest.region, cheapest.gpu_name, cheapest.gpu_count) == ("US", "H100 SXM", 8)
    assert cheapest.detail["ask_id"] == 101 and cheapest.detail["runtype"] == "ssh_direct"


async def test_plan_sends_regions_and_job_minimums_and_keeps_max_offers(vast_api):
    config = vast_config(regions=["us", "CA"], max_offers=2, disk_gb=40, min_reliability=None)
    cloud = VastCloud(config, api_key=fixtures.API_KEY)
    vast_api.listings = [fixtures.h100_listing(i, 10.0 + i) for i in range(1, 6)]
    request = ResourceRequest(gpu="H100", gpus_per_node=8, min_vcpus=64, min_disk_gb=300)
    offers = await cloud.plan(request)
    await cloud.aclose()

    body = json.loads(vast_api.requests[0].content)
    assert body["geolocation"] == {"in": ["US", "CA"]}
    assert body["cpu_cores_effective"] == {"gte": 64}
    assert body["allocated_storage"] == 300 and body["disk_space"] == {"gte": 300}
    assert "reliability" not in body
    assert [o.id for o in offers] == ["vast/1", "vast/2"]
    assert offers[0].disk_gb == 300


async def test_plan_leaves_out_listings_the_node_does_not_fit_unless_none_fits(cloud, vast_api):
    small = fixtures.h100_listing(1, 5.0, cpu_ram=64000, cpu_cores=128, cpu_cores_effective=16)
    big = fixtures.h100_listing(2, 9.0)
    vast_api.listings = [small, big]
    request = ResourceRequest(gpu="H100", gpus_per_node=8, min_memory_gb=512)
    assert [o.id for o in await cloud.plan(request)] == ["vast/2"]

    vast_api.listings = [small]  # nothing fits: the core is shown why
    assert [o.id for o in await cloud.plan(request)] == ["vast/1"]


@pytest.mark.parametrize(
    "request_",
    [
        ResourceRequest(gpu="H100", gpus_per_node=8, spot=True),
        ResourceRequest(gpu="H100", regions=["us-east-1"]),
        ResourceRequest(gpu="H100", providers=["lambda"]),
        ResourceRequest(gpu="H100", denied_providers=["vast"]),
    ],
    ids=["spot", "no-country-region", "not-allowed", "denied"],
)
async def test_plan_makes_no_call_where_no_vast_offer_could_serve(cloud, vast_api, request_):
    assert await cloud.plan(request_) == []
    assert vast_api.requests == []


async def test_plan_with_job_regions_searches_only_allowed_countries(vast_api):
    cloud = VastCloud(vast_config(regions=["US", "DE"]), api_key=fixtures.API_KEY)
    await cloud.plan(ResourceRequest(gpu="H100", regions=["de", "FR", "eu-west-1"]))
    assert json.loads(vast_api.requests[0].content)["geolocation"] == {"in": ["DE"]}
    assert await cloud.plan(ResourceRequest(gpu="H100", regions=["FR"])) == []
    assert len(vast_api.requests) == 1
    await cloud.aclose()


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (httpx.Response(429, text=fixtures.TOO_FREQUENT_TEXT), ErrorKind.TRANSIENT),
        (httpx.Response(401, json=fixtures.AUTH_ERROR_401), ErrorKind.CREDENTIALS),
        (httpx.Response(400, json={"error": "invalid_request", "msg": "x"}), ErrorKind.FAILED),
        (httpx.Response(502, text="<html>Bad Gateway</html>"), ErrorKind.TRANSIENT),
        (httpx.Response(200, json={"offers": {"id": 1}}), ErrorKind.FAILED),
        (httpx.Response(200, text='{"offers": [{"id": 1'), ErrorKind.TRANSIENT),
    ],
    ids=["429-text", "401", "400-our-filter", "502", "offers-object", "truncated"],
)
async def test_plan_errors_are_classified(cloud, vast_api, answer, kind):
    vast_api.script("POST", "/api/v0/bundles/", answer)
    with pytest.raises(ProviderError) as caught:
        await cloud.plan(H100X8)
    assert caught.value.kind is kind


async def test_network_failure_is_transient(cloud, router):
    router.post(f"{fixtures.BASE_URL}/api/v0/bundles/").mock(
        side_effect=httpx.ConnectTimeout("timed out")
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.plan(H100X8)
    assert caught.value.kind is ErrorKind.TRANSIENT
    assert "ConnectTimeout" in caught.value.message


# ------------------------------------------------------------------ prepare / create


async def test_create_labels_the_instance_and_hands_over_key_and_user_data_but_never_a_token(
    cloud, vast_api
):
    # Vast lists `extra_env` and `onstart` back to anyone who can read the account
    # (show_instance.yaml), so the join token goes in neither: the core starts the agent over
    # SSH with a fresh token (activities/bootstrap.py), using the key onstart installs.
    offer = await first_offer(cloud, vast_api)
    token = "join-token-that-must-stay-secret"
    node = spec(
        ssh_public_key="ssh-ed25519 AAAAC3Nza user@host",
        user_data="#!/bin/sh\necho hello\n",
        bootstrap=NodeBootstrap(api_url="http://10.0.0.1:8700", join_token=token),
    )
    assert await cloud.prepare(offer, node) == {}
    ids = await cloud.create(offer, {}, node)

    ((ask, body),) = vast_api.created
    assert ask == 101 and ids == ["4000"]
    assert body["label"] == "gpuprov-job-a1-n0-abc123"
    assert body["image"] == "vastai/base-image:@vastai-automatic-tag"
    assert (body["disk"], body["runtype"], body["target_state"]) == (50.0, "ssh_direct", "running")
    assert body["cancel_unavail"] is True
    assert "ssh-ed25519 AAAAC3Nza user@host" in body["onstart"]
    assert "/root/.ssh/authorized_keys" in body["onstart"]
    assert "env" not in body
    assert token not in json.dumps(body)
    assert cloud.capabilities().node_agent and cloud.config.ssh_bootstrap


async def test_create_runs_the_jobs_image_and_publishes_its_ports_in_env(cloud, vast_api):
    offer = await first_offer(cloud, vast_api)
    node = spec(image="ghcr.io/me/serve:2", ports=[8000, 22, 8000, 6006])
    await cloud.create(offer, await cloud.prepare(offer, node), node)
    ((_, body),) = vast_api.created
    assert body["image"] == "ghcr.io/me/serve:2"
    # Docker's -p flags, the form create_instance.yaml documents; 22 is the runtype's
    assert body["env"] == "-p 8000:8000 -p 6006:6006"


@pytest.mark.parametrize(
    ("ssh", "ports", "direct_ports"),
    [("direct", [], 1), ("direct", [8000, 6006, 22], 3), ("proxy", [], None), ("proxy", [80], 1)],
)
async def test_plan_asks_for_a_direct_port_per_published_port(vast_api, ssh, ports, direct_ports):
    cloud = VastCloud(vast_config(ssh=ssh), api_key=fixtures.API_KEY)
    vast_api.listings = [fixtures.h100_listing(101, 20.0)]
    await cloud.plan(H100X8.model_copy(update={"ports": ports}))
    await cloud.aclose()
    (request,) = vast_api.requests
    sent = json.loads(request.content).get("direct_port_count")
    assert sent == ({"gte": direct_ports} if direct_ports else None)


async def test_vast_declares_neither_image_nor_ports_unsupported(cloud):
    assert not {"image", "ports"} & set(cloud.capabilities().unsupported)


async def test_a_vanished_listing_is_capacity(cloud, vast_api):
    offer = await first_offer(cloud, vast_api)
    vast_api.gone_asks.add(101)
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer, {}, spec())
    assert caught.value.kind is ErrorKind.CAPACITY
    assert "no_such_ask" in caught.value.message
    assert vast_api.instances == {}


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (410, fixtures.NO_SUCH_ASK_410, ErrorKind.CAPACITY),
        (400, fixtures.INVALID_ARGS_400, ErrorKind.INVALID_REQUEST),
        (403, fixtures.NOT_YOUR_OWN_403, ErrorKind.INVALID_REQUEST),
        (401, fixtures.AUTH_ERROR_401, ErrorKind.CREDENTIALS),
        (429, fixtures.TOO_FREQUENT_429, ErrorKind.TRANSIENT),
        (500, {"success": False, "msg": "internal"}, ErrorKind.TRANSIENT),
        (400, {"success": False, "error": "brand_new_code", "msg": "?"}, ErrorKind.FAILED),
    ],
)
async def test_create_errors_are_classified_by_code(cloud, vast_api, status, body, kind):
    offer = await first_offer(cloud, vast_api)
    vast_api.script("PUT", CREATE_PATH.format(101), httpx.Response(status, json=body))
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer, {}, spec())
    assert caught.value.kind is kind


async def test_a_failed_create_that_made_a_contract_destroys_it_and_fails(cloud, vast_api):
    offer = await first_offer(cloud, vast_api)
    half = {"success": False, "new_contract": 777, "error": "invalid_args", "msg": "bad image"}
    vast_api.script("PUT", CREATE_PATH.format(101), httpx.Response(200, json=half))
    vast_api.instances[777] = fixtures.booting(777, "gpuprov-job-a1-n0-abc123")
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer, {}, spec())
    assert caught.value.kind is ErrorKind.FAILED
    assert "777" in caught.value.message and "destroyed" in caught.value.message
    assert vast_api.destroyed == [777]


async def test_when_that_destroy_fails_too_teardown_is_told_to_find_the_label(cloud, vast_api):
    offer = await first_offer(cloud, vast_api)
    half = {"success": False, "new_contract": 778, "msg": "could not start"}
    vast_api.script("PUT", CREATE_PATH.format(101), httpx.Response(500, json=half))
    vast_api.script(
        "DELETE", "/api/v0/instances/778/", httpx.Response(429, text=fixtures.TOO_FREQUENT_TEXT)
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer, {}, spec())
    assert caught.value.kind is ErrorKind.FAILED
    assert "finds it by its label" in caught.value.message
    # the destroy was tried (and refused), not skipped
    deletes = [r.url.path for r in vast_api.requests if r.method == "DELETE"]
    assert deletes == ["/api/v0/instances/778/"]


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (httpx.Response(200, json={"success": True}), ErrorKind.FAILED),
        (httpx.Response(200, text="<html>oops"), ErrorKind.TRANSIENT),
        (httpx.Response(200, json=["new_contract", 5]), ErrorKind.FAILED),
    ],
    ids=["no-contract", "not-json", "a-list"],
)
async def test_create_answers_without_an_id(cloud, vast_api, answer, kind):
    offer = await first_offer(cloud, vast_api)
    vast_api.script("PUT", CREATE_PATH.format(101), answer)
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer, {}, spec())
    assert caught.value.kind is kind


async def test_create_timeout_is_transient_so_the_core_observes_and_adopts(cloud, vast_api):
    offer = await first_offer(cloud, vast_api)
    vast_api.script("PUT", CREATE_PATH.format(101), httpx.ReadTimeout("read timed out"))
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer, {}, spec())
    assert caught.value.kind is ErrorKind.TRANSIENT


async def test_prepare_refuses_what_vast_cannot_carry_before_anything_exists(cloud, vast_api):
    offer = await first_offer(cloud, vast_api)
    with pytest.raises(ProviderError) as caught:
        await cloud.prepare(offer, spec(user_data="#cloud-config\npackages: [git]\n"))
    assert (caught.value.kind, caught.value.block_scope) == (
        ErrorKind.UNAVAILABLE,
        BlockScope.PROVIDER,
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.prepare(offer, spec(user_data="#!/bin/sh\n" + "echo x\n" * 600))
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    foreign = offer.model_copy(update={"detail": {}})
    with pytest.raises(ProviderError) as caught:
        await cloud.prepare(foreign, spec())
    assert caught.value.kind is ErrorKind.INVALID_REQUEST
    assert len(vast_api.requests) == 1  # only the plan's search


async def test_the_largest_user_data_vast_accepts_beside_the_key_fits_its_onstart_limit(
    cloud, vast_api
):
    # Vast: `onstart` (with `args`) is at most 4,096 characters (create_instance.yaml). It
    # carries the worker's client key (the SSH bootstrap logs in with it) and the shell user
    # data, base64; nothing of the node agent, which comes over SSH.
    offer = await first_offer(cloud, vast_api)
    key = asyncssh.generate_private_key("ssh-ed25519", comment="gpuprov")
    public = key.export_public_key().decode().strip()

    def node(size: int) -> InstanceSpec:
        return spec(ssh_public_key=public, user_data="#!/bin/sh\n" + "x" * (size - 10))

    async def accepted(size: int) -> bool:
        try:
            await cloud.prepare(offer, node(size))
        except ProviderError:
            return False
        return True

    low, high = 16, 4096
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if await accepted(middle) else (low, middle - 1)
    assert low > 2500  # room for a real script beside the key
    await cloud.create(offer, {}, node(low))
    ((_, body),) = vast_api.created
    assert len(body["onstart"]) <= 4096 and public in body["onstart"]
    assert not await accepted(low + 1)


# ------------------------------------------------------------------ observe


async def test_observe_filters_by_label_and_reads_every_page(cloud, vast_api):
    label = "gpuprov-job-a1-n0-abc123"
    vast_api.page_size = 2
    for instance_id in (11, 12, 13):
        vast_api.instances[instance_id] = fixtures.instance(instance_id, label)
    vast_api.instances[14] = fixtures.instance(14, "someone-else")
    observed = await cloud.observe(HERE, "job-a1-n0-abc123")

    first, second = vast_api.requests
    assert json.loads(first.url.params["select_filters"]) == {"label": {"eq": label}}
    assert first.url.params["limit"] == "25"
    assert "after_token" not in first.url.params and second.url.params["after_token"] == "2"
    assert [o.id for o in observed] == ["11", "12", "13"]
    assert observed[0].status is InstanceStatus.RUNNING
    assert observed[0].ssh == SshEndpoint(host="192.0.2.45", port=20000, user="root")


async def test_observe_reports_states_per_the_mapping(cloud, vast_api):
    label = "gpuprov-vm"
    vast_api.instances = {
        1: fixtures.booting(1, label),
        2: fixtures.instance(2, label, actual_status="exited", status_msg="exit code 1"),
        3: fixtures.booting(
            3, label, actual_status="created", status_msg="OCI runtime create failed: x"
        ),
        4: fixtures.instance(4, label, ports=None),  # running, port not mapped yet
    }
    vast_api.boot_polls = 99
    by_id = {o.id: o for o in await cloud.observe(HERE, "vm")}
    assert by_id["1"].status is InstanceStatus.PENDING
    assert by_id["2"].status is InstanceStatus.FAILED and "exit code 1" in by_id["2"].message
    assert by_id["3"].status is InstanceStatus.FAILED
    assert by_id["4"].status is InstanceStatus.PENDING and by_id["4"].ssh is None


async def test_observe_region_lists_every_gpuprov_instance_of_the_account(cloud, vast_api):
    vast_api.page_size = 2
    vast_api.instances = {
        1: fixtures.instance(1, "gpuprov-a-a1-n0-x"),
        2: fixtures.instance(2, "my-notebook"),
        3: fixtures.instance(3, None),
        4: fixtures.instance(4, "gpuprov-b-a1-n0-y"),
        5: fixtures.instance(5, "gpuprov-a-a1-n0-x"),
    }
    listing = await cloud.observe_region(Location(provider="vast", region="all"))
    assert {vm: [o.id for o in found] for vm, found in listing.items()} == {
        "a-a1-n0-x": ["1", "5"],
        "b-a1-n0-y": ["4"],
    }
    assert len(vast_api.requests) == 3
    assert all("select_filters" not in r.url.params for r in vast_api.requests)
    assert cloud.sweep_regions() == ["all"]


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (httpx.Response(200, json=fixtures.page([], next_token="0")), ErrorKind.FAILED),
        (httpx.Response(200, json={"instances": "none"}), ErrorKind.FAILED),
        (httpx.Response(400, json=fixtures.LIST_BAD_TOKEN_400), ErrorKind.TRANSIENT),
        (httpx.Response(429, text=fixtures.TOO_FREQUENT_TEXT), ErrorKind.TRANSIENT),
        (httpx.Response(200, json=fixtures.page([{"id": None, "label": "gpuprov-vm"}])), None),
    ],
    ids=["token-repeats", "wrong-type", "bad-token", "429", "unusable-id"],
)
async def test_observe_errors(cloud, vast_api, answer, kind):
    vast_api.script("GET", LIST_PATH, answer, answer)
    with pytest.raises(ProviderError) as caught:
        await cloud.observe(HERE, "vm")
    assert caught.value.kind is (kind or ErrorKind.FAILED)


# ------------------------------------------------------------------ delete / cleanup


async def test_delete_destroys_each_id_and_gone_is_success(cloud, vast_api):
    vast_api.instances[21] = fixtures.instance(21, "gpuprov-vm")
    vast_api.script(
        "DELETE",
        "/api/v0/instances/23/",
        httpx.Response(200, json={"success": False, "error": "no_such_instance", "msg": "gone"}),
    )
    await cloud.delete(HERE, "vm", ["21", "22", "23", "not-a-vast-id"])
    assert vast_api.destroyed == [21]
    assert [r.url.path for r in vast_api.requests] == [
        "/api/v0/instances/21/",
        "/api/v0/instances/22/",  # 404 not_found: already gone
        "/api/v0/instances/23/",
    ]


async def test_delete_tries_every_id_before_raising(cloud, vast_api):
    vast_api.instances[32] = fixtures.instance(32, "gpuprov-vm")
    vast_api.script("DELETE", "/api/v0/instances/31/", httpx.Response(429, text="too frequent"))
    with pytest.raises(ProviderError) as caught:
        await cloud.delete(HERE, "vm", ["31", "32"])
    assert caught.value.kind is ErrorKind.TRANSIENT
    assert vast_api.destroyed == [32]


async def test_cleanup_and_capabilities_make_no_call(cloud, vast_api):
    await cloud.cleanup(HERE, "vm")
    hints = cloud.capabilities()
    assert vast_api.requests == []
    assert (hints.node_agent, hints.unsupported) == (True, ["spot"])  # the agent over SSH
    assert cloud.config.ssh_bootstrap is True
    # Vast charges the active rental per second, no minimum stated.
    assert (hints.billing.granularity_seconds, hints.billing.minimum_seconds) == (1, 0)
    assert (hints.boot_timeout, hints.delete_timeout, hints.poll_interval) == (10, 10, 0.05)


# ------------------------------------------------------------------ several nodes, one offer


async def test_each_node_rents_its_own_listing_at_no_higher_price(cloud, vast_api):
    vast_api.listings = [
        fixtures.h100_listing(1, 10.0),
        fixtures.h100_listing(2, 10.5),
        fixtures.h100_listing(3, 11.0),
        fixtures.h100_listing(4, 10.2, geolocation="Quebec, CA"),  # another country
        fixtures.h100_listing(5, 10.1, gpu_name="H100 PCIE"),  # another model
    ]
    offers = {o.id: o for o in await cloud.plan(H100X8)}
    assert offers["vast/1"].detail["ask_ids"] == [1]
    assert offers["vast/2"].detail["ask_ids"] == [2, 1]
    assert offers["vast/3"].detail["ask_ids"] == [3, 1, 2]

    with pytest.raises(ProviderError) as caught:  # before anything is created
        await cloud.prepare(offers["vast/1"], spec(node_index=1))
    assert caught.value.kind is ErrorKind.UNAVAILABLE

    second = offers["vast/3"]
    await cloud.prepare(second, spec("j-a2-n1-x", node_index=1))
    assert await cloud.create(second, {}, spec("j-a2-n0-x", node_index=0)) == ["4000"]
    assert await cloud.create(second, {}, spec("j-a2-n1-x", node_index=1)) == ["4001"]
    assert [ask for ask, _ in vast_api.created] == [3, 1]


async def test_a_listing_that_was_taken_is_skipped_by_the_next_nodes(cloud, vast_api):
    vast_api.listings = [fixtures.h100_listing(i, 10.0 + i) for i in (1, 2, 3)]
    offers = {o.id: o for o in await cloud.plan(H100X8)}
    vast_api.gone_asks.add(1)
    with pytest.raises(ProviderError):
        await cloud.create(offers["vast/2"], {}, spec("j-a1-n1-x", node_index=1))  # on ask 1
    assert await cloud.create(offers["vast/3"], {}, spec("j-a2-n1-x", node_index=1)) == ["4000"]
    assert [ask for ask, _ in vast_api.created] == [2]


async def test_a_zero_dph_total_is_no_price_not_a_free_listing(cloud, vast_api):
    vast_api.listings = [fixtures.h100_listing(101, 0.0), fixtures.h100_listing(102, 20.0)]
    offers = {o.id: o for o in await cloud.plan(H100X8)}
    assert offers["vast/101"].price is None
    assert offers["vast/102"].price is not None and offers["vast/102"].price.amount == 20.0
    assert list(offers) == ["vast/102", "vast/101"]  # unpriced last
