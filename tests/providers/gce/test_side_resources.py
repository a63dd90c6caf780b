"""observe_side_resources on GCE over respx: the per-VM firewall rules, listed by name prefix
from Compute Engine's documented `compute#firewallList` answers."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from providers.base import InstanceSpec, Location, ResourceRequest
from providers.errors import ErrorKind, ProviderError
from providers.gce.identity import firewall_name, ports_firewall_name
from tests.providers.gce import bodies
from tests.providers.gce.fake_gce import BASE_URL, FakeGce

P = f"{BASE_URL}/projects/{bodies.PROJECT}"
LINK = f"https://www.googleapis.com/compute/v1/projects/{bodies.PROJECT}"
LIST = f"{P}/global/firewalls"
REGION = Location(provider="gce", region="us-central1")
LONG_VM = "a-job-name-long-enough-that-gce-must-shorten-it-a1-n0-c0ffee"


def firewall(name: str, description: str, ports: list[str] | None = None) -> dict[str, Any]:
    """One `compute#firewall` as the list method returns it."""
    return {
        "kind": "compute#firewall",
        "id": "4539216112035846211",
        "creationTimestamp": "2026-11-30T01:14:07.113-08:00",
        "name": name,
        "description": description,
        "network": f"{LINK}/global/networks/default",
        "priority": 1000,
        "sourceRanges": ["0.0.0.0/0"],
        "targetTags": [name.rsplit("-", 1)[0]],
        "allowed": [{"IPProtocol": "tcp", "ports": ports or ["22"]}],
        "direction": "INGRESS",
        "logConfig": {"enable": False},
        "disabled": False,
        "selfLink": f"{LINK}/global/firewalls/{name}",
    }


def page(items: list[dict[str, Any]], next_token: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {
        "kind": "compute#firewallList",
        "id": f"projects/{bodies.PROJECT}/global/firewalls",
        "items": items,
        "selfLink": f"{LINK}/global/firewalls",
    }
    if next_token:
        body["nextPageToken"] = next_token
    return httpx.Response(200, json=body)


async def test_each_vms_own_rules_are_listed_across_pages(api, cloud):
    """Both rules of one VM on two pages, a shortened one mapped back by its description, and
    rules that only start with our prefix (a user's, or one with an unrelated name) left out."""
    long_ssh = firewall_name(LONG_VM)
    assert long_ssh != f"gpuprov-{LONG_VM}-ssh"  # shortened, with a digest
    route = api.get(url__startswith=LIST).mock(
        side_effect=[
            page(
                [
                    firewall(f"{bodies.NAME}-ssh", f"gpuprov: SSH to {bodies.VM}"),
                    firewall("gpuprov-shared-bastion", "the team's bastion"),
                    firewall(long_ssh, f"gpuprov: SSH to {LONG_VM}"),
                ],
                next_token="page-2",
            ),
            page(
                [
                    firewall(
                        f"{bodies.NAME}-ports",
                        f"gpuprov: the job's ports on {bodies.VM}",
                        ["8000-8010"],
                    ),
                    firewall("gpuprov-other-ssh", "gpuprov: SSH to somebody-else"),
                ]
            ),
        ]
    )

    listed = await cloud.observe_side_resources(REGION)

    assert listed == {
        bodies.VM: [f"firewall {bodies.NAME}-ssh", f"firewall {bodies.NAME}-ports"],
        LONG_VM: [f"firewall {long_ssh}"],
        # "gpuprov-other-ssh" is the own rule of VM "other" by its name alone
        "other": ["firewall gpuprov-other-ssh"],
    }
    first, second = (urlsplit(str(call.request.url)) for call in route.calls)
    for url in (first, second):
        assert url.path == urlsplit(LIST).path
        assert parse_qs(url.query)["filter"] == ['name eq "gpuprov-.*"']
    assert "pageToken" not in parse_qs(first.query)
    assert parse_qs(second.query)["pageToken"] == ["page-2"]


async def test_an_empty_project_lists_nothing(api, cloud):
    api.get(url__startswith=LIST).mock(
        return_value=httpx.Response(200, json={"kind": "compute#firewallList", "id": "x"})
    )
    assert await cloud.observe_side_resources(REGION) == {}


async def test_a_malformed_list_is_a_classified_error(api, cloud):
    api.get(url__startswith=LIST).mock(
        return_value=httpx.Response(200, json={"items": [{"description": "no name"}]})
    )
    with pytest.raises(ProviderError) as raised:
        await cloud.observe_side_resources(REGION)
    # Classified as every unreadable GCE answer is (errors.py `malformed`), naming the field.
    assert raised.value.kind is ErrorKind.TRANSIENT
    assert "list firewalls: unreadable response: FirewallList: items.0.name" in str(raised.value)


async def test_what_prepare_made_is_listed_until_cleanup_removes_it():
    """Against FakeGce: prepare's two rules (SSH and the job's ports) are listed under the VM,
    cleanup removes them, and the listing is then empty."""
    fake = FakeGce()
    cloud = fake.cloud()
    spec = InstanceSpec(vm=bodies.VM, job="train", node_index=0, attempt=1, ports=[8080])
    try:
        offer = (await cloud.plan(ResourceRequest(gpu="H100", gpus_per_node=8)))[0]
        await cloud.prepare(offer, spec)
        assert await cloud.observe_side_resources(REGION) == {
            bodies.VM: [
                f"firewall {ports_firewall_name(bodies.VM)}",
                f"firewall {firewall_name(bodies.VM)}",
            ]
        }
        await cloud.cleanup(REGION, bodies.VM)
        assert await cloud.observe_side_resources(REGION) == {}
    finally:
        await cloud.aclose()
