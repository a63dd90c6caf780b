"""The provider contract: the one interface every cloud implements, and its typed records.

Nothing above this module knows a cloud's name. The core calls these primitives through
`activities/cloud.py` and decides what to do with their failures in `gpuprov/policy.py`.

| primitive | must | must not |
| --- | --- | --- |
| plan | offers, cheapest first; what create needs goes in Offer.detail | create anything |
| prepare | idempotent per (VM, location); returns private JSON (journaled) | create the instance |
| create | one attempt; label all `gpuprov-<vm>`; boot spec.image, open spec.ports | wait or retry |
| observe | every non-terminated instance with the identity; Failed is reported | hide broken ones |
| observe_region | optional: the same for every gpuprov VM of a region, one list call | be stale |
| sweep_regions | optional: regions the reconciler lists even with no record there | call out |
| delete | request deletion; unknown or gone ids are success | wait |
| cleanup | delete per-VM side resources; idempotent | touch shared resources |
| observe_side_resources | optional: what cleanup would remove, by VM, per region | delete |
| diagnose | read-only findings; default derived from observe | change anything |

An image or ports a cloud cannot honour are declared in `Capabilities.unsupported` ("image",
"ports"): the core then never offers that cloud to a job asking for them, so create never
has to ignore one.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

VM_LABEL_PREFIX = "gpuprov-"


class Model(BaseModel):
    """Base for every record that crosses the boundary: frozen-shape, unknown fields rejected."""

    # No infinities or NaN anywhere: `max_hourly_cost: .inf` would otherwise reach the
    # workflow as null, i.e. "no cap", and PostgreSQL's JSON refuses them.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class PriceQuote(Model):
    """A price exactly as the provider stated it. Never invented: no quote means None.
    Adapters make one with `price_quote`, which turns an amount that is no price into None."""

    amount: float = Field(ge=0)
    currency: str = "USD"
    unit: str = "hour"  # per instance
    source: str  # where the number came from, e.g. "simulated" or an API endpoint
    observed_at: datetime


# No GPU anyone rents costs this much an hour (the dearest list near 10 USD, whole 8-GPU
# machines near 100 USD): a quote above it per GPU is a placeholder, an overflow or a hostile
# listing, not a price, and taken as one it would sum to infinity in a job's estimate.
MAX_PRICE_PER_GPU_HOUR = 10_000.0


def price_quote(
    amount: float | None,
    *,
    source: str,
    observed_at: datetime,
    currency: str = "USD",
    unit: str = "hour",
    gpus: int = 1,
) -> PriceQuote | None:
    """The quote for a price a provider stated, or None where it stated none: absent, not a
    finite number, zero or negative, or above `MAX_PRICE_PER_GPU_HOUR` for each of the
    machine's `gpus` (at least one, so a machine of unknown or no GPUs is held to one GPU's
    bound). Clouds write 0 where they have no price (an unpriced catalogue entry, a SKU
    without a rate), so 0 is "no price", never "free", on every cloud."""
    if amount is None:
        return None
    try:
        amount = float(amount)  # an int past float's range (JSON allows one) is no price
    except OverflowError:
        return None
    if not math.isfinite(amount) or amount <= 0 or amount > MAX_PRICE_PER_GPU_HOUR * max(gpus, 1):
        return None
    return PriceQuote(
        amount=amount, currency=currency, unit=unit, source=source, observed_at=observed_at
    )


class ResourceRequest(Model):
    """What one node of a job needs."""

    gpu: str | None = None  # model name, case-insensitive; None = no GPU requirement
    gpus_per_node: int = Field(default=1, ge=0)
    min_vcpus: int | None = Field(default=None, ge=0)
    min_memory_gb: float | None = Field(default=None, ge=0)
    min_disk_gb: float | None = Field(default=None, ge=0)
    spot: bool = False
    providers: list[str] | None = None  # allow-list
    regions: list[str] | None = None  # allow-list
    denied_providers: list[str] = Field(default_factory=list)
    denied_regions: list[str] = Field(default_factory=list)
    # What the machine boots and what it opens: only a cloud that can honour them is offered
    # to a job that asks (Capabilities.unsupported, `unsupported_reasons`).
    image: str | None = None
    ports: list[int] = Field(default_factory=list)


class Offer(Model):
    """One way to get a node: an instance type in a region (and zone) of one provider."""

    id: str
    provider: str
    region: str
    zone: str | None = None
    instance_type: str
    gpu_name: str | None = None
    gpu_count: int = 0
    gpu_memory_gb: float | None = None
    vcpus: int | None = None
    memory_gb: float | None = None
    disk_gb: float | None = None
    spot: bool = False
    price: PriceQuote | None = None
    detail: dict[str, Any] = Field(default_factory=dict)  # whatever create needs

    @property
    def location(self) -> Location:
        return Location(provider=self.provider, region=self.region, zone=self.zone)


class Location(Model):
    provider: str
    region: str
    zone: str | None = None


class NodeBootstrap(Model):
    """How a booted node joins the control plane. Holds a secret: it is filled in inside the
    create activity (never by the workflow), handed to the cloud as user data, and excluded
    from every serialisation, so it can never reach Temporal history."""

    api_url: str
    join_token: str = Field(repr=False)
    # PEM of the CA that signed the API's certificate, where it has a private one (`[api]
    # ca_file`): the node pins it (the agent's --ca-file). Public, but it travels with the rest.
    ca_pem: str | None = None


class InstanceSpec(Model):
    """What to create for one node. `vm` is the identity every resource is labelled with."""

    vm: str  # e.g. "train-7b-a2-n0": job, attempt, node
    job: str
    node_index: int
    attempt: int
    # The image the machine boots, in the cloud's own terms (an AMI, a GCE image, a container
    # image, ...; docs/clouds/<id>.md); None = the section's default.
    image: str | None = None
    ports: list[int] = Field(default_factory=list)  # TCP ports to open to the machine
    ssh_public_key: str | None = None
    user_data: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    bootstrap: NodeBootstrap | None = Field(default=None, exclude=True, repr=False)

    @property
    def label(self) -> str:
        return vm_label(self.vm)


def vm_label(vm: str) -> str:
    """The identity tag/label/name a cloud resource carries: `gpuprov-<vm>`."""
    return f"{VM_LABEL_PREFIX}{vm}"


class InstanceStatus(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    STOPPING = "Stopping"
    FAILED = "Failed"


class SshEndpoint(Model):
    host: str
    port: int = 22
    user: str = "root"
    host_key_fingerprint: str | None = None  # SHA256:... where the cloud reports one


class Observed(Model):
    """One non-terminated instance carrying a VM identity, as the provider reports it now."""

    id: str
    status: InstanceStatus
    ssh: SshEndpoint | None = None
    message: str | None = None  # the provider's own words about its state, if any


class Billing(Model):
    """How a cloud turns a machine's running time into a bill, as its own documents state it.

    `granularity_seconds`: running time is billed in whole increments of this length (60: per
    minute, 1: per second); None where the cloud documents none, and an actual cost then counts
    exact seconds and says so. `minimum_seconds`: the least time a machine is billed for, where
    the cloud documents a minimum. `source`: the vendor document that states both."""

    granularity_seconds: float | None = Field(default=None, gt=0)
    minimum_seconds: float = Field(default=0.0, ge=0)
    source: str | None = None


class Capabilities(Model):
    """What a provider cannot do, and how long its machines take (the core's wait bounds)."""

    # Features of a job this cloud cannot honour. The core refuses the cloud's offers to a job
    # that asks for one of ASKS' keys (`unsupported_reasons`); other entries ("spot",
    # "user_data") are informative.
    unsupported: list[str] = Field(default_factory=list)
    # Booted instances run the node agent, which registers through the API; placement then
    # waits (within boot_timeout) for that registration and checks its capabilities.
    node_agent: bool = False
    # The core starts the node agent itself over SSH once the machine runs
    # (activities/bootstrap.py), handing it a fresh join token on its stdin; implies node_agent.
    ssh_bootstrap: bool = False
    # The machine runs cloud-init on the create call's user data (InstanceSpec.user_data): the
    # core can then give an SSH-bootstrapped node a host key it generated, known before first
    # contact, instead of trusting a reported fingerprint or the first key seen.
    cloud_init: bool = False
    boot_timeout: float = Field(default=1200.0, gt=0)  # seconds until Running
    delete_timeout: float = Field(default=600.0, gt=0)  # seconds until gone
    poll_interval: float = Field(default=10.0, gt=0)  # seconds between observe calls
    # How running time is billed (per second, per minute with a minimum, ...): the actual cost
    # of a machine is its quote times its running time rounded up by these terms.
    billing: Billing = Field(default_factory=Billing)


# What a job can ask that a cloud may be unable to do: the `Capabilities.unsupported` entry,
# whether the request asks for it, and why the cloud's offers are then refused.
ASKS: dict[str, tuple[Callable[[ResourceRequest], bool], str]] = {
    "image": (lambda request: request.image is not None, "cannot run a container image"),
    "ports": (lambda request: bool(request.ports), "cannot open ports"),
}


def unsupported_reasons(
    provider: str, capabilities: Capabilities, request: ResourceRequest
) -> list[str]:
    """Why none of `provider`'s offers can serve `request`: what it asks that the provider
    declares unsupported. Empty means the provider can honour every ask."""
    return [
        f"{provider} {reason}"
        for feature, (asks, reason) in ASKS.items()
        if feature in capabilities.unsupported and asks(request)
    ]


EVERY_OFFER = "*"  # the offer id's tail in a rejection of every offer of a provider


def refusal(provider: str, reasons: list[str]) -> str:
    """A plan's rejection of every offer of `provider` at once, in the shape of an offer's
    ("<offer id>: <reasons>"): `<provider>/*: <reasons>`."""
    return f"{provider}/{EVERY_OFFER}: {'; '.join(reasons)}"


def port_ranges(ports: list[int]) -> list[tuple[int, int]]:
    """The ports as the fewest inclusive (first, last) ranges, ascending: firewalls count rules
    (an EC2 security group holds 60 by default), so 8000-8010 is one rule, not eleven."""
    ranges: list[tuple[int, int]] = []
    for port in sorted(set(ports)):
        if ranges and port == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], port)
        else:
            ranges.append((port, port))
    return ranges


class Severity(StrEnum):
    INFO = "info"
    WARN = "warn"
    CRITICAL = "critical"


class Verdict(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    GONE = "gone"


class Finding(Model):
    severity: Severity
    code: str
    message: str


class Diagnosis(Model):
    """Read-only health of one VM. `instance` None means nothing carries the identity: gone."""

    instance: Observed | None
    findings: list[Finding] = Field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        if self.instance is None:
            return Verdict.GONE
        severities = {finding.severity for finding in self.findings}
        if Severity.CRITICAL in severities:
            return Verdict.UNHEALTHY
        if Severity.WARN in severities:
            return Verdict.DEGRADED
        return Verdict.HEALTHY


class CloudProvider(abc.ABC):
    """One cloud account. Every primitive is one bounded call; the core does all waiting."""

    name: str

    def capabilities(self) -> Capabilities:
        return Capabilities()

    @abc.abstractmethod
    async def plan(self, request: ResourceRequest) -> list[Offer]: ...

    @abc.abstractmethod
    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]: ...

    @abc.abstractmethod
    async def create(
        self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec
    ) -> list[str]: ...

    @abc.abstractmethod
    async def observe(self, location: Location, vm: str) -> list[Observed]: ...

    async def observe_region(self, location: Location) -> dict[str, list[Observed]] | None:
        """Every non-terminated gpuprov instance in the region, by VM identity, in ONE list
        call; None where the cloud cannot list by identity (the core then observes per VM).
        Lets the core share one call among every job waiting in a region, and lets the
        reconciler find machines that carry the identity but that no record points to."""
        return None

    def sweep_regions(self) -> list[str]:
        """Regions the reconciler lists on every pass even where no VM row or orphan record
        points (a machine whose record was lost). Default: none, so it sweeps only the regions
        the database names. Configuration only: no cloud call."""
        return []

    async def observe_side_resources(self, location: Location) -> dict[str, list[str]] | None:
        """The per-VM side resources prepare makes (firewalls, security groups, per-VM keys)
        that are still there in the region, by VM identity: each VM's resources as short
        descriptions ("security-group sg-0abc gpuprov-<vm>"). Read-only, a few list calls.
        Only resources that `cleanup(location, vm)` would remove are listed, so the reconciler
        can give a VM without an instance its cleanup. {} where prepare makes nothing per VM;
        None where the cloud cannot list them by identity (the default)."""
        return None

    @abc.abstractmethod
    async def delete(self, location: Location, vm: str, ids: list[str]) -> None: ...

    @abc.abstractmethod
    async def cleanup(self, location: Location, vm: str) -> None: ...

    async def diagnose(
        self, location: Location, vm: str, instance_id: str | None = None
    ) -> Diagnosis:
        """Default diagnosis: what observe says about the instance."""
        observed = [o for o in await self.observe(location, vm) if instance_id in (None, o.id)]
        if not observed:
            return Diagnosis(instance=None)
        instance = observed[0]
        findings: list[Finding] = []
        if len(observed) > 1:
            ids = ", ".join(o.id for o in observed)
            findings.append(
                Finding(severity=Severity.WARN, code="duplicate", message=f"several: {ids}")
            )
        if instance.status is InstanceStatus.FAILED:
            findings.append(
                Finding(
                    severity=Severity.CRITICAL,
                    code="failed",
                    message=instance.message or "the provider reports the instance failed",
                )
            )
        elif instance.status is not InstanceStatus.RUNNING:
            findings.append(
                Finding(
                    severity=Severity.WARN,
                    code=instance.status.value.lower(),
                    message=instance.message or f"instance is {instance.status.value}",
                )
            )
        return Diagnosis(instance=instance, findings=findings)

    def secrets(self) -> list[str]:
        """Every credential this adapter holds: its section's `SecretStr` values
        (`ProviderSettings.secret_values()`), what it resolved from a file or the environment,
        and what it derived (access tokens, session credentials). The core scrubs them, and the
        tokens of the spec in play, out of every failure message; adapters do not scrub."""
        return []

    async def aclose(self) -> None:
        """Release connections; providers holding clients override this."""


class NodeShape(Model):
    """What one node has, whether promised by an offer or reported by a registered worker.

    None means unknown (an offer that does not state it) or not applicable (an existing worker
    has no cloud provider, region or spot market).
    """

    provider: str | None = None
    region: str | None = None
    gpu_name: str | None = None
    gpu_count: int = 0
    vcpus: int | None = None
    memory_gb: float | None = None
    disk_gb: float | None = None
    spot: bool | None = None
    gpu_runtime_ok: bool | None = None  # None until the node itself reports
    gpu_runtime_error: str | None = None


def offer_shape(offer: Offer) -> NodeShape:
    return NodeShape(
        provider=offer.provider,
        region=offer.region,
        gpu_name=offer.gpu_name,
        gpu_count=offer.gpu_count,
        vcpus=offer.vcpus,
        memory_gb=offer.memory_gb,
        disk_gb=offer.disk_gb,
        spot=offer.spot,
    )


def gpu_model_matches(asked: str, reported: str | None) -> bool:
    """Case-insensitive match on whole words: "H100" matches "NVIDIA H100 80GB HBM3", but
    "A10" does not match "NVIDIA A100"."""
    words = reported.lower().replace("-", " ").split() if reported else []
    return all(word in words for word in asked.lower().replace("-", " ").split())


def compatibility_reasons(node: Offer | NodeShape, request: ResourceRequest) -> list[str]:
    """Why `node` cannot serve one node of `request`; empty means compatible.

    One function for both decisions: filtering offers at plan time and accepting a registered
    worker (its reported capabilities) at placement time, so the two never disagree.
    """
    shape = offer_shape(node) if isinstance(node, Offer) else node
    reasons = _placement_reasons(shape, request)
    if request.gpu is not None and not gpu_model_matches(request.gpu, shape.gpu_name):
        reasons.append(f"gpu {shape.gpu_name or 'none'} is not {request.gpu}")
    if shape.gpu_count < request.gpus_per_node:
        reasons.append(f"{shape.gpu_count} GPUs < {request.gpus_per_node}")
    if request.gpus_per_node > 0 and shape.gpu_runtime_ok is False:
        reasons.append(f"GPU runtime not working: {shape.gpu_runtime_error or 'unknown error'}")
    minimums = (
        ("vcpus", shape.vcpus, request.min_vcpus),
        ("memory_gb", shape.memory_gb, request.min_memory_gb),
        ("disk_gb", shape.disk_gb, request.min_disk_gb),
    )
    for field, have, need in minimums:
        if need is not None and (have is None or have < need):
            reasons.append(f"{field} {have if have is not None else 'unknown'} < {need}")
    if shape.spot is not None and shape.spot != request.spot:
        reasons.append(
            "spot offer, on-demand asked" if shape.spot else "on-demand offer, spot asked"
        )
    return reasons


def _placement_reasons(shape: NodeShape, request: ResourceRequest) -> list[str]:
    """Provider and region allow/deny lists; they do not apply where the node has none."""
    reasons: list[str] = []
    if shape.provider is not None:
        if request.providers is not None and shape.provider not in request.providers:
            reasons.append(f"provider {shape.provider} is not in the allow-list")
        if shape.provider in request.denied_providers:
            reasons.append(f"provider {shape.provider} is denied")
    if shape.region is not None:
        if request.regions is not None and shape.region not in request.regions:
            reasons.append(f"region {shape.region} is not in the allow-list")
        if shape.region in request.denied_regions:
            reasons.append(f"region {shape.region} is denied")
    return reasons
