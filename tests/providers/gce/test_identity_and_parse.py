"""Identity fitting (names, labels, request ids) and reading instances into the contract."""

from __future__ import annotations

import re

import pytest

from providers.base import InstanceStatus
from providers.errors import ErrorKind, ProviderError
from providers.gce.identity import (
    firewall_name,
    instance_name,
    request_id,
    split_instance_id,
    user_labels,
    vm_label_value,
)
from providers.gce.parse import Instance, Operation, by_vm, observed, read
from tests.providers.gce import bodies

NAME_RULE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL_RULE = re.compile(r"[a-z0-9_-]{0,63}")
LONGEST_VM = f"{'j' * 40}-a123-n456-abcdef"  # the longest identity a job name can give


def test_a_normal_identity_is_used_as_it_is():
    vm = "train-7b-a1-n0-ce4389"
    assert instance_name(vm) == f"gpuprov-{vm}"
    assert vm_label_value(vm) == vm
    assert firewall_name(vm) == f"gpuprov-{vm}-ssh"


@pytest.mark.parametrize("vm", [LONGEST_VM, "Train_7B.a1", "x" * 200, "-", "ünï-çødé", ""])
def test_every_identity_fits_gce_rules_and_stays_distinct(vm):
    for name in (instance_name(vm), firewall_name(vm)):
        assert len(name) <= 63 and NAME_RULE.fullmatch(name), name
    assert LABEL_RULE.fullmatch(vm_label_value(vm))
    assert instance_name(vm) != instance_name(vm + "x")
    assert vm_label_value(vm) != vm_label_value(vm + "x")


def test_request_ids_are_uuids_fixed_by_what_the_call_does():
    first = request_id("p", "us-central1-a", "gpuprov-x", "insert")
    assert first == request_id("p", "us-central1-a", "gpuprov-x", "insert")
    assert re.fullmatch(
        r"[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", first
    )
    others = {
        request_id("p", "us-central1-b", "gpuprov-x", "insert"),
        request_id("p", "us-central1-a", "gpuprov-x", "delete"),
        request_id("p", "us-central1-a", "gpuprov-x", "insert", after="operation-1"),
    }
    assert first not in others and len(others) == 3


def test_instance_ids_split_back_and_anything_else_is_not_ours():
    assert split_instance_id("us-central1-a/gpuprov-x") == ("us-central1-a", "gpuprov-x")
    for value in ("gpuprov-x", "us-central1-a/", "zone/Name", "../../x", "us-central1-a/a/b"):
        assert split_instance_id(value) is None


def test_labels_carry_identity_and_job_and_clean_the_specs_labels():
    labels = user_labels({"Team": "ML Infra", "9bad": "x", "ok": "v"}, "vm-1", "job")
    assert labels["gpuprov_vm"] == "vm-1" and labels["gpuprov_job"] == "job"
    assert labels["team"] == "ml_infra" and labels["ok"] == "v"
    assert "9bad" not in labels
    assert len(user_labels({f"k{i}": "v" for i in range(100)}, "vm", "job")) <= 64


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        ("PROVISIONING", InstanceStatus.PENDING),
        ("STAGING", InstanceStatus.PENDING),
        ("REPAIRING", InstanceStatus.PENDING),
        ("RUNNING", InstanceStatus.RUNNING),
        ("STOPPING", InstanceStatus.STOPPING),
        ("SUSPENDING", InstanceStatus.STOPPING),
        ("TERMINATED", InstanceStatus.FAILED),
        ("STOPPED", InstanceStatus.FAILED),
        ("SUSPENDED", InstanceStatus.FAILED),
        ("SOMETHING_NEW", InstanceStatus.PENDING),
    ],
)
def test_statuses_map_as_clouds_md_says(status, kind):
    instance = read(Instance, bodies.instance(status), "list")
    assert observed(instance, "gpuprov", external_ip=True).status is kind


def test_running_reports_ssh_to_the_external_ip_and_waits_without_one():
    running = observed(read(Instance, bodies.instance(), "list"), "gpuprov", external_ip=True)
    assert running.id == f"{bodies.ZONE}/{bodies.NAME}"
    assert running.ssh is not None
    assert (running.ssh.host, running.ssh.port, running.ssh.user) == ("34.118.0.10", 22, "gpuprov")
    no_ip = observed(read(Instance, bodies.instance(nat_ip=None), "list"), "u", external_ip=True)
    assert no_ip.status is InstanceStatus.PENDING and no_ip.ssh is None
    internal = observed(
        read(Instance, bodies.instance(nat_ip=None), "list"), "u", external_ip=False
    )
    assert internal.ssh is not None and internal.ssh.host == "10.128.0.7"


def test_a_stopped_instance_is_failed_with_the_clouds_words():
    body = bodies.instance("TERMINATED", statusMessage="Instance was preempted.")
    failed = observed(read(Instance, body, "list"), "u", external_ip=True)
    assert failed.message == "TERMINATED: Instance was preempted."


def test_the_vm_comes_from_metadata_only_when_it_agrees_with_the_label():
    assert read(Instance, bodies.instance(), "list").vm == bodies.VM
    forged = bodies.instance()
    forged["metadata"]["items"][0]["value"] = "someone-else"
    assert read(Instance, forged, "list").vm == bodies.VM  # the label wins
    unlabelled = bodies.instance(labels={})
    assert by_vm([read(Instance, unlabelled, "list")], "u", True) == {}


def test_observed_never_carries_metadata_values():
    instance = read(Instance, bodies.instance(), "list")
    assert "secret-join-token" not in observed(instance, "u", True).model_dump_json()


def test_unreadable_responses_name_the_field_not_the_value():
    body = bodies.instance()
    body["networkInterfaces"][0]["accessConfigs"][0]["natIP"] = "secret-join-token; rm -rf /"
    with pytest.raises(ProviderError) as caught:
        read(Instance, body, "list instances")
    assert caught.value.kind is ErrorKind.TRANSIENT
    assert "natIP" in caught.value.message and "secret" not in caught.value.message


def test_operations_read_done_and_failure():
    assert read(Operation, bodies.operation("RUNNING"), "wait").failure("wait") is None
    failed = read(Operation, bodies.STOCKOUT_OPERATION, "wait")
    assert failed.done and failed.failure("wait").kind is ErrorKind.CAPACITY
