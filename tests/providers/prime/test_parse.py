"""Pure parsing: availability items -> Offers (ids, shapes, prices), pods -> Observed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from providers.base import InstanceStatus, ResourceRequest, compatibility_reasons
from providers.prime.parse import (
    GPU_TYPES,
    PRICE_SOURCE,
    GpuOffer,
    Pod,
    Unreadable,
    gpu_display_name,
    observed,
    offer_price,
    ssh_endpoint,
    to_offer,
    validated,
    vm_of,
)
from tests.providers.prime import bodies

NOW = datetime(2026, 8, 20, 12, 0, tzinfo=UTC)


def offer_of(item: dict[str, Any], disk_gb: int | None = None):
    return to_offer(validated(GpuOffer, item), disk_gb, NOW)


def test_offer_carries_what_create_needs_and_the_guide_s_price():
    offer = offer_of(bodies.HYPERSTACK_H100)
    assert offer.id == "prime/hyperstack/CANADA-1/n3-H100x1/1xH100_80GB"
    assert (offer.provider, offer.region, offer.zone) == ("prime", "canada", "CANADA-1")
    assert (offer.gpu_name, offer.gpu_count, offer.gpu_memory_gb) == ("NVIDIA H100 80GB", 1, 80)
    assert (offer.vcpus, offer.memory_gb, offer.disk_gb, offer.spot) == (180, 180, 100, False)
    assert offer.detail == {
        "cloud_id": "n3-H100x1",
        "gpu_type": "H100_80GB",
        "gpu_count": 1,
        "socket": "PCIe",
        "provider_type": "hyperstack",
        "data_center_id": "CANADA-1",
        "country": "CA",
        "security": "secure_cloud",
        "disk_size": 100,
        "vcpus": 180,
        "memory": 180,
        "images": ["ubuntu_22_cuda_12", "cuda_12_1_pytorch_2_2", "flux", "axolotl"],
        "stock_status": "Available",
        "price_is_variable": False,
    }
    assert offer.price is not None
    assert (offer.price.amount, offer.price.currency, offer.price.unit) == (1.9, "USD", "hour")
    assert (offer.price.source, offer.price.observed_at) == (PRICE_SOURCE, NOW)


def test_disk_not_included_in_the_price_is_added_per_gb_hour():
    # The guide: RunPod's default 80 GB disk costs pricePerUnit per GB-hour on top.
    price = offer_of(bodies.RUNPOD_H100).price
    assert price is not None and price.amount == pytest.approx(2.69 + 80 * 0.00014)


def test_larger_disk_is_priced_only_beyond_the_included_default():
    item = {**bodies.DC_ROAN_H100X8}  # 2000 GB included, 0.0001 per extra GB-hour
    assert offer_of(item).price.amount == pytest.approx(15.92)
    assert offer_of(item, disk_gb=3000).price.amount == pytest.approx(15.92 + 1000 * 0.0001)
    assert offer_of(item, disk_gb=3000).disk_gb == 3000


def test_non_default_disk_with_unsettled_pricing_has_no_price():
    item = {**bodies.HYPERSTACK_H100, "disk": bodies._spec(defaultCount=100, pricePerUnit=0.001)}
    assert offer_of(item).price is not None  # the default size is in the base price
    assert offer_of(item, disk_gb=500).price is None  # included or not: the answer does not say


def test_community_offer_is_priced_by_community_price_and_marked():
    offer = offer_of(bodies.COMMUNITY_RTX4090)
    assert offer.price is not None and offer.price.amount == 0.39
    assert offer.id.endswith("/community/spot") and offer.spot is True
    assert offer.region == "eu_west" and offer.zone is None
    assert offer.detail["price_is_variable"] is True


def test_offer_without_any_price_has_none_never_an_invented_one():
    assert offer_of(bodies.UNPRICED).price is None


def test_euro_prices_keep_their_currency():
    item = {**bodies.HYPERSTACK_H100, "prices": {"onDemand": 1.5, "currency": "EUR"}}
    assert offer_of(item).price.currency == "EUR"


def test_offer_without_region_is_unknown_and_cpu_nodes_have_no_gpu():
    item = {**bodies.HYPERSTACK_H100, "region": None, "gpuType": "CPU_NODE", "gpuMemory": 0}
    offer = offer_of(item)
    assert offer.region == "unknown"
    assert (offer.gpu_name, offer.gpu_count, offer.gpu_memory_gb) == (None, 0, None)


@pytest.mark.parametrize(
    ("asked", "gpu_type", "compatible"),
    [
        ("H100", "H100_80GB", True),
        ("h100", "H100_80GB", True),
        ("A100", "A100_40GB", True),
        ("A10", "A100_80GB", False),
        ("RTX4090", "RTX4090_24GB", True),
        ("H200", "GH200_96GB", False),
    ],
)
def test_gpu_names_match_requests_as_whole_words(asked, gpu_type, compatible):
    offer = offer_of({**bodies.HYPERSTACK_H100, "gpuType": gpu_type})
    reasons = compatibility_reasons(offer, ResourceRequest(gpu=asked, gpus_per_node=1))
    assert (reasons == []) is compatible


def test_gpu_type_list_is_the_documented_enum_without_its_duplicate():
    assert len(GPU_TYPES) == len(set(GPU_TYPES)) == 49
    assert gpu_display_name("RTX_PRO_6000B_96GB") == "NVIDIA RTX PRO 6000B 96GB"


def test_item_missing_a_create_field_is_unreadable():
    item = {k: v for k, v in bodies.HYPERSTACK_H100.items() if k != "cloudId"}
    with pytest.raises(Unreadable, match="cloudId"):
        validated(GpuOffer, item)


def test_huge_counts_are_unreadable_not_offers():
    with pytest.raises(Unreadable):
        validated(GpuOffer, {**bodies.HYPERSTACK_H100, "gpuCount": 10**30})


def test_a_negative_price_is_read_and_is_no_price():
    prices = {"onDemand": -1, "currency": "USD"}
    item = validated(GpuOffer, {**bodies.HYPERSTACK_H100, "prices": prices})
    assert offer_price(item, None, NOW) is None


def test_price_that_overflows_is_none():
    disk = bodies._spec(defaultCount=10**6, pricePerUnit=1e308, defaultIncludedInPrice=False)
    prices = {"onDemand": 1e308, "currency": "USD"}
    item = validated(GpuOffer, {**bodies.RUNPOD_H100, "prices": prices, "disk": disk})
    assert offer_price(item, 10**6, NOW) is None


# ---------------------------------------------------------------------------- pods


def pod(**fields: Any) -> Pod:
    return validated(Pod, bodies.pod("pod-1", "gpuprov-j-a1-n0-abc123", **fields))


@pytest.mark.parametrize(
    ("status", "installation", "ssh", "expected"),
    [
        ("PROVISIONING", "PENDING", None, InstanceStatus.PENDING),
        ("PENDING", "PENDING", None, InstanceStatus.PENDING),
        ("ACTIVE", "PENDING", "root@203.0.113.5 -p 22", InstanceStatus.PENDING),
        ("ACTIVE", "ACTIVE", "root@203.0.113.5 -p 22", InstanceStatus.PENDING),
        ("ACTIVE", "FINISHED", None, InstanceStatus.PENDING),  # no SSH endpoint yet
        ("ACTIVE", "FINISHED", "root@203.0.113.5 -p 22", InstanceStatus.RUNNING),
        ("ACTIVE", "ERROR", "root@203.0.113.5 -p 22", InstanceStatus.FAILED),
        ("ERROR", "PENDING", None, InstanceStatus.FAILED),
        ("STOPPED", "FINISHED", None, InstanceStatus.FAILED),
        ("DELETING", "FINISHED", None, InstanceStatus.STOPPING),
        ("UNKNOWN", "PENDING", None, InstanceStatus.PENDING),
    ],
)
def test_pod_status_mapping(status, installation, ssh, expected):
    state = observed(pod(status=status, installationStatus=installation, sshConnection=ssh))
    assert state is not None and state.status is expected
    assert (state.ssh is not None) is (expected is InstanceStatus.RUNNING)


def test_terminated_pod_is_gone():
    assert observed(pod(status="TERMINATED", installationStatus="TERMINATED")) is None


def test_failed_installation_reports_prime_s_words():
    state = observed(
        pod(status="ACTIVE", installationStatus="ERROR", installationFailure="apt-get failed")
    )
    assert state.status is InstanceStatus.FAILED and state.message == "apt-get failed"


def test_installing_pod_says_how_far_it_got():
    state = observed(pod(status="ACTIVE", installationStatus="ACTIVE", installationProgress=40))
    assert state.message == "ACTIVE, installation ACTIVE 40%"


@pytest.mark.parametrize(
    ("ssh", "ip", "ports", "expected"),
    [
        ("root@203.0.113.5 -p 22", None, [], ("203.0.113.5", 22, "root")),
        ("ubuntu@203.0.113.5 -p 40022", None, [], ("203.0.113.5", 40022, "ubuntu")),
        (["root@203.0.113.5 -p 2222", None], None, [], ("203.0.113.5", 2222, "root")),
        ([None], "203.0.113.9", [], ("203.0.113.9", 22, "root")),
        (
            None,
            "203.0.113.9",
            [{"internal": "22", "external": "31022", "protocol": "TCP", "usedBy": "SSH"}],
            ("203.0.113.9", 31022, "root"),
        ),
        ("root@203.0.113.5 -p 99999", None, [], None),
        ("not an ssh string at all", None, [], None),
        (None, None, [], None),
    ],
)
def test_ssh_endpoint_from_connection_string_or_ip_and_port_mapping(ssh, ip, ports, expected):
    endpoint = ssh_endpoint(pod(sshConnection=ssh, ip=ip, primePortMapping=ports))
    got = None if endpoint is None else (endpoint.host, endpoint.port, endpoint.user)
    assert got == expected


def test_vm_identity_comes_only_from_gpuprov_names():
    assert vm_of("gpuprov-train-a1-n0-ce4389") == "train-a1-n0-ce4389"
    assert vm_of("gpuprov-") is None
    assert vm_of("my-notebook") is None
