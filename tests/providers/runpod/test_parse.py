"""Reading RunPod's catalog and pods: offers (price per GPU x count, stock, data centres) and
the pod status mapping, plus hostile documents that must never escape as anything but a
classified ProviderError or a valid record."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from providers.base import InstanceStatus, Offer
from providers.runpod import parse
from tests.providers.runpod import samples

NOW = datetime(2026, 9, 1, tzinfo=UTC)


def offers(document: dict[str, Any], **overrides: Any) -> list[Offer]:
    options: dict[str, Any] = dict(
        cloud="SECURE", count=8, disk_gb=100, data_centers=None, asked_gpu=None, observed_at=NOW
    )
    options.update(overrides)
    return [o for gpu in parse.catalog_gpus(document) for o in parse.offers_for(gpu, **options)]


def test_price_is_the_per_gpu_list_price_times_the_gpu_count():
    (offer,) = offers(samples.catalog(), asked_gpu="H100 PCIe")
    assert offer.price is not None
    assert offer.price.amount == pytest.approx(2.39 * 8)
    assert (offer.price.currency, offer.price.unit) == ("USD", "hour")
    assert offer.price.source == parse.PRICE_SOURCE
    assert offer.price.observed_at == NOW


def test_community_cloud_uses_the_community_price():
    (offer,) = offers(samples.catalog(), cloud="COMMUNITY", count=4, asked_gpu="H100 PCIe")
    assert offer.price is not None and offer.price.amount == pytest.approx(1.99 * 4)
    assert offer.detail["cloud"] == "COMMUNITY"
    assert offer.id == "runpod/US-KS-2/community/4x-NVIDIA-H100-PCIe"


def test_one_offer_per_stocked_data_centre_and_none_where_stock_is_none():
    found = offers(samples.catalog(), asked_gpu="H100 80GB HBM3")
    found = [o for o in found if o.gpu_name == "NVIDIA H100 80GB HBM3"]
    assert sorted(o.region for o in found) == ["EU-RO-1", "US-TX-3"]  # CA-MTL-1 is NONE


def test_a_gpu_type_stocked_nowhere_gives_no_offer():
    assert offers(samples.catalog(), asked_gpu="A100") == []


def test_more_gpus_than_one_machine_of_the_type_holds_gives_no_offer():
    assert offers(samples.catalog(), asked_gpu="RTX 4090", count=8) == []
    assert len(offers(samples.catalog(), asked_gpu="RTX 4090", count=2)) == 1


def test_a_type_not_on_the_asked_cloud_gives_no_offer():
    assert offers(samples.catalog(), cloud="COMMUNITY", count=4, asked_gpu="MI300X") == []


def test_data_centre_allow_list():
    found = offers(samples.catalog(), data_centers=["US-TX-3"])
    assert {o.region for o in found} == {"US-TX-3"}


def test_offer_carries_what_create_needs_and_what_the_core_filters_on():
    (offer,) = offers(samples.catalog(), asked_gpu="H100 PCIe", disk_gb=250)
    assert offer.provider == "runpod" and offer.region == "US-KS-2"
    assert (offer.gpu_name, offer.gpu_count, offer.gpu_memory_gb) == ("NVIDIA H100 PCIe", 8, 80)
    assert offer.disk_gb == 250 and offer.spot is False
    assert offer.vcpus is None and offer.memory_gb is None  # the catalog does not say
    assert offer.detail == {
        "gpu_id": "NVIDIA H100 PCIe",
        "gpu_count": 8,
        "cloud": "SECURE",
        "data_center": "US-KS-2",
        "disk_gb": 250,
        "availability": "LOW",
    }


@pytest.mark.parametrize("price", [0, None])
def test_a_missing_or_zero_price_is_no_price_never_free(price):
    document = samples.catalog()
    document["gpus"][0]["price"]["secure"] = price
    (offer,) = offers(document, asked_gpu="H100 PCIe")
    assert offer.price is None


def test_a_price_that_overflows_when_multiplied_is_no_price():
    document = samples.catalog()
    document["gpus"][0]["price"]["secure"] = 1e308
    (offer,) = offers(document, asked_gpu="H100 PCIe")
    assert offer.price is None


def test_an_unreadable_catalog_entry_is_skipped_not_fatal():
    document = samples.catalog()
    document["gpus"][0]["memory"] = "lots"
    document["gpus"].insert(0, "not an object")
    found = offers(document)
    assert "NVIDIA H100 PCIe" not in {o.gpu_name for o in found}
    assert "NVIDIA H100 80GB HBM3" in {o.gpu_name for o in found}


@pytest.mark.parametrize("document", [None, [], {"gpu": []}, {"gpus": {}}, "gpus"])
def test_a_catalog_without_its_gpus_array_is_a_bad_response(document):
    with pytest.raises(parse.BadResponse):
        parse.catalog_gpus(document)


# --------------------------------------------------------------------------- pods


@pytest.mark.parametrize(
    ("status", "direct", "expected"),
    [
        ("PROVISIONING", False, InstanceStatus.PENDING),
        ("STARTING", False, InstanceStatus.PENDING),
        ("RUNNING", False, InstanceStatus.PENDING),  # RUNNING before ssh.direct exists
        ("RUNNING", True, InstanceStatus.RUNNING),
        ("EXITED", False, InstanceStatus.FAILED),
        ("ERROR", False, InstanceStatus.FAILED),
        ("RESTARTING", False, InstanceStatus.PENDING),  # a status v2 does not document
    ],
)
def test_status_mapping(status, direct, expected):
    (pod,) = parse.pods({"pods": [samples.pod(status=status, direct=direct)]})
    state = parse.observed(pod)
    assert state is not None and state.status is expected
    assert (state.ssh is not None) == (expected is InstanceStatus.RUNNING)


def test_terminated_pods_are_gone():
    (pod,) = parse.pods({"pods": [samples.pod(status="TERMINATED", direct=False)]})
    assert parse.observed(pod) is None


def test_running_endpoint_is_ssh_direct_as_root():
    (pod,) = parse.pods({"pods": [samples.pod()]})
    state = parse.observed(pod)
    assert state is not None and state.ssh is not None
    assert (state.ssh.host, state.ssh.port, state.ssh.user) == ("195.26.233.3", 34446, "root")


def test_ssh_proxy_is_never_the_endpoint():
    document = samples.pod(direct=False)
    assert document["ssh"]["proxy"] is not None
    (pod,) = parse.pods({"pods": [document]})
    state = parse.observed(pod)
    assert state is not None and state.status is InstanceStatus.PENDING and state.ssh is None
    assert "ssh.direct" in (state.message or "")


def test_a_direct_endpoint_with_an_impossible_port_is_not_an_endpoint():
    document = samples.pod()
    document["ssh"]["direct"]["port"] = 70000
    (pod,) = parse.pods({"pods": [document]})
    state = parse.observed(pod)
    assert state is not None and state.status is InstanceStatus.PENDING


def test_failed_pods_say_why():
    (pod,) = parse.pods({"pods": [samples.pod(status="EXITED", direct=False)]})
    state = parse.observed(pod)
    assert state is not None and state.message == "RunPod pod EXITED"


def test_vm_identity_comes_from_the_name_and_the_marker_must_agree():
    assert parse.vm_of(parse.Pod(id="a", name=samples.LABEL)) == samples.VM
    marked = parse.Pod(id="a", name=samples.LABEL, env={"GPUPROV_VM": samples.VM})
    assert parse.vm_of(marked) == samples.VM
    renamed = parse.Pod(id="a", name=samples.LABEL, env={"GPUPROV_VM": "other-vm"})
    assert parse.vm_of(renamed) is None
    assert parse.vm_of(parse.Pod(id="a", name="my-notebook")) is None
    assert parse.vm_of(parse.Pod(id="a", name="gpuprov-")) is None


def test_pods_with_unreadable_optional_fields_are_still_seen():
    document = samples.pod(status="RUNNING")
    document["ssh"] = "garbage"
    document["env"] = ["not", "a", "map"]
    document["dataCenterId"] = 7
    (pod,) = parse.pods({"pods": [document, {"id": 5}, "junk"]})
    assert (pod.id, pod.name, pod.status, pod.ssh, pod.env) == (
        "7h9k2m4n6p",
        samples.LABEL,
        "RUNNING",
        None,
        None,
    )


@pytest.mark.parametrize("document", [None, {"pods": None}, {"items": []}, [samples.pod()]])
def test_a_pod_list_without_its_pods_array_is_a_bad_response(document):
    with pytest.raises(parse.BadResponse):
        parse.pods(document)


@pytest.mark.parametrize("document", [None, {}, {"id": ""}, {"id": 5}, [], "7h9k2m4n6p"])
def test_a_created_pod_without_an_id_is_a_bad_response(document):
    with pytest.raises(parse.BadResponse):
        parse.created_pod_id(document)


# --------------------------------------------------------------------------- hostile input

HOSTILE_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["NONE", "HIGH", "SECURE", "RUNNING", "", "NVIDIA H100 PCIe"]),
)
HOSTILE_JSON = st.recursive(
    HOSTILE_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


def _mutated(base: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """The realistic document with some fields replaced by hostile values or removed."""
    document = json.loads(json.dumps(base))
    keys = sorted(document)
    for key in data.draw(st.lists(st.sampled_from(keys), max_size=len(keys), unique=True)):
        if data.draw(st.booleans()):
            del document[key]
        else:
            document[key] = data.draw(HOSTILE_JSON)
    return document


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_hostile_catalog_entries_give_valid_offers_or_none(data):
    entry = _mutated(samples.CATALOG["gpus"][1], data)
    try:
        found = offers({"gpus": [entry]}, asked_gpu=data.draw(st.none() | st.just("H100")))
    except parse.BadResponse:
        return
    for offer in found:
        assert Offer.model_validate(offer.model_dump()) == offer
        assert offer.price is None or offer.price.amount >= 0


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_hostile_pods_give_valid_observations_or_are_skipped(data):
    entry = _mutated(samples.pod(), data)
    try:
        found = parse.pods({"pods": [entry]})
    except parse.BadResponse:
        return
    for pod in found:
        parse.vm_of(pod)
        state = parse.observed(pod)
        assert state is None or state.status in InstanceStatus


@settings(max_examples=100, deadline=None)
@given(HOSTILE_JSON)
def test_any_json_document_is_read_or_is_a_bad_response(document):
    for reader in (parse.catalog_gpus, parse.pods, parse.created_pod_id):
        with contextlib.suppress(parse.BadResponse):
            reader(document)
