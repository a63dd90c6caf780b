"""The gce adapter against Google's Discovery documents for Compute Engine v1 and the Cloud
Billing API v1 (tests/fixtures/discovery, see SOURCES.md; the validator is discovery.py).

Every request the adapter sends while it runs each primitive against FakeGce (plan, prepare
with the job's ports, create on-demand from an image family, Spot from a machine image and N1
with its options, a stockout, observe by zone and by region,
observe_region across pages, diagnose, delete, cleanup, the side-resource listing, and the
repeats that answer 404 or 409)
is a documented method with documented parameters and body; every 2xx answer FakeGce gives and
every response fixture in bodies.py uses only documented properties. Error bodies
(`{"error": {...}}`) are not described by Discovery and are not checked here. Negative controls
show the validator rejects a misspelled field, an unknown query parameter and a wrong path."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from providers.base import InstanceSpec, Location, NodeBootstrap, Offer, ResourceRequest
from providers.errors import ErrorKind, ProviderError
from providers.gce.auth import StaticToken
from providers.gce.cloud import GceCloud
from providers.gce.config import GceConfig
from tests.providers.gce import bodies
from tests.providers.gce.discovery import Discovery, document
from tests.providers.gce.fake_gce import (
    STOCKOUT,
    FakeGce,
    gpu_sku,
    h100_accelerator,
    h100_machine,
    quota_error,
)
from tests.providers.gce.test_plan import n1, t4

REGION = Location(provider="gce", region="us-central1")
EXPECTED_METHODS = {
    "compute.machineTypes.aggregatedList",
    "compute.acceleratorTypes.aggregatedList",
    "cloudbilling.services.skus.list",
    "compute.firewalls.insert",
    "compute.firewalls.delete",
    "compute.firewalls.list",
    "compute.instances.insert",
    "compute.zoneOperations.wait",
    "compute.instances.list",
    "compute.instances.aggregatedList",
    "compute.instances.get",
    "compute.zoneOperations.list",
    "compute.instances.delete",
}


@functools.cache
def compute() -> Discovery:
    return Discovery(document("compute.v1"), root="https://compute.test/")


@functools.cache
def billing() -> Discovery:
    return Discovery(document("cloudbilling.v1"), root="https://billing.test/")


def discovery_for(url: str) -> Discovery:
    return billing() if url.startswith(billing().root) else compute()


@dataclass
class Exchange:
    request: httpx.Request
    response: httpx.Response


def spec(vm: str, **extra: Any) -> InstanceSpec:
    return InstanceSpec(
        vm=vm,
        job="train",
        node_index=0,
        attempt=1,
        ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0 gpuprov",
        user_data="#cloud-config\nruncmd: [nvidia-smi]\n",
        labels={"team": "ml", "Cost Center": "42"},
        bootstrap=NodeBootstrap(api_url="https://gpuprov.example", join_token="join-secret"),
        **extra,
    )


def n1_offer(zone: str) -> Offer:
    return Offer(
        id=f"gce/{zone}/n1-t4x2/spot",
        provider="gce",
        region="us-central1",
        zone=zone,
        instance_type="n1-t4x2",
        spot=True,
        detail={
            "machine_type": "n1-standard-8",
            "accelerator_type": "nvidia-tesla-t4",
            "accelerator_count": 2,
            "spot": True,
        },
    )


async def drive() -> list[Exchange]:
    """Every primitive of the adapter against FakeGce; each request and its answer."""
    exchanges: list[Exchange] = []
    fake = FakeGce(stockout_zones={"us-central1-a"}, page_size=1)

    async def record(request: httpx.Request) -> httpx.Response:
        response = await fake.router.async_handler(request)
        exchanges.append(Exchange(request, response))
        return response

    def cloud(**overrides: Any) -> GceCloud:
        http = httpx.AsyncClient(transport=httpx.MockTransport(record))
        return GceCloud(fake.config(**overrides), tokens=StaticToken("tkn"), http=http)

    main = cloud(spot=True)
    n1_cloud = cloud(
        service_account_email="runner@gpuprov-test.iam.gserviceaccount.com",
        subnetwork="regions/us-central1/subnetworks/gpu",
        external_ip=False,
        spot_termination_action="STOP",
    )
    try:
        offers = await main.plan(ResourceRequest(gpu="H100", gpus_per_node=8))
        here = {(o.zone, o.spot): o for o in offers}
        family = "projects/deeplearning-platform-release/global/images/family/common-cu124"
        first = spec("train-a1-n0-abc123", image=family, ports=[8888, 6006, 6007])
        machine_image = "projects/gpuprov-test/global/machineImages/trainer"
        second = spec("train-a1-n1-abc123", image=machine_image)
        prepared = await main.prepare(here["us-central1-b", False], first)
        await main.prepare(here["us-central1-b", False], first)  # 409 alreadyExists (both)
        with pytest.raises(ProviderError) as stockout:
            await main.create(here["us-central1-a", False], prepared, first)
        assert stockout.value.kind is ErrorKind.CAPACITY
        ids = await main.create(here["us-central1-b", False], prepared, first)
        await main.create(here["us-central1-b", False], prepared, first)  # a retried create
        spot_ids = await main.create(here["us-central1-b", True], {}, second)
        n1_ids = await n1_cloud.create(n1_offer("us-central1-b"), {}, spec("train-a1-n2-abc123"))
        for _ in range(3):  # booting, then running with an address
            await main.observe(here["us-central1-b", False].location, first.vm)
            await main.observe(REGION, second.vm)
            await main.observe_region(REGION)
        await main.diagnose(here["us-central1-b", False].location, first.vm, ids[0])
        for vm, found in ((first.vm, ids), (second.vm, spot_ids), ("train-a1-n2-abc123", n1_ids)):
            await main.delete(REGION, vm, found)
            await main.delete(REGION, vm, found)  # already going: gone or a replay
        await main.observe_region(REGION)
        await main.observe_region(REGION)
        assert first.vm in await main.observe_side_resources(REGION)
        await main.cleanup(REGION, first.vm)
        await main.cleanup(REGION, first.vm)  # 404: gone
    finally:
        await main.aclose()
        await n1_cloud.aclose()
    return exchanges


@functools.cache
def exchanges() -> tuple[Exchange, ...]:
    return tuple(asyncio.run(drive()))


def check(exchange: Exchange) -> list[str]:
    """Problems with one request, and with its answer when it is a success."""
    discovery = discovery_for(str(exchange.request.url))
    checked = discovery.check_request(exchange.request)
    problems = list(checked.problems)
    if checked.method is not None and exchange.response.is_success:
        body = json.loads(exchange.response.content)
        problems += [
            f"answer: {p}" for p in discovery.check_body(checked.method, body, request=False)
        ]
    return problems


def methods_of(found: tuple[Exchange, ...]) -> set[str]:
    seen = set()
    for exchange in found:
        method, _, _ = discovery_for(str(exchange.request.url)).match(
            exchange.request.method, str(exchange.request.url)
        )
        if method is not None:
            seen.add(method.id)
    return seen


# ---------------------------------------------------------------- what the adapter sends


def test_every_request_and_answer_fits_the_discovery_documents():
    found = exchanges()
    problems = {f"{e.request.method} {e.request.url}": p for e in found if (p := check(e))}
    assert problems == {}
    assert methods_of(found) == EXPECTED_METHODS  # every primitive's calls were exercised


def test_the_scenarios_sent_the_bodies_and_options_worth_checking():
    """The drive covers the insert options (Spot, N1 GPUs, service account, no external IP)
    and the paginated listings, so the contract test above saw them."""
    inserts = [
        json.loads(e.request.content)
        for e in exchanges()
        if e.request.method == "POST" and e.request.url.path.endswith("/instances")
    ]
    assert any(body.get("guestAccelerators") for body in inserts)
    assert any(body.get("serviceAccounts") for body in inserts)
    assert any(body["scheduling"].get("provisioningModel") == "SPOT" for body in inserts)
    assert any("accessConfigs" not in body["networkInterfaces"][0] for body in inserts)
    assert any(body.get("sourceMachineImage") for body in inserts)  # a machine image...
    assert any(
        disk["initializeParams"]["sourceImage"].endswith("/family/common-cu124")
        for body in inserts
        for disk in body.get("disks", [])
    )  # ...and an image family
    rules = [
        json.loads(e.request.content)
        for e in exchanges()
        if e.request.method == "POST" and e.request.url.path.endswith("/firewalls")
    ]
    assert {rule["name"] for rule in rules} == {
        "gpuprov-train-a1-n0-abc123-ssh",
        "gpuprov-train-a1-n0-abc123-ports",
    }
    tokens = [e.request.url.params.get("pageToken") for e in exchanges()]
    assert any(tokens)  # a second page was asked for


async def test_the_default_endpoints_are_the_documented_ones():
    config = GceConfig(project="my-project-123")
    cloud = GceCloud(config, tokens=StaticToken("tkn"))
    try:
        real_compute = Discovery(document("compute.v1"))
        real_billing = Discovery(document("cloudbilling.v1"))
        listing = httpx.Request("GET", cloud.client.url("aggregated/instances"))
        assert real_compute.check_request(listing).method.id == "compute.instances.aggregatedList"
        skus = httpx.Request("GET", cloud.prices._url)
        assert real_billing.check_request(skus).method.id == "cloudbilling.services.skus.list"
    finally:
        await cloud.aclose()


# ---------------------------------------------------------------- the response fixtures

FIXTURES: list[tuple[str, str, Any]] = [
    ("compute.v1", "Instance", bodies.instance()),
    ("compute.v1", "Instance", bodies.instance("TERMINATED", nat_ip=None)),
    (
        "compute.v1",
        "Instance",
        bodies.instance(
            resourceStatus={
                "upcomingMaintenance": {
                    "type": "SCHEDULED",
                    "maintenanceStatus": "PENDING",
                    "windowStartTime": "2026-08-21T10:00:00.000-07:00",
                    "windowEndTime": "2026-08-21T14:00:00.000-07:00",
                    "canReschedule": True,
                }
            }
        ),
    ),
    ("compute.v1", "Operation", bodies.operation("PENDING")),
    ("compute.v1", "Operation", bodies.operation("DONE")),
    ("compute.v1", "Operation", bodies.STOCKOUT_OPERATION),
    ("compute.v1", "Operation", bodies.STOCKOUT_DETAILS_OPERATION),
    ("compute.v1", "Operation", bodies.GPUS_ALL_REGIONS_OPERATION),
    ("compute.v1", "Operation", bodies.REGION_QUOTA_OPERATION),
    ("compute.v1", "Operation", bodies.PREEMPTED_WHILE_CREATED),
    ("compute.v1", "Operation", bodies.RATE_OPERATION),
    ("compute.v1", "Operation", bodies.IMAGE_NOT_FOUND_OPERATION),
    ("compute.v1", "Operation", bodies.EXISTS_OPERATION),
    ("compute.v1", "Operation", bodies.operation("DONE", error={"errors": [STOCKOUT]})),
    ("compute.v1", "Operation", bodies.operation("DONE", error={"errors": [quota_error("X")]})),
    ("compute.v1", "MachineType", h100_machine("us-central1-a")),
    ("compute.v1", "MachineType", n1("us-central1-b")),
    ("compute.v1", "AcceleratorType", h100_accelerator("us-central1-a")),
    ("compute.v1", "AcceleratorType", t4("us-central1-b")),
    ("cloudbilling.v1", "Sku", gpu_sku("0A1B-2C3D-4E5F", ["us-central1"], 2.5, "Americas")),
    ("cloudbilling.v1", "Sku", gpu_sku("2A1B-2C3D-4E5F", ["us-central1"], 0.9, "Americas", True)),
]


@pytest.mark.parametrize(("doc", "schema", "body"), FIXTURES)
def test_response_fixtures_use_documented_properties(doc: str, schema: str, body: Any):
    discovery = compute() if doc == "compute.v1" else billing()
    assert discovery.check_schema(schema, body) == []


# ---------------------------------------------------------------- negative controls


def sent(method_id: str) -> httpx.Request:
    """The first request the adapter sent to `method_id`."""
    for exchange in exchanges():
        url = str(exchange.request.url)
        method, _, _ = discovery_for(url).match(exchange.request.method, url)
        if method is not None and method.id == method_id:
            return exchange.request
    raise AssertionError(f"no {method_id} request")


def rebuilt(request: httpx.Request, url: str | None = None, **body_changes: Any):
    """`request` again, at `url` and/or with its JSON body changed by `body_changes`
    (a callable taking the body)."""
    content = request.content
    if "body" in body_changes:
        body = json.loads(content)
        body_changes["body"](body)
        content = json.dumps(body).encode()
    return httpx.Request(request.method, url or str(request.url), content=content)


def problems_of(request: httpx.Request) -> list[str]:
    return compute().check_request(request).problems


def test_the_validator_rejects_a_misspelled_body_field():
    insert = sent("compute.instances.insert")
    assert problems_of(insert) == []

    def top(body):
        body["machineTyp"] = body.pop("machineType")

    def nested(body):
        body["disks"][0]["initializeParams"]["diskSizeGB"] = "200"

    def inside_a_list(body):
        body["metadata"]["items"][0]["val"] = "x"

    for change, field in ((top, "machineTyp"), (nested, "diskSizeGB"), (inside_a_list, "val")):
        found = problems_of(rebuilt(insert, body=change))
        assert any(field in p and "no such property" in p for p in found), found


def test_the_validator_rejects_wrong_types_enums_output_fields_and_missing_names():
    insert = sent("compute.instances.insert")
    changes = {
        "automaticRestart": lambda b: b["scheduling"].update(automaticRestart="true"),
        "diskSizeGb": lambda b: b["disks"][0]["initializeParams"].update(diskSizeGb="2O0"),
        "labels.team": lambda b: b["labels"].update(team=7),
        "onHostMaintenance": lambda b: b["scheduling"].update(onHostMaintenance="STOP"),
        "status": lambda b: b.update(status="RUNNING"),  # output only
        "Instance.name": lambda b: b.pop("name"),  # required by compute.instances.insert
        "tags.items[0]": lambda b: b["tags"].update(items=["Not A Tag"]),
    }
    for where, change in changes.items():
        found = problems_of(rebuilt(insert, body=change))
        assert any(where in p for p in found), (where, found)
    # int64 as a number is what Google accepts too; a 32-bit count as a string also is
    as_number = rebuilt(
        insert, body=lambda b: b["disks"][0]["initializeParams"].update(diskSizeGb=200)
    )
    assert problems_of(as_number) == []


def test_the_validator_rejects_an_unknown_or_mistyped_query_parameter():
    listing = sent("compute.instances.aggregatedList")
    assert problems_of(listing) == []
    partial = listing.url.copy_add_param("returnPartialSuccess", "true")
    assert any("returnPartialSuccess" in p for p in problems_of(rebuilt(listing, str(partial))))
    wrong = listing.url.copy_set_param("maxResults", "lots")
    assert any("maxResults" in p for p in problems_of(rebuilt(listing, str(wrong))))
    twice = str(listing.url) + "&filter=x"
    assert any("repeated" in p for p in problems_of(rebuilt(listing, twice)))
    wait = sent("compute.zoneOperations.wait")
    with_id = wait.url.copy_add_param("requestId", "abc")  # wait takes no requestId
    assert any("requestId" in p for p in problems_of(rebuilt(wait, str(with_id))))


def test_the_validator_rejects_a_wrong_path_method_or_empty_parameter():
    insert = sent("compute.instances.insert")
    url = str(insert.url)
    singular = url.replace("/instances?", "/instance?")
    assert any("no method" in p for p in problems_of(rebuilt(insert, singular)))
    put = httpx.Request("PUT", url, content=insert.content)
    assert any("no method" in p for p in problems_of(put))
    no_zone = re.sub(r"/zones/[^/]+/", "/zones//", url)
    assert any("no method" in p for p in problems_of(rebuilt(insert, no_zone)))
    bad_zone = re.sub(r"/zones/[^/]+/", "/zones/None/", url)
    assert any(
        "zone" in p and "does not match" in p for p in problems_of(rebuilt(insert, bad_zone))
    )
    get = httpx.Request("GET", url.split("?")[0] + "/gpuprov-x", content=b'{"name": "x"}')
    assert any("declares none" in p for p in problems_of(get))


def test_the_validator_rejects_an_undocumented_answer_property():
    method = compute().method("compute.instances.get")
    assert compute().check_body(method, bodies.instance(), request=False) == []
    odd = bodies.instance(networkInterfaces=[{"networkIP": "10.0.0.1", "publicIp": "1.2.3.4"}])
    found = compute().check_body(method, odd, request=False)
    assert any("publicIp" in p for p in found), found


# ---------------------------------------------------------------- what the contract changed


async def test_a_zone_the_listing_could_not_reach_is_no_answer():
    """Without returnPartialSuccess (not in the document), a scope Google could not reach is
    warned UNREACHABLE: in the region it makes observe_region Transient, elsewhere not."""
    warned = {"items": {"zones/us-central1-f": {"warning": {"code": "UNREACHABLE"}}}}
    elsewhere = {"items": {"zones/asia-east1-a": {"warning": {"code": "UNREACHABLE"}}}}
    answers = [warned, elsewhere]
    assert compute().check_schema("InstanceAggregatedList", warned) == []

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answers.pop(0))

    config = FakeGce().config()
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    cloud = GceCloud(config, tokens=StaticToken("tkn"), http=http)
    try:
        with pytest.raises(ProviderError) as caught:
            await cloud.observe_region(REGION)
        assert caught.value.kind is ErrorKind.TRANSIENT and "us-central1-f" in caught.value.message
        assert await cloud.observe_region(REGION) == {}
    finally:
        await cloud.aclose()
