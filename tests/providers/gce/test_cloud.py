"""Every HTTP primitive of the gce adapter over respx: request shapes, operation polling,
error paths, pagination, idempotency (requestId), and what stays secret."""

from __future__ import annotations

import email
import json
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from providers import agent_artifact, node_agent
from providers.base import InstanceSpec, InstanceStatus, Location, NodeBootstrap, Offer
from providers.errors import BlockScope, ErrorKind, ProviderError
from providers.gce.auth import StaticToken
from providers.gce.cloud import GceCloud
from providers.gce.identity import request_id
from tests import cloudinit
from tests.providers.gce import bodies
from tests.providers.gce.fake_gce import BASE_URL, FakeGce

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

P = f"{BASE_URL}/projects/{bodies.PROJECT}"
ZONE = bodies.ZONE
VM = bodies.VM
NAME = bodies.NAME
INSERT = f"{P}/zones/{ZONE}/instances"
WAIT = f"{P}/zones/{ZONE}/operations/{bodies.operation('x')['name']}/wait"
HERE = Location(provider="gce", region="us-central1", zone=ZONE)
REGION = Location(provider="gce", region="us-central1")
TOKEN = "join-token-must-stay-secret"


def offer(zone: str = ZONE, spot: bool = False, accelerator: str | None = None) -> Offer:
    detail = {"machine_type": "a3-highgpu-8g", "spot": spot}
    if accelerator:
        detail |= {"machine_type": "n1-standard-8", "accelerator_type": accelerator}
        detail["accelerator_count"] = 2
    return Offer(
        id=f"gce/{zone}/a3-highgpu-8g" + ("/spot" if spot else ""),
        provider="gce",
        region="us-central1",
        zone=zone,
        instance_type="a3-highgpu-8g",
        spot=spot,
        detail=detail,
    )


def spec(**extra) -> InstanceSpec:
    return InstanceSpec(vm=VM, job="train", node_index=0, attempt=1, **extra)


def query(request: httpx.Request) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(str(request.url)).query).items()}


def sequence(*responses: httpx.Response):
    """A side effect answering the given responses in order (the last one repeats)."""
    left = list(responses)
    return lambda request: left.pop(0) if len(left) > 1 else left[0]


def ok(body: object) -> httpx.Response:
    return httpx.Response(200, json=body)


def err(status: int, body: object, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


# ---------------------------------------------------------------- create


async def test_create_polls_the_operation_until_done_and_returns_zone_and_name(api, cloud):
    insert = api.post(url__startswith=INSERT).mock(return_value=ok(bodies.operation("PENDING")))
    wait = api.post(WAIT).mock(
        side_effect=sequence(ok(bodies.operation("RUNNING")), ok(bodies.operation("DONE")))
    )
    ids = await cloud.create(offer(), {"network_tag": "gpuprov-tag"}, spec())
    assert ids == [f"{ZONE}/{NAME}"]
    assert wait.call_count == 2
    request = insert.calls.last.request
    assert request.headers["authorization"] == "Bearer tkn"
    assert query(request)["requestId"] == request_id(bodies.PROJECT, ZONE, NAME, "insert")
    body = json.loads(request.content)
    assert body["name"] == NAME
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/a3-highgpu-8g"
    assert body["labels"]["gpuprov_vm"] == VM
    assert body["tags"] == {"items": ["gpuprov-tag"]}
    assert body["scheduling"] == {"onHostMaintenance": "TERMINATE", "automaticRestart": True}
    assert "guestAccelerators" not in body  # A3 brings its GPUs
    assert body["disks"][0]["initializeParams"]["diskSizeGb"] == "200"
    assert body["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"


async def test_stockout_in_the_done_operation_is_capacity(api, cloud):
    api.post(url__startswith=INSERT).mock(return_value=ok(bodies.operation("PENDING")))
    api.post(WAIT).mock(
        side_effect=sequence(ok(bodies.operation("RUNNING")), ok(bodies.STOCKOUT_DETAILS_OPERATION))
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer(), {}, spec())
    assert caught.value.kind is ErrorKind.CAPACITY
    assert "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" in caught.value.message


async def test_gpus_all_regions_quota_blocks_the_provider(api, cloud):
    api.post(url__startswith=INSERT).mock(return_value=ok(bodies.operation("PENDING")))
    api.post(WAIT).mock(return_value=ok(bodies.GPUS_ALL_REGIONS_OPERATION))
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer(), {}, spec())
    assert (caught.value.kind, caught.value.block_scope) == (ErrorKind.QUOTA, BlockScope.PROVIDER)


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (403, bodies.QUOTA_403, ErrorKind.QUOTA),
        (403, bodies.RATE_LIMITED, ErrorKind.TRANSIENT),
        (403, bodies.FORBIDDEN, ErrorKind.CREDENTIALS),
        (401, bodies.UNAUTHENTICATED, ErrorKind.CREDENTIALS),
        (404, bodies.NOT_FOUND_MACHINE_TYPE, ErrorKind.INVALID_REQUEST),
        (400, bodies.INVALID, ErrorKind.INVALID_REQUEST),
        (503, bodies.BACKEND_ERROR, ErrorKind.TRANSIENT),
    ],
)
async def test_insert_http_errors_are_classified(api, cloud, status, body, kind):
    api.post(url__startswith=INSERT).mock(return_value=err(status, body))
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer(), {}, spec())
    assert caught.value.kind is kind


async def test_429_carries_retry_after(api, cloud):
    api.post(url__startswith=INSERT).mock(
        return_value=err(429, bodies.TOO_MANY, **{"Retry-After": "3"})
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer(), {}, spec())
    assert (caught.value.kind, caught.value.retry_after) == (ErrorKind.TRANSIENT, 3.0)


async def test_already_exists_adopts_the_instance_an_earlier_attempt_made(api, cloud):
    insert = api.post(url__startswith=INSERT).mock(return_value=err(409, bodies.ALREADY_EXISTS))
    assert await cloud.create(offer(), {}, spec()) == [f"{ZONE}/{NAME}"]
    # the id is derived from the VM, so only the call shows the 409 was met (and not retried)
    assert insert.call_count == 1 and len(api.calls) == 1


async def test_a_retried_create_repeats_its_request_id_and_makes_one_instance():
    fake = FakeGce(zones=(ZONE,))
    cloud = fake.cloud()
    first = await cloud.create(offer(), {}, spec())
    again = await cloud.create(offer(), {}, spec())  # e.g. the response was lost
    assert first == again and len(fake.inserts) == 1
    await cloud.aclose()


async def test_a_replayed_transient_failure_moves_to_the_next_request_id(api, cloud):
    """The first insert under id0 failed with a retryable error; a retry sending id0 again would
    get that old failure back forever, so the adapter follows with the next id of the chain."""
    seen: list[str] = []

    def insert(request: httpx.Request) -> httpx.Response:
        seen.append(query(request)["requestId"])
        if len(seen) == 1:
            return ok(bodies.RATE_OPERATION)  # replay: DONE with a retryable error
        return ok(bodies.operation("PENDING", name="operation-2"))

    api.post(url__startswith=INSERT).mock(side_effect=insert)
    api.post(f"{P}/zones/{ZONE}/operations/operation-2/wait").mock(
        return_value=ok(bodies.operation("DONE", name="operation-2"))
    )
    assert await cloud.create(offer(), {}, spec()) == [f"{ZONE}/{NAME}"]
    name = bodies.RATE_OPERATION["name"]
    assert seen == [
        request_id(bodies.PROJECT, ZONE, NAME, "insert"),
        request_id(bodies.PROJECT, ZONE, NAME, "insert", after=name),
    ]


async def test_an_operation_still_running_at_the_bound_is_left_to_observe(api, cloud):
    cloud.config = cloud.config.model_copy(update={"operation_timeout": 0.05})
    insert = api.post(url__startswith=INSERT).mock(return_value=ok(bodies.operation("PENDING")))
    wait = api.post(WAIT).mock(return_value=ok(bodies.operation("RUNNING")))
    assert await cloud.create(offer(), {}, spec()) == [f"{ZONE}/{NAME}"]
    # inserted once, then waited on (still RUNNING) until the bound, not skipped
    assert insert.call_count == 1 and wait.called


async def test_a_failed_wait_call_is_asked_again(api, cloud):
    api.post(url__startswith=INSERT).mock(return_value=ok(bodies.operation("PENDING")))
    wait = api.post(WAIT).mock(
        side_effect=sequence(err(503, bodies.BACKEND_ERROR), ok(bodies.STOCKOUT_OPERATION))
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer(), {}, spec())
    assert caught.value.kind is ErrorKind.CAPACITY and wait.call_count == 2


async def test_network_failure_on_insert_is_transient(api, cloud):
    api.post(url__startswith=INSERT).mock(side_effect=httpx.ConnectError("reset"))
    with pytest.raises(ProviderError) as caught:
        await cloud.create(offer(), {}, spec())
    assert caught.value.kind is ErrorKind.TRANSIENT


async def test_create_delivers_keys_user_data_and_bootstrap_in_the_metadata(api, cloud):
    # An echoed token is scrubbed by the core: tests/providers/gce/test_redaction.py.
    insert = api.post(url__startswith=INSERT).mock(return_value=ok(bodies.operation("DONE")))
    boot = NodeBootstrap(api_url="https://gpuprov.example", join_token=TOKEN)
    node = spec(ssh_public_key="ssh-ed25519 AAAAC3 me", user_data="#cloud-config\n", bootstrap=boot)
    await cloud.create(offer(), {}, node)
    items = {
        i["key"]: i["value"]
        for i in json.loads(insert.calls.last.request.content)["metadata"]["items"]
    }
    assert items["ssh-keys"] == "gpuprov:ssh-ed25519 AAAAC3 me"
    assert items["gpuprov-vm"] == VM
    document = items["user-data"]  # MIME multi-part: the spec's cloud-config, then the bootstrap's
    parts = [p for p in email.message_from_string(document).walk() if not p.is_multipart()]
    texts = [p.get_payload(decode=True).decode() for p in parts]
    assert [p.get_content_subtype() for p in parts] == ["cloud-config", "cloud-config"]
    assert TOKEN in texts[1] and "/etc/gpuprov/join.env" in texts[1]
    assert "--notices gce" in texts[1]  # the agent watches the metadata's preemption flag
    assert texts[0] == "#cloud-config\n"
    assert set(items) == {"gpuprov-vm", "ssh-keys", "user-data"}  # the token in one place only
    # What cloud-init makes of it: the agent, pinned, and the unit that starts it.
    read = cloudinit.processed(document)
    files = {entry["path"]: entry for entry in read.config["write_files"]}
    assert {node_agent.FETCH_PATH, node_agent.UNIT_PATH, node_agent.JOIN_ENV_PATH} <= set(files)
    assert agent_artifact.sha256() in files[node_agent.UNIT_PATH]["content"]
    assert cloudinit.schema_errors(read.config) == ""


async def test_spot_and_n1_bodies(api, cloud):
    insert = api.post(url__startswith=INSERT).mock(return_value=ok(bodies.operation("DONE")))
    await cloud.create(offer(spot=True, accelerator="nvidia-tesla-t4"), {}, spec())
    body = json.loads(insert.calls.last.request.content)
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert body["guestAccelerators"] == [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 2}
    ]


async def test_an_offer_from_elsewhere_is_an_invalid_request(cloud):
    foreign = offer().model_copy(update={"provider": "aws"})
    with pytest.raises(ProviderError) as caught:
        await cloud.create(foreign, {}, spec())
    assert caught.value.kind is ErrorKind.INVALID_REQUEST


# ---------------------------------------------------------------- observe


async def test_observe_lists_the_zone_by_label_across_pages(api, cloud):
    pages = {
        None: {"items": [bodies.instance("STAGING")], "nextPageToken": "p2"},
        "p2": {"items": [bodies.instance(name="gpuprov-other", labels={"gpuprov_vm": "other"})]},
    }
    listing = api.get(url__startswith=f"{P}/zones/{ZONE}/instances").mock(
        side_effect=lambda request: ok(pages[query(request).get("pageToken")])
    )
    found = await cloud.observe(HERE, VM)
    assert [(o.id, o.status) for o in found] == [(f"{ZONE}/{NAME}", InstanceStatus.PENDING)]
    assert listing.call_count == 2
    assert query(listing.calls[0].request)["filter"] == f'labels.gpuprov_vm = "{VM}"'


async def test_observe_without_a_zone_uses_the_aggregated_list_of_the_region(api, cloud):
    items = {
        f"zones/{ZONE}": {"instances": [bodies.instance()]},
        "zones/europe-west4-a": {
            "instances": [bodies.instance(zone=f"{bodies.LINK}/zones/europe-west4-a")]
        },
        "zones/us-east4-c": {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "none"}},
    }
    api.get(url__startswith=f"{P}/aggregated/instances").mock(return_value=ok({"items": items}))
    found = await cloud.observe(REGION, VM)
    assert [o.id for o in found] == [f"{ZONE}/{NAME}"]


async def test_observe_region_groups_every_gpuprov_instance_by_vm_across_pages(api, cloud):
    other = bodies.instance(name="gpuprov-b", labels={"gpuprov_vm": "b"}, metadata=None)
    pages = {
        None: {
            "items": {f"zones/{ZONE}": {"instances": [bodies.instance()]}},
            "nextPageToken": "t",
        },
        "t": {"items": {"zones/us-central1-b": {"instances": [other]}}},
    }
    listing = api.get(url__startswith=f"{P}/aggregated/instances").mock(
        side_effect=lambda request: ok(pages[query(request).get("pageToken")])
    )
    found = await cloud.observe_region(REGION)
    assert sorted(found) == ["b", VM]
    assert query(listing.calls[0].request)["filter"] == "labels.gpuprov_vm:*"
    assert listing.call_count == 2


async def test_a_partial_listing_missing_a_zone_of_the_region_is_no_answer(api, cloud):
    """an aggregated list may leave a zone out; an instance there must not look gone."""
    body = {"items": {}, "unreachables": ["zones/us-central1-f"]}
    api.get(url__startswith=f"{P}/aggregated/instances").mock(return_value=ok(body))
    with pytest.raises(ProviderError) as caught:
        await cloud.observe_region(REGION)
    assert caught.value.kind is ErrorKind.TRANSIENT and "us-central1-f" in caught.value.message
    elsewhere = {"items": {}, "unreachables": ["zones/asia-east1-a"]}
    api.get(url__startswith=f"{P}/aggregated/instances").mock(return_value=ok(elsewhere))
    assert await cloud.observe_region(REGION) == {}


async def test_observe_read_errors_are_classified(api, cloud):
    api.get(url__startswith=f"{P}/zones/{ZONE}/instances").mock(
        return_value=err(403, bodies.FORBIDDEN)
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.observe(HERE, VM)
    assert caught.value.kind is ErrorKind.CREDENTIALS


# ---------------------------------------------------------------- delete, prepare, cleanup


async def test_delete_sends_a_request_id_and_gone_is_success(api, cloud):
    route = api.delete(url__startswith=f"{INSERT}/{NAME}").mock(
        side_effect=sequence(ok(bodies.operation("PENDING")), err(404, bodies.NOT_FOUND_INSTANCE))
    )
    await cloud.delete(HERE, VM, [f"{ZONE}/{NAME}"])
    await cloud.delete(HERE, VM, [f"{ZONE}/{NAME}"])
    assert route.call_count == 2
    assert query(route.calls[0].request)["requestId"] == request_id(
        bodies.PROJECT, ZONE, NAME, "delete"
    )


async def test_delete_never_touches_ids_that_are_not_this_vms(api, cloud):
    route = api.delete(url__startswith=INSERT).mock(return_value=ok(bodies.operation("PENDING")))
    await cloud.delete(HERE, VM, ["i-123", f"{ZONE}/users-own-vm", "nonsense/../x"])
    assert route.call_count == 0


async def test_delete_errors_other_than_gone_are_raised(api, cloud):
    api.delete(url__startswith=f"{INSERT}/{NAME}").mock(return_value=err(403, bodies.RATE_LIMITED))
    with pytest.raises(ProviderError) as caught:
        await cloud.delete(HERE, VM, [f"{ZONE}/{NAME}"])
    assert caught.value.kind is ErrorKind.TRANSIENT


async def test_prepare_makes_a_firewall_rule_for_the_network_tag_and_409_is_done(api, cloud):
    route = api.post(url__startswith=f"{P}/global/firewalls").mock(
        side_effect=sequence(ok(bodies.operation("DONE")), err(409, bodies.ALREADY_EXISTS))
    )
    first = await cloud.prepare(offer(), spec())
    second = await cloud.prepare(offer(), spec())
    assert first == second == {"firewall": f"{NAME}-ssh", "network_tag": NAME}
    body = json.loads(route.calls[0].request.content)
    assert body["targetTags"] == [NAME] and body["sourceRanges"] == ["0.0.0.0/0"]
    assert body["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert body["direction"] == "INGRESS" and body["network"] == "global/networks/default"
    assert "requestId" in query(route.calls[0].request)


async def test_prepare_errors_are_classified(api, cloud):
    api.post(url__startswith=f"{P}/global/firewalls").mock(return_value=err(403, bodies.QUOTA_403))
    with pytest.raises(ProviderError) as caught:
        await cloud.prepare(offer(), spec())
    assert caught.value.kind is ErrorKind.QUOTA


async def test_cleanup_deletes_only_this_vms_rules_and_gone_is_success(api, cloud):
    ssh = api.delete(f"{P}/global/firewalls/{NAME}-ssh").mock(
        side_effect=sequence(ok(bodies.operation("PENDING")), err(404, bodies.NOT_FOUND_INSTANCE))
    )
    ports = api.delete(f"{P}/global/firewalls/{NAME}-ports").mock(
        side_effect=sequence(ok(bodies.operation("DONE")), err(404, bodies.NOT_FOUND_INSTANCE))
    )
    await cloud.cleanup(HERE, VM)
    await cloud.cleanup(HERE, VM)
    assert ssh.call_count == 2 and ports.call_count == 2


async def test_cleanup_without_a_ports_rule_finds_it_gone(api, cloud):
    api.delete(f"{P}/global/firewalls/{NAME}-ssh").mock(return_value=ok(bodies.operation("DONE")))
    api.delete(f"{P}/global/firewalls/{NAME}-ports").mock(
        return_value=err(404, bodies.NOT_FOUND_INSTANCE)
    )
    await cloud.cleanup(HERE, VM)  # the job asked for no ports: nothing to remove, no error


async def test_prepare_opens_the_jobs_ports_in_a_rule_of_their_own(api, cloud):
    route = api.post(url__startswith=f"{P}/global/firewalls").mock(
        return_value=ok(bodies.operation("DONE"))
    )
    prepared = await cloud.prepare(offer(), spec(ports=[6007, 8888, 6006, 22]))
    assert prepared == {
        "firewall": f"{NAME}-ssh",
        "network_tag": NAME,
        "ports_firewall": f"{NAME}-ports",
    }
    ssh, ports = (json.loads(call.request.content) for call in route.calls)
    assert ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert ports["name"] == f"{NAME}-ports" and ports["targetTags"] == [NAME]
    # 22 stays SSH's (ssh_source_ranges); the rest as ranges, from ports_source_ranges
    assert ports["allowed"] == [{"IPProtocol": "tcp", "ports": ["6006-6007", "8888"]}]
    assert ports["sourceRanges"] == ["0.0.0.0/0"] and ports["direction"] == "INGRESS"
    requests = {query(call.request)["requestId"] for call in route.calls}
    assert len(requests) == 2  # each rule its own request id


async def test_ports_source_ranges_narrow_who_reaches_the_jobs_ports(api):
    route = api.post(url__startswith=f"{P}/global/firewalls").mock(
        return_value=ok(bodies.operation("DONE"))
    )
    config = FakeGce().config(project=bodies.PROJECT, ports_source_ranges=["203.0.113.0/24"])
    transport = httpx.MockTransport(api.async_handler)
    narrowed = GceCloud(
        config, tokens=StaticToken("t"), http=httpx.AsyncClient(transport=transport)
    )
    try:
        await narrowed.prepare(offer(), spec(ports=[8080]))
    finally:
        await narrowed.aclose()
    ports = json.loads(route.calls.last.request.content)
    assert ports["sourceRanges"] == ["203.0.113.0/24"]


@pytest.mark.parametrize(
    ("image", "source_image"),
    [
        (
            "projects/deeplearning-platform-release/global/images/family/common-cu124",
            "projects/deeplearning-platform-release/global/images/family/common-cu124",
        ),
        (
            "https://www.googleapis.com/compute/v1/projects/p/global/images/img-1",
            "https://www.googleapis.com/compute/v1/projects/p/global/images/img-1",
        ),
        ("global/images/family/mine", "global/images/family/mine"),
        ("my-trainer-image", "global/images/my-trainer-image"),  # the project's own, by name
    ],
)
async def test_the_jobs_image_is_the_boot_disks_source(api, cloud, image, source_image):
    insert = api.post(url__startswith=INSERT).mock(return_value=ok(bodies.operation("DONE")))
    await cloud.create(offer(), {}, spec(image=image))
    body = json.loads(insert.calls.last.request.content)
    (disk,) = body["disks"]
    assert disk["initializeParams"]["sourceImage"] == source_image
    assert "sourceMachineImage" not in body


async def test_without_an_image_the_configured_one_boots(api, cloud):
    insert = api.post(url__startswith=INSERT).mock(return_value=ok(bodies.operation("DONE")))
    await cloud.create(offer(), {}, spec())
    (disk,) = json.loads(insert.calls.last.request.content)["disks"]
    assert disk["initializeParams"]["sourceImage"] == cloud.config.image


async def test_a_machine_image_is_the_source_of_the_whole_vm(api, cloud):
    insert = api.post(url__startswith=INSERT).mock(return_value=ok(bodies.operation("DONE")))
    image = "projects/gpuprov-test/global/machineImages/trainer"
    await cloud.create(offer(), {}, spec(image=image))
    body = json.loads(insert.calls.last.request.content)
    assert body["sourceMachineImage"] == image
    assert "disks" not in body  # the machine image's own disks
    assert body["machineType"].endswith("/a3-highgpu-8g") and body["tags"]["items"] == [NAME]


def test_gce_declares_neither_image_nor_ports_unsupported(cloud):
    assert not {"image", "ports"} & set(cloud.capabilities().unsupported)


# ---------------------------------------------------------------- diagnose


async def test_diagnose_reports_upcoming_maintenance_and_preemption_events(api, cloud):
    maintenance = {
        "upcomingMaintenance": {
            "type": "SCHEDULED",
            "maintenanceStatus": "PENDING",
            "windowStartTime": "2026-08-21T02:00:00Z",
            "canReschedule": True,
        }
    }
    api.get(url__startswith=f"{P}/zones/{ZONE}/instances?").mock(
        return_value=ok({"items": [bodies.instance()]})
    )
    api.get(f"{INSERT}/{NAME}").mock(return_value=ok(bodies.instance(resourceStatus=maintenance)))
    link = bodies.instance()["selfLink"]
    events = [
        bodies.operation(
            "DONE",
            name="systemevent-1",
            operationType="compute.instances.preempted",
            insertTime="2026-08-20T11:00:00.000-07:00",
        ),
        bodies.operation(
            "DONE",
            name="systemevent-2",
            operationType="compute.instances.hostError",
            insertTime="2026-08-20T12:00:00.000-07:00",
        ),
        bodies.operation("DONE", name="op-3", operationType="insert"),
    ]
    ops = api.get(url__startswith=f"{P}/zones/{ZONE}/operations").mock(
        return_value=ok({"items": events})
    )
    diagnosis = await cloud.diagnose(HERE, VM)
    codes = [f.code for f in diagnosis.findings]
    assert codes == ["maintenance_scheduled", "host_error", "preempted"]
    assert diagnosis.verdict.value == "unhealthy"
    assert query(ops.calls.last.request)["filter"] == f'targetLink = "{link}"'


async def test_diagnose_explains_a_vanished_spot_vm(api, cloud):
    api.get(url__startswith=f"{P}/zones/{ZONE}/instances?").mock(return_value=ok({}))
    preempted = bodies.operation(
        "DONE", name="systemevent-1", operationType="compute.instances.preempted"
    )
    api.get(url__startswith=f"{P}/zones/{ZONE}/operations").mock(
        return_value=ok({"items": [preempted]})
    )
    diagnosis = await cloud.diagnose(HERE, VM)
    assert diagnosis.instance is None and [f.code for f in diagnosis.findings] == ["preempted"]


# ---------------------------------------------------------------- plumbing


def test_capabilities_and_sweep_regions_come_from_config(cloud):
    hints = cloud.capabilities()
    assert (hints.boot_timeout, hints.delete_timeout, hints.poll_interval) == (10, 10, 0.05)
    assert hints.node_agent is True and hints.cloud_init is True  # the agent is in the user data
    # Compute Engine: a one-minute minimum, then per second.
    assert (hints.billing.granularity_seconds, hints.billing.minimum_seconds) == (1, 60)
    assert cloud.sweep_regions() == ["us-central1", "europe-west4"]


async def test_a_token_that_cannot_be_refreshed_is_a_credentials_error(api):
    from google.auth import exceptions

    class Expired:
        async def token(self) -> str:
            raise exceptions.RefreshError("invalid_grant: account deleted")

        async def aclose(self) -> None:
            return None

    config = FakeGce().config()
    cloud = GceCloud(
        config,
        tokens=Expired(),
        http=httpx.AsyncClient(transport=httpx.MockTransport(api.async_handler)),
    )
    with pytest.raises(ProviderError) as caught:
        await cloud.observe(HERE, VM)
    assert caught.value.kind is ErrorKind.CREDENTIALS
    await cloud.aclose()
