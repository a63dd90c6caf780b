"""Reading EC2 and Price List answers: statuses, shapes, prices; hostile answers become a
classified ProviderError (or an unpriced offer), never another exception."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from providers.aws import diagnose, parse
from providers.base import InstanceStatus, Severity
from providers.errors import ErrorKind, ProviderError
from tests.providers.aws.stack import recorded

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


def instance(state: str = "running", **fields) -> dict:
    base = {
        "InstanceId": "i-0123456789abcdef0",
        "State": {"Code": 16, "Name": state},
        "PrivateIpAddress": "172.31.20.12",
        "PublicIpAddress": "54.210.1.2",
        "Tags": [{"Key": "gpuprov-vm", "Value": "train-a1-n0-abc123"}],
    }
    base.update(fields)
    return base


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("pending", InstanceStatus.PENDING),
        ("running", InstanceStatus.RUNNING),
        ("shutting-down", InstanceStatus.STOPPING),
        ("stopping", InstanceStatus.STOPPING),
        ("stopped", InstanceStatus.FAILED),
    ],
)
def test_instance_states_map_to_the_core_statuses(state, status):
    found = parse.observed(instance(state), "ubuntu")
    assert found is not None and found.status is status
    assert (found.ssh is not None) is (status is InstanceStatus.RUNNING)


def test_a_terminated_instance_is_gone_not_observed():
    assert parse.observed(instance("terminated"), "ubuntu") is None


def test_running_reports_ssh_on_the_public_address_else_the_private_one():
    found = parse.observed(instance(), "ec2-user")
    assert found is not None and found.ssh is not None
    assert (found.ssh.host, found.ssh.port, found.ssh.user) == ("54.210.1.2", 22, "ec2-user")
    private = parse.observed(instance(PublicIpAddress=None), "ubuntu")
    assert private is not None and private.ssh is not None
    assert private.ssh.host == "172.31.20.12"


def test_a_stopped_instance_is_failed_with_the_clouds_reason():
    stopped = instance(
        "stopped",
        StateReason={
            "Code": "Server.InsufficientInstanceCapacity",
            "Message": "Server.InsufficientInstanceCapacity: Insufficient capacity",
        },
    )
    found = parse.observed(stopped, "ubuntu")
    assert found is not None and found.status is InstanceStatus.FAILED
    assert found.message == "Server.InsufficientInstanceCapacity: Insufficient capacity"


def test_an_unknown_state_is_reported_failed_not_hidden():
    found = parse.observed(instance("hibernating-sideways"), "ubuntu")
    assert found is not None and found.status is InstanceStatus.FAILED
    assert "unknown instance state 'hibernating-sideways'" in (found.message or "")


def test_shapes_come_from_describe_instance_types():
    p5 = {
        "InstanceType": "p5.48xlarge",
        "VCpuInfo": {"DefaultVCpus": 192},
        "MemoryInfo": {"SizeInMiB": 2097152},
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
        "GpuInfo": {
            "Gpus": [
                {
                    "Name": "H100",
                    "Manufacturer": "NVIDIA",
                    "Count": 8,
                    "MemoryInfo": {"SizeInMiB": 81920},
                }
            ],
            "TotalGpuMemoryInMiB": 655360,
        },
    }
    g5g = {
        "InstanceType": "g5g.xlarge",
        "ProcessorInfo": {"SupportedArchitectures": ["arm64"]},
        "GpuInfo": {"Gpus": [{"Name": "T4g", "Manufacturer": "NVIDIA", "Count": 1}]},
    }
    cpu = {"InstanceType": "m7i.large", "VCpuInfo": {"DefaultVCpus": 2}}
    shapes = parse.shapes([p5, g5g, cpu])
    assert shapes["p5.48xlarge"] == parse.Shape(
        name="p5.48xlarge",
        gpu_name="NVIDIA H100",
        gpu_count=8,
        gpu_memory_gb=80.0,
        vcpus=192,
        memory_gb=2048.0,
        architecture="x86_64",
    )
    assert shapes["g5g.xlarge"].architecture == "arm64"
    assert shapes["g5g.xlarge"].memory_gb is None  # unknown stays unknown
    assert (shapes["m7i.large"].gpu_name, shapes["m7i.large"].gpu_count) == (None, 0)


def test_offerings_give_the_zones_of_each_type():
    offerings = [
        {"InstanceType": "p5.48xlarge", "LocationType": "availability-zone", "Location": z}
        for z in ("us-east-1a", "us-east-1c")
    ]
    assert parse.offered_zones(offerings) == {"p5.48xlarge": {"us-east-1a", "us-east-1c"}}


def test_the_newest_spot_price_per_type_and_zone_wins_and_unreadable_ones_are_skipped():
    def entry(zone, price, day):
        return {
            "AvailabilityZone": zone,
            "InstanceType": "g5.xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": price,
            "Timestamp": datetime(2026, 11, day, tzinfo=UTC),
        }

    history = [
        entry("us-east-1a", "0.4100", 29),
        entry("us-east-1a", "0.4350", 30),
        entry("us-east-1b", "NaN", 30),
        entry("us-east-1c", "-1", 30),
        {"AvailabilityZone": "us-east-1d"},
    ]
    assert parse.spot_prices(history) == {("g5.xlarge", "us-east-1a"): 0.435}


def product(instance_type="p5.48xlarge", region="us-east-1", price="55.0400000000") -> str:
    return recorded(
        "get_products_entry.json", instance_type=instance_type, region=region, price=price
    ).decode()


def test_the_on_demand_price_is_the_hourly_usd_of_the_on_demand_term():
    entries = [product()]
    assert parse.on_demand_price(entries, "p5.48xlarge", "us-east-1") == 55.04  # not Reserved


def test_no_price_is_guessed_when_the_price_list_is_empty_ambiguous_or_elsewhere():
    assert parse.on_demand_price([], "p5.48xlarge", "us-east-1") is None
    two = [product(price="55.04"), product(price="98.32")]
    assert parse.on_demand_price(two, "p5.48xlarge", "us-east-1") is None
    assert parse.on_demand_price([product(region="eu-west-1")], "p5.48xlarge", "us-east-1") is None
    assert parse.on_demand_price([product(price="0.0")], "p5.48xlarge", "us-east-1") is None
    assert parse.on_demand_price(["{", "null", "[]"], "p5.48xlarge", "us-east-1") is None


def test_diagnosis_reads_status_checks_events_and_spot_interruptions():
    statuses = [
        {
            "InstanceId": "i-1",
            "SystemStatus": {"Status": "impaired"},
            "InstanceStatus": {"Status": "ok"},
            "Events": [
                {"Code": "instance-retirement", "Description": "degraded hardware"},
                {"Code": "system-reboot", "Description": "[Completed] reboot"},
            ],
        }
    ]
    found = {(f.severity, f.code) for f in diagnose.status_findings(statuses)}
    assert found == {
        (Severity.CRITICAL, "system-status-impaired"),
        (Severity.WARN, "scheduled-instance-retirement"),
    }
    interrupted = instance(
        "terminated",
        StateReason={
            "Code": "Server.SpotInstanceTermination",
            "Message": "Server.SpotInstanceTermination: Spot instance termination",
        },
    )
    (finding,) = diagnose.state_reason_findings([interrupted])
    assert (finding.severity, finding.code) == (Severity.CRITICAL, "spot-interrupted")
    assert "Spot instance termination" in finding.message


# ---------------------------------------------------------------- hostile answers

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)
field_names = st.sampled_from(
    ["InstanceId", "State", "Name", "Tags", "Key", "Value", "PublicIpAddress", "StateReason"]
    + ["InstanceType", "GpuInfo", "Gpus", "Count", "MemoryInfo", "SizeInMiB", "VCpuInfo"]
    + ["DefaultVCpus", "Location", "Instances", "Code", "Message", "ProcessorInfo"]
)
# Dictionaries keyed by the fields the readers look for, with hostile values.
hostile = st.recursive(
    json_values,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(field_names, inner, max_size=6),
    max_leaves=25,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=hostile)
def test_hostile_ec2_answers_become_a_classified_error_or_a_value(answer):
    readers = [
        lambda: [parse.observed(i, "ubuntu") for i in parse.instances(answer)],
        lambda: [parse.tag(i, "gpuprov-vm") for i in parse.instances(answer)],
        lambda: parse.shapes(answer),
        lambda: parse.offered_zones(answer),
        lambda: diagnose.status_findings(answer),
        lambda: diagnose.state_reason_findings(answer),
    ]
    for read in readers:
        try:
            read()
        except ProviderError as error:
            assert error.kind is ErrorKind.FAILED
            assert error.message.startswith("malformed ")


@settings(max_examples=100, deadline=None)
@given(entries=st.lists(json_values.map(json.dumps) | json_values, max_size=4), history=hostile)
def test_hostile_prices_are_none_never_an_exception(entries, history):
    price = parse.on_demand_price(entries, "p5.48xlarge", "us-east-1")
    assert price is None or (isinstance(price, float) and 0 < price < 1_000_000)
    if isinstance(history, list):
        for amount in parse.spot_prices(history).values():
            assert 0 < amount < 1_000_000
