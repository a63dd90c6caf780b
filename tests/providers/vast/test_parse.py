"""Reading Vast listings and instances (pure): offers, prices, regions, states, SSH."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from providers.base import InstanceStatus, SshEndpoint
from providers.vast import parse
from tests.providers.vast import fixtures

NOW = datetime(2026, 8, 1, tzinfo=UTC)


def offer(listing, disk_gb: float = 50.0):
    return parse.offer_from_listing(
        listing, disk_gb=disk_gb, image="img", runtype="ssh_direct", observed_at=NOW
    )


def test_the_documented_listing_becomes_an_offer_with_its_price_and_shape():
    made = offer(fixtures.listing(12345678))
    assert made is not None
    assert made.id == "vast/12345678" and made.provider == "vast"
    assert made.region == "AT"  # "Atlantis, AT"
    assert (made.gpu_name, made.gpu_count, made.gpu_memory_gb) == ("Imaginary RTX 9999", 4, 24.0)
    assert made.vcpus == 32
    assert made.memory_gb == 32.0  # 65536 MB x 32/64 cores
    assert made.disk_gb == 50.0 and made.spot is False
    assert made.instance_type == "Imaginary_RTX_9999x4"
    assert made.price is not None
    assert (made.price.amount, made.price.currency, made.price.unit) == (0.234567, "USD", "hour")
    assert made.price.observed_at == NOW
    assert made.detail == {
        "ask_id": 12345678,
        "disk_gb": 50.0,
        "image": "img",
        "runtype": "ssh_direct",
        "geolocation": "Atlantis, AT",
        "machine_id": 88888,
        "host_id": 55555,
        "reliability": 0.9999,
    }


@pytest.mark.parametrize("price", [None, -1.0, True, "0.5", float("inf"), float("nan")])
def test_a_missing_or_unusable_price_is_none_never_invented(price):
    made = offer(fixtures.listing(1, dph_total=price))
    assert made is not None and made.price is None


@pytest.mark.parametrize(
    "listing",
    [
        None,
        [],
        {"gpu_name": "H100 SXM"},
        fixtures.listing(0),
        fixtures.listing(True),
        fixtures.listing(10**30),
        fixtures.listing("123"),
        fixtures.listing(5, disk_space=20.0),  # cannot hold the 50 GB create asks for
    ],
    ids=["none", "list", "no-id", "zero-id", "bool-id", "huge-id", "string-id", "disk-small"],
)
def test_unusable_listings_are_left_out(listing):
    assert offer(listing) is None


def test_missing_shape_fields_are_unknown_not_guessed():
    bare = {"id": 7}
    made = offer(bare)
    assert made is not None
    assert (made.gpu_name, made.gpu_count, made.vcpus, made.memory_gb) == (None, 0, None, None)
    assert (made.gpu_memory_gb, made.price, made.region) == (None, None, "unknown")


@pytest.mark.parametrize(
    ("geolocation", "region"),
    [
        ("Texas, US", "US"),
        ("Atlantis, at", "AT"),
        ("SE", "SE"),
        ("California, United States", "united-states"),
        ("", "unknown"),
        (None, "unknown"),
        (12, "unknown"),
        (", ,", "unknown"),
    ],
)
def test_region_is_the_listings_country(geolocation, region):
    assert parse.region_of(geolocation) == region


# ------------------------------------------------------------------ instances


@pytest.mark.parametrize(
    ("actual", "intended", "status"),
    [
        (None, "running", InstanceStatus.PENDING),
        ("created", "running", InstanceStatus.PENDING),
        ("loading", "running", InstanceStatus.PENDING),
        ("rebooting", "running", InstanceStatus.PENDING),
        ("running", "running", InstanceStatus.RUNNING),
        ("exited", "running", InstanceStatus.FAILED),
        ("unknown", "running", InstanceStatus.FAILED),
        ("offline", "running", InstanceStatus.FAILED),
        ("stopped", "stopped", InstanceStatus.FAILED),
        ("stopped", "running", InstanceStatus.PENDING),
        ("Something-New", "running", InstanceStatus.PENDING),
    ],
)
def test_status_mapping(actual, intended, status):
    raw = fixtures.instance(1, "gpuprov-vm", actual_status=actual, intended_status=intended)
    assert parse.observed_from_instance(raw, "direct").status is status


def test_oci_runtime_failure_is_failed_even_while_vast_says_created():
    raw = fixtures.booting(
        1,
        "gpuprov-vm",
        actual_status="created",
        status_msg="Error response from daemon: OCI runtime create failed: runc create failed",
    )
    observed = parse.observed_from_instance(raw, "direct")
    assert observed.status is InstanceStatus.FAILED
    assert "OCI runtime create failed" in (observed.message or "")


def test_running_with_a_direct_port_reports_the_hosts_ip_and_port():
    observed = parse.observed_from_instance(fixtures.instance(9, "gpuprov-vm"), "direct")
    assert observed.id == "9"
    assert observed.ssh == SshEndpoint(host="192.0.2.45", port=20000, user="root")
    proxied = parse.observed_from_instance(fixtures.instance(9, "gpuprov-vm"), "proxy")
    assert proxied.ssh == SshEndpoint(host="ssh123.vast.ai", port=10600, user="root")


@pytest.mark.parametrize(
    "ports",
    [
        None,
        {},
        {"22/tcp": []},
        {"22/tcp": [{"HostIp": "0.0.0.0"}]},
        {"22/tcp": [{"HostPort": "0"}]},
        {"22/tcp": [{"HostPort": "70000"}]},
        {"22/tcp": [{"HostPort": "２２"}]},
        {"22/tcp": "20000"},
        [8080],  # show_instance.yaml documents `ports` as a list of ints
    ],
)
def test_running_without_a_usable_ssh_port_is_still_pending(ports):
    observed = parse.observed_from_instance(
        fixtures.instance(9, "gpuprov-vm", ports=ports), "direct"
    )
    assert observed.status is InstanceStatus.PENDING and observed.ssh is None
    assert "waiting for the direct SSH port" in (observed.message or "")


@pytest.mark.parametrize("instance_id", [None, "12", 0, -3, True, 1.5, 10**18])
def test_an_instance_of_ours_without_a_usable_id_is_malformed(instance_id):
    with pytest.raises(parse.MalformedResponse):
        parse.observed_from_instance({"id": instance_id, "label": "gpuprov-vm"}, "direct")


@pytest.mark.parametrize(
    ("label", "vm"),
    [("gpuprov-a-a1-n0-x", "a-a1-n0-x"), ("gpuprov-", None), ("other", None), (None, None)],
)
def test_vm_of_label(label, vm):
    assert parse.vm_of(label) == vm


@pytest.mark.parametrize(
    ("payload", "contract"),
    [
        ({"success": True, "new_contract": 1234568}, 1234568),
        ({"new_contract": 5.0}, 5),
        ({"new_contract": "5"}, None),
        ({"new_contract": 0}, None),
        ({"success": True}, None),
        ([1], None),
    ],
)
def test_new_contract(payload, contract):
    assert parse.new_contract(payload) == contract
