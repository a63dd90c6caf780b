"""The provider contract's pure parts: compatibility_reasons, unsupported_reasons, port_ranges,
Diagnosis.verdict, and the default CloudProvider.diagnose derived from observe (exercised
through the fake cloud)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from providers.base import (
    Capabilities,
    Diagnosis,
    Finding,
    InstanceSpec,
    InstanceStatus,
    Observed,
    Offer,
    ResourceRequest,
    Severity,
    Verdict,
    compatibility_reasons,
    port_ranges,
    price_quote,
    unsupported_reasons,
    vm_label,
)
from providers.fake import FakeCloud
from providers.fake.config import FakeInstanceType, FakeProviderConfig, FakeRegion, FaultRule
from tests.helpers import eventually


def offer(**overrides: Any) -> Offer:
    fields: dict[str, Any] = dict(
        id="fake/r1-a/gpu8",
        provider="fake",
        region="r1",
        zone="r1-a",
        instance_type="gpu8",
        gpu_name="H100",
        gpu_count=8,
        vcpus=64,
        memory_gb=512,
        disk_gb=1000,
    )
    fields.update(overrides)
    return Offer(**fields)


def request(**overrides: Any) -> ResourceRequest:
    fields: dict[str, Any] = dict(gpu="H100", gpus_per_node=8)
    fields.update(overrides)
    return ResourceRequest(**fields)


# ---------------------------------------------------------------- compatibility_reasons


def test_matching_offer_has_no_reasons() -> None:
    assert compatibility_reasons(offer(), request()) == []


def test_empty_request_without_gpu_accepts_any_offer_with_a_gpu() -> None:
    assert compatibility_reasons(offer(), ResourceRequest()) == []


def test_provider_outside_allow_list_is_rejected() -> None:
    reasons = compatibility_reasons(offer(), request(providers=["other"]))
    assert reasons == ["provider fake is not in the allow-list"]


def test_provider_inside_allow_list_is_accepted() -> None:
    assert compatibility_reasons(offer(), request(providers=["other", "fake"])) == []


def test_empty_provider_allow_list_rejects_everything() -> None:
    assert compatibility_reasons(offer(), request(providers=[])) == [
        "provider fake is not in the allow-list"
    ]


def test_denied_provider_is_rejected() -> None:
    reasons = compatibility_reasons(offer(), request(denied_providers=["fake"]))
    assert reasons == ["provider fake is denied"]


def test_region_outside_allow_list_is_rejected() -> None:
    reasons = compatibility_reasons(offer(), request(regions=["r2"]))
    assert reasons == ["region r1 is not in the allow-list"]


def test_region_inside_allow_list_is_accepted() -> None:
    assert compatibility_reasons(offer(), request(regions=["r1"])) == []


def test_denied_region_is_rejected() -> None:
    reasons = compatibility_reasons(offer(), request(denied_regions=["r1"]))
    assert reasons == ["region r1 is denied"]


@pytest.mark.parametrize("asked", ["h100", "H100"])
def test_gpu_name_matches_case_insensitively(asked: str) -> None:
    assert compatibility_reasons(offer(gpu_name="H100"), request(gpu=asked)) == []


def test_offer_gpu_name_matches_case_insensitively() -> None:
    assert compatibility_reasons(offer(gpu_name="h100"), request(gpu="H100")) == []


def test_other_gpu_model_is_rejected() -> None:
    reasons = compatibility_reasons(offer(gpu_name="A100"), request(gpu="H100"))
    assert reasons == ["gpu A100 is not H100"]


def test_offer_without_gpu_is_rejected_when_a_gpu_is_asked() -> None:
    reasons = compatibility_reasons(offer(gpu_name=None, gpu_count=0), request(gpus_per_node=0))
    assert reasons == ["gpu none is not H100"]


def test_too_few_gpus_are_rejected() -> None:
    reasons = compatibility_reasons(offer(gpu_count=4), request(gpus_per_node=8))
    assert reasons == ["4 GPUs < 8"]


def test_more_gpus_than_asked_are_accepted() -> None:
    assert compatibility_reasons(offer(gpu_count=8), request(gpus_per_node=2)) == []


@pytest.mark.parametrize(
    ("field", "minimum", "offered", "reason"),
    [
        ("vcpus", "min_vcpus", 16, "vcpus 16 < 32"),
        ("memory_gb", "min_memory_gb", 128.0, "memory_gb 128.0 < 256.0"),
        ("disk_gb", "min_disk_gb", 100.0, "disk_gb 100.0 < 500.0"),
    ],
)
def test_below_minimum_is_rejected(field: str, minimum: str, offered: float, reason: str) -> None:
    need = {"min_vcpus": 32, "min_memory_gb": 256.0, "min_disk_gb": 500.0}[minimum]
    reasons = compatibility_reasons(offer(**{field: offered}), request(**{minimum: need}))
    assert reasons == [reason]


@pytest.mark.parametrize(
    ("field", "minimum", "need", "reason"),
    [
        ("vcpus", "min_vcpus", 32, "vcpus unknown < 32"),
        ("memory_gb", "min_memory_gb", 256, "memory_gb unknown < 256.0"),
        ("disk_gb", "min_disk_gb", 1, "disk_gb unknown < 1.0"),
    ],
)
def test_unknown_value_fails_a_minimum(field: str, minimum: str, need: float, reason: str) -> None:
    reasons = compatibility_reasons(offer(**{field: None}), request(**{minimum: need}))
    assert reasons == [reason]


@pytest.mark.parametrize("field", ["vcpus", "memory_gb", "disk_gb"])
def test_unknown_value_is_fine_without_a_minimum(field: str) -> None:
    assert compatibility_reasons(offer(**{field: None}), request()) == []


def test_exactly_the_minimum_is_accepted() -> None:
    req = request(min_vcpus=64, min_memory_gb=512, min_disk_gb=1000)
    assert compatibility_reasons(offer(), req) == []


def test_spot_offer_is_rejected_for_on_demand_request() -> None:
    reasons = compatibility_reasons(offer(spot=True), request(spot=False))
    assert reasons == ["spot offer, on-demand asked"]


def test_on_demand_offer_is_rejected_for_spot_request() -> None:
    reasons = compatibility_reasons(offer(spot=False), request(spot=True))
    assert reasons == ["on-demand offer, spot asked"]


def test_spot_offer_matches_spot_request() -> None:
    assert compatibility_reasons(offer(spot=True), request(spot=True)) == []


def test_every_reason_is_listed_not_just_the_first() -> None:
    bad = offer(gpu_name="A10", gpu_count=1, vcpus=None, memory_gb=8, disk_gb=None, spot=True)
    req = request(
        providers=["other"],
        denied_providers=["fake"],
        regions=["r9"],
        denied_regions=["r1"],
        min_vcpus=4,
        min_memory_gb=16,
        min_disk_gb=10,
    )
    assert compatibility_reasons(bad, req) == [
        "provider fake is not in the allow-list",
        "provider fake is denied",
        "region r1 is not in the allow-list",
        "region r1 is denied",
        "gpu A10 is not H100",
        "1 GPUs < 8",
        "vcpus unknown < 4",
        "memory_gb 8.0 < 16.0",
        "disk_gb unknown < 10.0",
        "spot offer, on-demand asked",
    ]


# ---------------------------------------------------------------- Diagnosis.verdict


def finding(severity: Severity) -> Finding:
    return Finding(severity=severity, code=severity.value, message="x")


RUNNING = Observed(id="i-1", status=InstanceStatus.RUNNING)


def test_no_instance_is_gone_whatever_the_findings() -> None:
    assert Diagnosis(instance=None).verdict is Verdict.GONE
    assert Diagnosis(instance=None, findings=[finding(Severity.CRITICAL)]).verdict is Verdict.GONE


def test_no_findings_is_healthy() -> None:
    assert Diagnosis(instance=RUNNING).verdict is Verdict.HEALTHY


def test_info_findings_are_still_healthy() -> None:
    assert Diagnosis(instance=RUNNING, findings=[finding(Severity.INFO)]).verdict is Verdict.HEALTHY


def test_a_warning_is_degraded() -> None:
    findings = [finding(Severity.INFO), finding(Severity.WARN)]
    assert Diagnosis(instance=RUNNING, findings=findings).verdict is Verdict.DEGRADED


def test_a_critical_finding_is_unhealthy_even_with_warnings() -> None:
    findings = [finding(Severity.WARN), finding(Severity.CRITICAL), finding(Severity.INFO)]
    assert Diagnosis(instance=RUNNING, findings=findings).verdict is Verdict.UNHEALTHY


# ---------------------------------------------------------------- default diagnose via FakeCloud

BOOT = 0.15  # generous: Pending must still hold on a loaded machine
DELETE = 0.15


def small_cloud(faults: list[FaultRule] | None = None) -> FakeCloud:
    config = FakeProviderConfig(
        regions=[FakeRegion(name="r1", zones=["r1-a"])],
        instance_types=[FakeInstanceType(name="gpu8", gpu="H100", gpu_count=8, price=10.0)],
        boot_delay_seconds=BOOT,
        delete_delay_seconds=DELETE,
        faults=faults or [],
    )
    return FakeCloud(config)


def spec(vm: str = "job-a1-n0") -> InstanceSpec:
    return InstanceSpec(vm=vm, job="job", node_index=0, attempt=1)


async def launch(cloud: FakeCloud, vm: str = "job-a1-n0") -> tuple[Offer, list[str]]:
    (first, *_) = await cloud.plan(ResourceRequest())
    prepared = await cloud.prepare(first, spec(vm))
    return first, await cloud.create(first, prepared, spec(vm))


async def booted(cloud: FakeCloud, offer: Offer, vm: str = "job-a1-n0") -> None:
    """Polls until no instance of `vm` is Pending any more (Running, or Failed)."""

    async def done() -> bool:
        found = await cloud.observe(offer.location, vm)
        return bool(found) and all(o.status is not InstanceStatus.PENDING for o in found)

    await eventually(done, f"{vm} booted")


async def wait_gone(cloud: FakeCloud, offer: Offer, vm: str = "job-a1-n0") -> None:
    async def nothing() -> bool:
        return await cloud.observe(offer.location, vm) == []

    await eventually(nothing, f"{vm} gone")


async def test_running_instance_is_healthy() -> None:
    cloud = small_cloud()
    first, ids = await launch(cloud)
    await booted(cloud, first)
    diagnosis = await cloud.diagnose(first.location, "job-a1-n0")
    assert diagnosis.instance is not None and diagnosis.instance.id == ids[0]
    assert diagnosis.findings == []
    assert diagnosis.verdict is Verdict.HEALTHY


async def test_pending_instance_is_degraded() -> None:
    cloud = small_cloud()
    first, _ = await launch(cloud)
    diagnosis = await cloud.diagnose(first.location, "job-a1-n0")
    assert diagnosis.verdict is Verdict.DEGRADED
    assert [(f.severity, f.code) for f in diagnosis.findings] == [(Severity.WARN, "pending")]
    assert diagnosis.findings[0].message == "instance is Pending"


async def test_boot_failed_instance_is_unhealthy_with_the_providers_words() -> None:
    cloud = small_cloud([FaultRule(primitive="create", effect="boot_failed")])
    first, _ = await launch(cloud)
    await booted(cloud, first)
    diagnosis = await cloud.diagnose(first.location, "job-a1-n0")
    assert diagnosis.verdict is Verdict.UNHEALTHY
    assert [(f.severity, f.code) for f in diagnosis.findings] == [(Severity.CRITICAL, "failed")]
    assert diagnosis.findings[0].message == "instance failed to boot"


async def test_stopping_instance_is_degraded_then_gone_after_delete() -> None:
    cloud = small_cloud()
    first, ids = await launch(cloud)
    await booted(cloud, first)
    await cloud.delete(first.location, "job-a1-n0", ids)
    stopping = await cloud.diagnose(first.location, "job-a1-n0")
    assert stopping.verdict is Verdict.DEGRADED
    assert [f.code for f in stopping.findings] == ["stopping"]
    await wait_gone(cloud, first)
    gone = await cloud.diagnose(first.location, "job-a1-n0")
    assert gone.instance is None
    assert gone.verdict is Verdict.GONE


async def test_never_created_vm_is_gone() -> None:
    cloud = small_cloud()
    first, _ = await launch(cloud, vm="other-vm")
    assert (await cloud.diagnose(first.location, "job-a1-n0")).verdict is Verdict.GONE


async def test_two_instances_with_one_identity_are_flagged_as_duplicate() -> None:
    cloud = small_cloud()
    first, ids = await launch(cloud)
    second_ids = await cloud.create(first, {}, spec())
    await booted(cloud, first)
    diagnosis = await cloud.diagnose(first.location, "job-a1-n0")
    assert diagnosis.verdict is Verdict.DEGRADED
    (duplicate,) = diagnosis.findings
    assert duplicate.code == "duplicate"
    assert ids[0] in duplicate.message and second_ids[0] in duplicate.message


async def test_diagnose_narrows_to_the_given_instance_id() -> None:
    cloud = small_cloud()
    first, ids = await launch(cloud)
    second_ids = await cloud.create(first, {}, spec())
    await booted(cloud, first)
    diagnosis = await cloud.diagnose(first.location, "job-a1-n0", second_ids[0])
    assert diagnosis.instance is not None and diagnosis.instance.id == second_ids[0]
    assert diagnosis.verdict is Verdict.HEALTHY
    missing = await cloud.diagnose(first.location, "job-a1-n0", "fake-i-999999")
    assert missing.verdict is Verdict.GONE
    assert ids[0] != second_ids[0]


async def test_diagnose_changes_nothing() -> None:
    cloud = small_cloud()
    first, _ = await launch(cloud)
    before = cloud.state.instances()
    await cloud.diagnose(first.location, "job-a1-n0")
    assert cloud.state.instances() == before


def test_vm_label_prefixes_the_identity() -> None:
    assert vm_label("train-a1-n0") == "gpuprov-train-a1-n0"
    assert spec("train-a1-n0").label == "gpuprov-train-a1-n0"


@pytest.mark.parametrize(
    "amount", [None, 0, 0.0, -1.5, float("nan"), float("inf"), 1e308, 2**64, 10**400]
)
def test_a_price_that_is_absent_zero_negative_absurd_or_not_a_number_is_no_quote(amount):
    assert price_quote(amount, source="s", observed_at=datetime.now(UTC)) is None


def test_the_bound_on_a_price_is_per_gpu():
    now = datetime.now(UTC)
    assert price_quote(10_001, source="s", observed_at=now) is None
    assert price_quote(10_001, source="s", observed_at=now, gpus=0) is None
    quote = price_quote(10_001, source="s", observed_at=now, gpus=8)
    assert quote is not None and quote.amount == 10_001
    assert price_quote(80_001, source="s", observed_at=now, gpus=8) is None


def test_a_positive_price_is_quoted_as_stated():
    quote = price_quote(2.5, currency="EUR", source="GET /x", observed_at=datetime.now(UTC))
    assert quote is not None and (quote.amount, quote.currency, quote.unit) == (2.5, "EUR", "hour")


@pytest.mark.parametrize(
    ("unsupported", "asks", "reasons"),
    [
        ([], {"image": "x", "ports": [80]}, []),
        (["image"], {}, []),  # declared, but not asked
        (["image", "spot"], {"image": "x", "spot": True}, ["ssh cannot run a container image"]),
        (["ports"], {"ports": [80]}, ["ssh cannot open ports"]),
        (["ports"], {"ports": []}, []),
        (
            ["ports", "image"],
            {"image": "x", "ports": [80]},
            ["ssh cannot run a container image", "ssh cannot open ports"],
        ),
    ],
)
def test_unsupported_reasons_name_what_the_job_asks_that_the_cloud_cannot_do(
    unsupported, asks, reasons
) -> None:
    hints = Capabilities(unsupported=unsupported)
    assert unsupported_reasons("ssh", hints, ResourceRequest(**asks)) == reasons


@pytest.mark.parametrize(
    ("ports", "ranges"),
    [
        ([], []),
        ([8080], [(8080, 8080)]),
        ([8002, 8000, 8001, 8001, 9000], [(8000, 8002), (9000, 9000)]),
        ([1, 3, 5], [(1, 1), (3, 3), (5, 5)]),
    ],
)
def test_port_ranges_are_the_fewest_ascending_runs(ports, ranges) -> None:
    assert port_ranges(ports) == ranges
