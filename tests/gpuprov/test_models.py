"""The public payloads: JobSpec validation and files, resource_request, JobState, Block."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuprov.models import (
    Block,
    BlockScope,
    JobSpecError,
    JobState,
    ReleasePolicy,
    load_job_spec,
    parse_job_spec,
)
from providers.base import Offer, ResourceRequest
from providers.errors import ErrorKind

FULL_SPEC: dict[str, Any] = {
    "name": "train-7b",
    "team": "default",
    "nodes": 2,
    "resources": {
        "gpu": "H100",
        "gpus_per_node": 8,
        "min_vcpus": 32,
        "min_memory_gb": 256.0,
        "min_disk_gb": 500.0,
        "spot": False,
    },
    "placement": {
        "provisioning": True,
        "providers": ["fake"],
        "regions": ["us-east-1"],
        "order": "price",
        "hedge": None,
        "capacity_wait": True,
    },
    "max_hourly_cost": 40.0,
    "provisioning_timeout_seconds": 1800,
    "release": "terminate_on_completion",
    "health_check_interval_seconds": 600,
    "profile": None,
    "run": "torchrun train.py",
    "setup": "pip install -r requirements.txt",
    "env": {"WANDB_PROJECT": "demo"},
    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
    "ports": [8888],
    "max_runtime_seconds": 86400,
    "recovery": {"max_restarts": 3},
}

YAML_SPEC = """\
name: train-7b                  # the workflow id is job-<name>
nodes: 2
resources:
  gpu: H100
  gpus_per_node: 8
  min_vcpus: 32
  min_memory_gb: 256
  min_disk_gb: 500
  spot: false
placement:
  provisioning: true
  providers: [fake]
  regions: [us-east-1]
max_hourly_cost: 40.0
provisioning_timeout_seconds: 1800
release: terminate_on_completion
run: torchrun train.py
setup: pip install -r requirements.txt
env: {WANDB_PROJECT: demo}
image: nvcr.io/nvidia/pytorch:24.05-py3
ports: [8888]
max_runtime_seconds: 86400
recovery:
  max_restarts: 3
"""

TOML_SPEC = """\
name = "train-7b"
nodes = 2
max_hourly_cost = 40.0
provisioning_timeout_seconds = 1800
release = "terminate_on_completion"
run = "torchrun train.py"
setup = "pip install -r requirements.txt"
image = "nvcr.io/nvidia/pytorch:24.05-py3"
ports = [8888]
max_runtime_seconds = 86400

[env]
WANDB_PROJECT = "demo"

[recovery]
max_restarts = 3

[resources]
gpu = "H100"
gpus_per_node = 8
min_vcpus = 32
min_memory_gb = 256
min_disk_gb = 500
spot = false

[placement]
provisioning = true
providers = ["fake"]
regions = ["us-east-1"]
"""


def rejected(data: Any) -> str:
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(data)
    return str(caught.value)


def with_changes(**changes: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(FULL_SPEC))
    data.update(changes)
    return data


# ---------------------------------------------------------------- bad input names the field


def test_full_spec_is_accepted() -> None:
    spec = parse_job_spec(FULL_SPEC)
    assert spec.nodes == 2 and spec.resources.gpu == "H100"
    assert spec.workflow_id == "job-train-7b"


def test_minimal_spec_takes_the_defaults() -> None:
    spec = parse_job_spec({"name": "a"})
    assert spec.nodes == 1
    assert spec.max_hourly_cost is None
    assert spec.placement.provisioning is True and spec.placement.providers is None
    assert spec.release is ReleasePolicy.TERMINATE_ON_COMPLETION
    assert spec.provisioning_timeout_seconds == 1800


@pytest.mark.parametrize("nodes", [0, -1])
def test_fewer_than_one_node_is_rejected(nodes: int) -> None:
    message = rejected(with_changes(nodes=nodes))
    assert message.startswith("invalid job spec: nodes:")
    assert "greater than or equal to 1" in message


def test_unknown_provider_in_placement_is_rejected_naming_it() -> None:
    message = rejected(with_changes(placement={"providers": ["fake", "azure"]}))
    assert "placement.providers:" in message
    assert "unknown provider 'azure'" in message
    assert "known: fake, lambda, runpod, vast, prime, aws, gce, ssh" in message


@pytest.mark.parametrize("cost", [0, -5.0])
def test_non_positive_max_hourly_cost_is_rejected(cost: float) -> None:
    message = rejected(with_changes(max_hourly_cost=cost))
    assert "max_hourly_cost:" in message
    assert "greater than 0" in message


def test_unknown_top_level_field_is_rejected_naming_it() -> None:
    message = rejected(with_changes(max_hourly_costs=10))
    assert "max_hourly_costs: Extra inputs are not permitted" in message


def test_unknown_nested_field_is_rejected_naming_its_path() -> None:
    message = rejected(with_changes(resources={"gpuu": "H100"}))
    assert "resources.gpuu: Extra inputs are not permitted" in message


@pytest.mark.parametrize(
    "name", ["Train-7B", "train_7b", "-train", "train-", "", "x" * 41, "job name"]
)
def test_bad_name_is_rejected(name: str) -> None:
    message = rejected(with_changes(name=name))
    assert "name:" in message
    assert "pattern" in message


@pytest.mark.parametrize("name", ["a", "7", "train-7b", "x" * 40])
def test_good_names_are_accepted(name: str) -> None:
    assert parse_job_spec(with_changes(name=name)).name == name


def test_missing_name_is_rejected() -> None:
    assert "name: Field required" in rejected({"nodes": 1})


def test_every_offending_field_is_named() -> None:
    message = rejected(with_changes(nodes=0, max_hourly_cost=-1, release="later"))
    assert "nodes:" in message and "max_hourly_cost:" in message and "release:" in message


def test_bad_release_policy_is_rejected() -> None:
    assert "release:" in rejected(with_changes(release="forever"))


@pytest.mark.parametrize("data", [[FULL_SPEC], "train-7b", 7, None])
def test_non_mapping_is_rejected(data: Any) -> None:
    message = rejected(data)
    assert message.startswith("a job spec must be a mapping, got ")


# ---------------------------------------------------------------- files


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_yaml_file_loads(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"job{suffix}"
    path.write_text(YAML_SPEC)
    assert load_job_spec(path) == parse_job_spec(FULL_SPEC)


def test_toml_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(TOML_SPEC)
    assert load_job_spec(path) == parse_job_spec(FULL_SPEC)


def test_json_file_loads_and_round_trips(tmp_path: Path) -> None:
    original = parse_job_spec(FULL_SPEC)
    path = tmp_path / "job.json"
    path.write_text(original.model_dump_json())
    loaded = load_job_spec(str(path))
    assert loaded == original
    assert loaded.model_dump(mode="json") == FULL_SPEC


def test_yaml_round_trip_through_model_dump(tmp_path: Path) -> None:
    import yaml

    original = parse_job_spec(FULL_SPEC)
    path = tmp_path / "again.yaml"
    path.write_text(yaml.safe_dump(original.model_dump(mode="json")))
    assert load_job_spec(path) == original


def test_malformed_yaml_file_is_rejected_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: train\nresources: [unclosed\n")
    with pytest.raises(JobSpecError) as caught:
        load_job_spec(path)
    assert str(caught.value).startswith(f"malformed job spec {path}:")


def test_malformed_toml_file_is_rejected_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('name = "train\nnodes = \n')
    with pytest.raises(JobSpecError) as caught:
        load_job_spec(path)
    assert str(caught.value).startswith(f"malformed job spec {path}:")


def test_malformed_json_file_is_rejected_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text('{"name": "train",')
    with pytest.raises(JobSpecError) as caught:
        load_job_spec(path)
    assert str(caught.value).startswith(f"malformed job spec {path}:")


@pytest.mark.parametrize("text", ["- name: train\n", "just a string\n", ""])
def test_non_mapping_yaml_file_is_rejected(tmp_path: Path, text: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(JobSpecError, match="must be a mapping"):
        load_job_spec(path)


def test_missing_file_is_rejected_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(JobSpecError) as caught:
        load_job_spec(path)
    assert str(caught.value) == f"cannot read job spec {path}: No such file or directory"


def test_invalid_spec_in_a_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(TOML_SPEC.replace("gpus_per_node", "gpu_per_node"))
    with pytest.raises(JobSpecError, match=r"resources\.gpu_per_node"):
        load_job_spec(path)


def test_non_utf8_file_is_a_job_spec_error(tmp_path: Path) -> None:
    # BUG: load_job_spec catches only OSError around read_text(), so bytes that are not UTF-8
    # escape as a raw UnicodeDecodeError instead of a JobSpecError naming the file.
    path = tmp_path / "job.yaml"
    path.write_bytes(b"\xff\xfename: train\n")
    try:
        load_job_spec(path)
    except JobSpecError as error:
        assert str(path) in str(error)
    except UnicodeDecodeError as error:
        pytest.fail(f"load_job_spec leaked {error!r} instead of raising JobSpecError")
    else:
        pytest.fail("a non-UTF-8 job spec was accepted")


# ---------------------------------------------------------------- resource_request


def test_resource_request_carries_resources_placement_image_and_ports() -> None:
    request = parse_job_spec(FULL_SPEC).resource_request()
    assert request == ResourceRequest(
        gpu="H100",
        gpus_per_node=8,
        min_vcpus=32,
        min_memory_gb=256.0,
        min_disk_gb=500.0,
        spot=False,
        providers=["fake"],
        regions=["us-east-1"],
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        ports=[8888],
    )
    assert request.denied_providers == [] and request.denied_regions == []


def test_resource_request_of_minimal_spec_has_no_allow_lists() -> None:
    request = parse_job_spec({"name": "a", "resources": {"spot": True}}).resource_request()
    assert request.providers is None and request.regions is None
    assert request.gpu is None and request.gpus_per_node == 1 and request.spot is True
    assert request.image is None and request.ports == []


# ---------------------------------------------------------------- JobState, Block


@pytest.mark.parametrize(
    ("state", "terminal"),
    [
        (JobState.QUEUED, False),
        (JobState.PROVISIONING, False),
        (JobState.READY, False),
        (JobState.RELEASING, False),
        (JobState.COMPLETED, True),
        (JobState.FAILED, True),
        (JobState.CANCELLED, True),
    ],
)
def test_job_state_terminal(state: JobState, terminal: bool) -> None:
    assert state.terminal is terminal


def test_job_state_values_are_the_public_names() -> None:
    assert [s.value for s in JobState] == [
        "queued",
        "provisioning",
        "ready",
        "running",
        "releasing",
        "completed",
        "failed",
        "cancelled",
    ]


def an_offer(offer_id: str, provider: str = "fake", region: str = "r1") -> Offer:
    return Offer(id=offer_id, provider=provider, region=region, instance_type="gpu8")


def block(scope: BlockScope, key: str) -> Block:
    return Block(scope=scope, key=key, kind=ErrorKind.CAPACITY, message="sold out")


def test_offer_block_covers_only_that_offer() -> None:
    offer_block = block(BlockScope.OFFER, "fake/r1-a/gpu8")
    assert offer_block.covers(an_offer("fake/r1-a/gpu8"))
    assert not offer_block.covers(an_offer("fake/r1-b/gpu8"))


def test_region_block_covers_every_offer_of_that_provider_region() -> None:
    region_block = block(BlockScope.REGION, "fake/r1")
    assert region_block.covers(an_offer("fake/r1-a/gpu8"))
    assert region_block.covers(an_offer("fake/r1-b/gpu1"))
    assert not region_block.covers(an_offer("fake/r2-a/gpu8", region="r2"))
    assert not region_block.covers(an_offer("other/r1/gpu8", provider="other"))


def test_provider_block_covers_every_offer_of_that_provider() -> None:
    provider_block = block(BlockScope.PROVIDER, "fake")
    assert provider_block.covers(an_offer("fake/r1-a/gpu8"))
    assert provider_block.covers(an_offer("fake/r2-a/gpu8", region="r2"))
    assert not provider_block.covers(an_offer("other/r1/gpu8", provider="other"))
