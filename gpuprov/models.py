"""The public, versioned payloads: JobSpec in, JobStatus out.

Users and other services depend on these names (docs/architecture.md, the public payloads): add
fields
with defaults, never rename. Every model rejects unknown fields so a typo is an error that names
the field, not a silently ignored setting.
"""

from __future__ import annotations

import json
import re
import tomllib
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from providers import PROVIDER_IDS
from providers.base import (
    Finding,
    Location,
    Model,
    NodeShape,
    Observed,
    Offer,
    PriceQuote,
    ResourceRequest,
    SshEndpoint,
    Verdict,
)
from providers.errors import BlockScope, ErrorKind

JOB_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
MAX_RESTARTS = 100
MAX_RUNTIME_SECONDS = 366 * 24 * 3600  # a year: within every Temporal timer

# Upper bounds of the spec's numbers and strings (docs/job-spec.md). The durations become
# Temporal timers, which take a protobuf Duration: an unbounded number (1e19) failed every
# workflow task of the job. The GPU name becomes the GpuprovGpu Keyword search attribute, which
# the server refuses past its size limit. The rest bounds what a sane fleet asks of one node.
MAX_PROVISIONING_TIMEOUT_SECONDS = 30 * 24 * 3600  # 30 days
MAX_HEALTH_CHECK_INTERVAL_SECONDS = 7 * 24 * 3600  # 7 days
MAX_GPU_NAME_LENGTH = 128
MAX_VCPUS = 4096
MAX_MEMORY_GB = 65_536.0  # 64 TiB
MAX_DISK_GB = 1_000_000.0  # 1 PB
MAX_HOURLY_COST = 1_000_000.0  # USD per hour, whole job
MAX_REGIONS = 64
MAX_REGION_LENGTH = 64
MAX_PROVIDERS = 16
MAX_IMAGE_LENGTH = 512
MAX_PORTS = 64
MAX_HEDGE_PARALLEL = 4


class Resources(Model):
    """What each node needs."""

    gpu: str | None = Field(default=None, min_length=1, max_length=MAX_GPU_NAME_LENGTH)
    gpus_per_node: int = Field(default=1, ge=0, le=64)
    min_vcpus: int | None = Field(default=None, ge=0, le=MAX_VCPUS)
    min_memory_gb: float | None = Field(default=None, ge=0, le=MAX_MEMORY_GB)
    min_disk_gb: float | None = Field(default=None, ge=0, le=MAX_DISK_GB)
    spot: bool = False


RegionName = Annotated[str, Field(min_length=1, max_length=MAX_REGION_LENGTH)]


class PlacementOrder(StrEnum):
    """The order offers are tried in (workflows/selection.py)."""

    PRICE = "price"  # cheapest known price first, ties on offer id
    READY_TIME = "ready_time"  # expected time to ready from the offer statistics, then price


class Hedge(Model):
    """Backup attempts: while the leading attempt has not made every node ready after
    `after_seconds`, the next offer's attempt starts beside it, up to `max_parallel` alive. The
    first attempt with every node ready wins; the others are torn down and not blocked."""

    max_parallel: int = Field(default=2, ge=2, le=MAX_HEDGE_PARALLEL)
    # "auto": the offering's p95 time to ready from the statistics, or half its provider's
    # boot timeout without statistics.
    after_seconds: float | Literal["auto"] = "auto"
    # USD the losing attempts may cost in all (price x nodes x billed time); once spent, no new
    # hedge starts. None: no bound (an unpriced offer is then hedged too).
    max_extra_cost: float | None = Field(default=None, gt=0, le=MAX_HOURLY_COST)

    @field_validator("after_seconds")
    @classmethod
    def _positive_delay(cls, value: float | str) -> float | str:
        if isinstance(value, float | int) and not 0 < value <= MAX_PROVISIONING_TIMEOUT_SECONDS:
            raise ValueError(
                f"must be 'auto' or a number of seconds in (0, {MAX_PROVISIONING_TIMEOUT_SECONDS}]"
            )
        return value


class Placement(Model):
    provisioning: bool = True  # False: existing workers only
    providers: list[str] | None = Field(default=None, max_length=MAX_PROVIDERS)  # allow-list
    regions: list[RegionName] | None = Field(default=None, max_length=MAX_REGIONS)  # allow-list
    order: PlacementOrder = PlacementOrder.PRICE
    hedge: Hedge | None = None
    # When every offer has failed for capacity or quota (or is blocked), wait for the earliest
    # block to lapse and try again, until provisioning_timeout_seconds; false: fail at once,
    # once every offer was tried (what a one-pass failover does).
    capacity_wait: bool = True

    @field_validator("providers")
    @classmethod
    def _known_providers(cls, providers: list[str] | None) -> list[str] | None:
        for provider in providers or []:
            if provider not in PROVIDER_IDS:
                known = ", ".join(PROVIDER_IDS)
                raise ValueError(f"unknown provider {provider!r} (known: {known})")
        return providers


class ReleasePolicy(StrEnum):
    TERMINATE_ON_COMPLETION = "terminate_on_completion"
    KEEP = "keep"


class Recovery(Model):
    """What a job with `run` does when a node is lost or reclaimed while the work runs."""

    # New attempts (fresh machines, the work started again on every node) after the first.
    max_restarts: int = Field(default=0, ge=0, le=MAX_RESTARTS)


ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# A team's name, as a job spec and an API key name it.
TEAM_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
DEFAULT_TEAM = "default"
# A secret's name in the vault, and how a spec's `env` refers to one: `${{ secrets.NAME }}`.
SECRET_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
SECRET_REFERENCE = re.compile(r"\$\{\{\s*secrets\.([A-Za-z_][A-Za-z0-9_]{0,127})\s*\}\}")
RESERVED_ENV_PREFIX = "GPUPROV_"
MAX_SCRIPT_CHARS = 64 * 1024


class JobSpec(Model):
    """A job: N nodes matching `resources`, placed per `placement`, released per `release`.

    With `run`, the job runs its work on every node and ends when the work ends everywhere;
    without it, the job is a lease: ready until someone releases it.
    """

    name: str = Field(pattern=JOB_NAME_PATTERN)  # workflow id is job-<name>
    # Whose job it is: its budget binds it, its keys may see and act on it.
    team: str = Field(default=DEFAULT_TEAM, pattern=TEAM_NAME_PATTERN)
    nodes: int = Field(default=1, ge=1, le=256)
    resources: Resources = Field(default_factory=Resources)
    placement: Placement = Field(default_factory=Placement)
    max_hourly_cost: float | None = Field(default=None, gt=0, le=MAX_HOURLY_COST)  # USD/hour
    provisioning_timeout_seconds: int = Field(
        default=1800, ge=1, le=MAX_PROVISIONING_TIMEOUT_SECONDS
    )
    release: ReleasePolicy = ReleasePolicy.TERMINATE_ON_COMPLETION
    # While ready, each machine's health (diagnosis + SSH probe) is checked this often and shown
    # in the status and the Temporal UI's current details; None turns it off.
    health_check_interval_seconds: int | None = Field(
        default=600, ge=1, le=MAX_HEALTH_CHECK_INTERVAL_SECONDS
    )
    # "k3s": node 0 runs the k3s server, the others join it as agents (machines reached over
    # SSH); the status says where the kubeconfig is.
    profile: Literal["k3s"] | None = None
    # The work: `setup` then `run` on every node (a non-login shell, its own process group);
    # the job completes when `run` exits 0 everywhere and fails on the first other exit.
    run: str | None = Field(default=None, min_length=1, max_length=MAX_SCRIPT_CHARS)
    setup: str | None = Field(default=None, min_length=1, max_length=MAX_SCRIPT_CHARS)
    env: dict[str, str] = Field(default_factory=dict, max_length=128)
    # The image every node boots, in its cloud's terms (an AMI, a GCE image, a container image:
    # docs/clouds/<id>.md), and TCP ports opened to it; a cloud that cannot do either is
    # refused at plan (Capabilities.unsupported).
    image: str | None = Field(default=None, min_length=1, max_length=MAX_IMAGE_LENGTH)
    ports: list[int] = Field(default_factory=list, max_length=MAX_PORTS)
    # Released when exceeded (counted from ready), whether the work still runs or not.
    max_runtime_seconds: int | None = Field(default=None, ge=1, le=MAX_RUNTIME_SECONDS)
    recovery: Recovery = Field(default_factory=Recovery)

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not re.fullmatch(ENV_NAME_PATTERN, name):
                raise ValueError(f"{name[:64]!r} is not an environment variable name")
            if name.upper().startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"{name}: names starting with {RESERVED_ENV_PREFIX} are gpuprov's")
            if len(value) > 4096 or "\x00" in value:
                raise ValueError(f"{name}: a value is at most 4096 characters, without NUL")
            if "${{" in SECRET_REFERENCE.sub("", value):
                raise ValueError(
                    f"{name}: a malformed secret reference; write ${{{{ secrets.NAME }}}}"
                )
        return env

    def secret_references(self) -> dict[str, list[str]]:
        """The secrets each `env` entry refers to, by variable name (those that refer to any)."""
        found = {name: SECRET_REFERENCE.findall(value) for name, value in self.env.items()}
        return {name: secrets for name, secrets in sorted(found.items()) if secrets}

    @field_validator("ports")
    @classmethod
    def _port_numbers(cls, ports: list[int]) -> list[int]:
        for port in ports:
            if not 1 <= port <= 65535:
                raise ValueError(f"{port} is not a TCP port (1-65535)")
        return ports

    @model_validator(mode="after")
    def _setup_needs_run(self) -> JobSpec:
        if self.setup is not None and self.run is None:
            raise ValueError("setup: needs run (setup prepares each node for the work)")
        return self

    @property
    def workflow_id(self) -> str:
        return workflow_id_for(self.name)

    def resource_request(self) -> ResourceRequest:
        return ResourceRequest(
            gpu=self.resources.gpu,
            gpus_per_node=self.resources.gpus_per_node,
            min_vcpus=self.resources.min_vcpus,
            min_memory_gb=self.resources.min_memory_gb,
            min_disk_gb=self.resources.min_disk_gb,
            spot=self.resources.spot,
            providers=self.placement.providers,
            regions=self.placement.regions,
            image=self.image,
            ports=self.ports,
        )


def workflow_id_for(job_name: str) -> str:
    return f"job-{job_name}"


class JobSpecError(ValueError):
    """A job spec that cannot be accepted; the message names every offending field."""


def format_validation_error(error: ValidationError) -> str:
    """One `where: what` per problem. A whole-model validator has no location of its own; its
    message starts with the field it is about ("setup: needs run"), so it is used as it is."""
    lines = []
    for problem in error.errors():
        cause = problem.get("ctx", {}).get("error")
        if not problem["loc"] and isinstance(cause, ValueError):
            lines.append(str(cause))
            continue
        where = ".".join(str(part) if part != "" else '""' for part in problem["loc"]) or "(spec)"
        lines.append(f"{where}: {problem['msg']}")
    return "; ".join(lines)


def parse_job_spec(data: Any) -> JobSpec:
    if not isinstance(data, dict):
        raise JobSpecError(f"a job spec must be a mapping, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        raise JobSpecError(f"invalid job spec: {format_validation_error(error)}") from None


# A spec is a few hundred bytes; the bound keeps `submit /dev/zero` from reading forever.
MAX_SPEC_FILE_BYTES = 1024 * 1024


def read_bounded_text(path: Path, limit: int) -> str:
    """The file's UTF-8 text; OSError when it is larger than `limit` bytes (or endless)."""
    with path.open("rb") as file:
        raw = file.read(limit + 1)
    if len(raw) > limit:
        raise OSError(f"larger than {limit // 1024} KiB")
    return raw.decode("utf-8")


def load_job_spec(path: str | Path) -> JobSpec:
    """Read a job spec from a .toml, .yaml/.yml or .json file."""
    path = Path(path)
    try:
        text = read_bounded_text(path, MAX_SPEC_FILE_BYTES)
    except OSError as error:
        raise JobSpecError(f"cannot read job spec {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise JobSpecError(f"job spec {path} is not UTF-8 text: {error.reason}") from None
    kind = {".toml": "toml", ".json": "json"}.get(path.suffix, "yaml")
    return parse_job_text(text, kind, f"job spec {path}")


def parse_job_text(text: str, kind: str, source: str = "job spec") -> JobSpec:
    """A job spec from its text: `kind` is "toml", "json" or "yaml"; `source` names it in the
    error of a malformed one."""
    try:
        if kind == "toml":
            data = tomllib.loads(text)
        elif kind == "json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as error:
        raise JobSpecError(f"malformed {source}: {error}") from None
    except RecursionError:
        raise JobSpecError(f"malformed {source}: nested too deeply") from None
    except ValueError as error:  # e.g. an integer past Python's digit limit
        raise JobSpecError(f"malformed {source}: {error}") from None
    return parse_job_spec(data)


def _text() -> Any:
    """An optional short string field (node-reported text is bounded)."""
    return Field(default=None, max_length=256)


class GpuInfo(Model):
    """One GPU as the node agent saw it (nvidia-smi)."""

    name: str = Field(max_length=256)
    memory_mb: int | None = Field(default=None, ge=0)
    driver_version: str | None = _text()
    uuid: str | None = _text()


class WorkerCapabilities(Model):
    """What a registered node reports about itself. Placement trusts this, not the offer."""

    gpus: list[GpuInfo] = Field(default_factory=list, max_length=64)
    driver_version: str | None = _text()
    cuda_version: str | None = _text()
    cpu_count: int | None = Field(default=None, ge=0)
    memory_gb: float | None = Field(default=None, ge=0)
    disk_gb: float | None = Field(default=None, ge=0)
    gpu_runtime_ok: bool = False  # a GPU is visible and the driver/library stack works
    gpu_runtime_error: str | None = Field(default=None, max_length=2000)
    agent_version: str | None = _text()
    # Where the node's peers reach it (its primary address as the agent sees it); a job's
    # GPUPROV_NODE_IPS and GPUPROV_MASTER_ADDR come from here.
    address: str | None = Field(default=None, max_length=64)

    def shape(self, provider: str | None = None, region: str | None = None) -> NodeShape:
        names = [gpu.name for gpu in self.gpus]
        most_common = max(set(names), key=names.count) if names else None
        return NodeShape(
            provider=provider,
            region=region,
            gpu_name=most_common,
            gpu_count=names.count(most_common) if most_common else 0,
            vcpus=self.cpu_count,
            memory_gb=self.memory_gb,
            disk_gb=self.disk_gb,
            gpu_runtime_ok=self.gpu_runtime_ok if (self.gpus or self.gpu_runtime_error) else None,
            gpu_runtime_error=self.gpu_runtime_error,
        )


def capabilities_text(capabilities: WorkerCapabilities) -> str:
    """One line: GPUs by model, driver/CUDA, CPUs, memory, disk, and the runtime verdict."""
    names = [gpu.name for gpu in capabilities.gpus]
    gpus = ", ".join(f"{names.count(name)} x {name}" for name in dict.fromkeys(names)) or "no GPU"
    parts = [gpus]
    if capabilities.driver_version:
        parts.append(f"driver {capabilities.driver_version}")
    if capabilities.cuda_version:
        parts.append(f"CUDA {capabilities.cuda_version}")
    for value, unit in (
        (capabilities.cpu_count, "CPUs"),
        (capabilities.memory_gb, "GiB memory"),
        (capabilities.disk_gb, "GiB disk"),
    ):
        if value is not None:
            parts.append(f"{value:g} {unit}")
    verdict = (
        "GPU runtime OK"
        if capabilities.gpu_runtime_ok
        else f"GPU runtime NOT OK: {capabilities.gpu_runtime_error}"
    )
    return f"{'; '.join(parts)}; {verdict}"


class WorkerRegistration(Model):
    """The Update the API sends a job when its node registers: ids and capabilities only,
    never the token (accepted Update arguments are stored in history)."""

    vm: str
    worker_id: str
    capabilities: WorkerCapabilities


class ExistingWorker(Model):
    """An existing (operator-joined) worker reserved for a job instead of a cloud machine."""

    worker_id: str
    label: str | None = None
    capabilities: WorkerCapabilities


class WorkerSummary(Model):
    """One worker as the API, the SDK and `gpuprov workers` show it: never a secret."""

    id: str
    origin: str  # managed / existing
    state: str  # idle / reserved / busy / revoked
    job: str | None
    provider: str | None
    region: str | None
    label: str | None
    vm: str | None
    registered_at: datetime
    updated_at: datetime  # the last change of state or job
    gpu: str | None  # the most common GPU model, if any
    gpu_count: int
    gpu_runtime_ok: bool | None  # None: no GPU and no verdict
    capabilities: str  # one line: GPUs, driver/CUDA, CPUs, memory, disk, runtime verdict
    liveness: str = "alive"  # alive / lost
    last_seen_at: datetime | None = None  # the last heartbeat (or the registration)
    heartbeats: int = 0
    health: str = "healthy"  # healthy / unhealthy: the agent's latest GPU verdict
    health_detail: str | None = None  # why unhealthy, in nvidia-smi's or CUDA's words
    draining: bool = False  # no new reservations


class WorkerList(Model):
    workers: list[WorkerSummary]


NOTICE_KINDS = ("reclaim", "maintenance", "rebalance")
# A GCE maintenance that stops the machine: GPU machines cannot live-migrate, so it ends the
# work as surely as a reclaim does.
STOPPING_MAINTENANCE = "TERMINATE_ON_HOST_MAINTENANCE"


class NodeNotice(Model):
    """What the cloud told a node about its machine through instance metadata, as the node's
    agent reports it in its heartbeats: EC2's spot instance-action, rebalance recommendation
    and scheduled events; GCE's preempted flag and maintenance event."""

    kind: Literal["reclaim", "maintenance", "rebalance"]
    source: Literal["ec2", "gce"]
    action: str = Field(max_length=64)  # the cloud's own word: terminate, system-reboot, ...
    deadline: datetime | None = None  # when the cloud acts, where it says
    detail: str = Field(default="", max_length=300)

    @property
    def ends_the_machine(self) -> bool:
        """A reclaim, or a maintenance that stops the machine: the work cannot go on there."""
        return self.kind == "reclaim" or self.action == STOPPING_MAINTENANCE


class WorkerLiveness(Model):
    """One worker of a job as the database says now (the `job_workers` step): the job reads it
    when the liveness sweep wakes it with the `workers_changed` signal."""

    worker_id: str
    vm: str | None = None  # a managed node's VM identity; None for an existing worker
    origin: str  # managed / existing
    state: str  # idle / reserved / busy / revoked
    liveness: str  # alive / lost
    health: str  # healthy / unhealthy
    detail: str | None = None  # why unhealthy, in nvidia-smi's or CUDA's words
    last_seen_at: datetime | None = None
    # Past this, the node has stopped its work even if it heard nothing more from the API: its
    # last lease plus the stop grace period (None: it never heartbeat with a lease).
    work_ends_by: datetime | None = None
    notice: NodeNotice | None = None  # the cloud's latest notice about its machine


class JobState(StrEnum):
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    READY = "ready"
    RUNNING = "running"  # the job's `run` executes on its nodes
    RELEASING = "releasing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


class AttemptOutcome(StrEnum):
    IN_PROGRESS = "in_progress"
    FAILED = "failed"
    SUCCEEDED = "succeeded"  # the job ran on it
    ABANDONED = "abandoned"  # cancelled or timed out before it was ready
    LOST_RACE = "lost_race"  # a hedged attempt that another one beat: torn down, not blocked


class Attempt(Model):
    """One offer tried: its outcome, and on failure the ErrorKind and the cloud's own words."""

    number: int
    offer: Offer
    outcome: AttemptOutcome = AttemptOutcome.IN_PROGRESS
    step: str | None = None  # the primitive that failed
    kind: ErrorKind | None = None
    message: str | None = None
    hedge: bool = False  # started beside a slower attempt (placement.hedge)
    started_at: datetime | None = None
    ended_at: datetime | None = None  # ready, failed, or torn down after losing
    # What a losing attempt cost: its quote x nodes x the time it ran, by the provider's terms.
    cost: PriceQuote | None = None

    def describe(self) -> str:
        where = f"{self.offer.id} ({self.offer.provider}/{self.offer.region})"
        if self.kind is None:
            return f"#{self.number} {where}: {self.outcome.value}"
        return f"#{self.number} {where}: {self.kind.value} at {self.step}: {self.message}"


def offering_key(provider: str, region: str, instance_type: str, spot: bool) -> str:
    """What the offer statistics are kept per: an instance type in a region of a provider,
    spot or not (zones and offer ids may change between plans; the offering does not)."""
    return f"{provider}/{region}/{instance_type}{':spot' if spot else ''}"


def offering_of(offer: Offer) -> str:
    return offering_key(offer.provider, offer.region, offer.instance_type, offer.spot)


class AttemptRecord(Model):
    """One attempt's outcome, kept per offering (the offer statistics; docs/offers.md)."""

    offering: str  # offering_key(...)
    provider: str
    region: str
    instance_type: str
    spot: bool = False
    job: str
    run: str | None = None
    attempt: int
    nodes: int = Field(default=1, ge=1)
    # ready: every node ready; failed: `kind` at `step`; lost_race: beaten by a hedged attempt;
    # abandoned: cancelled or timed out before it was ready.
    outcome: Literal["ready", "failed", "lost_race", "abandoned"]
    kind: ErrorKind | None = None
    step: str | None = None
    started_at: datetime
    ended_at: datetime
    seconds_to_ready: float | None = Field(default=None, ge=0)  # create to every node ready


class OfferStats(Model):
    """An offering's recent record: how often attempts on it made every node ready, and how
    long that took (over the retention window, the newest attempts first)."""

    offering: str
    provider: str
    region: str
    instance_type: str
    spot: bool = False
    attempts: int = 0  # ready + failed (lost races and abandoned attempts say nothing of it)
    ready: int = 0
    capacity_failures: int = 0  # failed with Capacity or Quota
    other_failures: int = 0
    success_share: float | None = None  # ready / attempts; None without attempts
    ready_p50_seconds: float | None = None
    ready_p95_seconds: float | None = None
    last_capacity_failure_at: datetime | None = None
    last_attempt_at: datetime | None = None


class NodeInstance(Model):
    """One node of one attempt: the VM identity, what carries it, and how it ended."""

    attempt: int
    node_index: int
    vm: str
    provider: str
    region: str
    zone: str | None = None
    instance_ids: list[str] = Field(default_factory=list)
    # requested / running / terminated / kept / leaked / not_created (failed before any id)
    status: str = "requested"
    ssh: SshEndpoint | None = None
    worker_id: str | None = None  # set when the node registered through the API
    capabilities: WorkerCapabilities | None = None

    @property
    def location(self) -> Location:
        return Location(provider=self.provider, region=self.region, zone=self.zone)

    def record_observed(self, observed: list[Observed]) -> None:
        self.instance_ids = [instance.id for instance in observed]
        self.ssh = next((o.ssh for o in observed if o.ssh is not None), None)


class Block(Model):
    """An offer, region or provider not to try again, and the error that caused it."""

    scope: BlockScope
    key: str  # offer id, "provider/region" or provider id
    kind: ErrorKind
    message: str
    # When the shared block (database) lapses; None for a block this job set itself this run.
    expires_at: datetime | None = None

    def covers(self, offer: Offer) -> bool:
        if self.scope is BlockScope.OFFER:
            return self.key == offer.id
        if self.scope is BlockScope.REGION:
            return self.key == f"{offer.provider}/{offer.region}"
        return self.key == offer.provider


class HealthReport(Model):
    """One VM's health: the provider's diagnosis plus an SSH probe of the node."""

    vm: str
    verdict: Verdict
    findings: list[Finding] = Field(default_factory=list)
    checked_at: datetime | None = None


class WorkState(StrEnum):
    ASSIGNED = "assigned"  # waiting for the node's agent to pick it up
    STARTED = "started"  # setup or run is executing
    EXITED = "exited"  # run (or setup) ended by itself: see exit_code
    STOP_REQUESTED = "stop_requested"  # release or cancel: SIGTERM, grace, SIGKILL
    STOPPED = "stopped"  # ended by a stop request
    ABANDONED = "abandoned"  # its attempt was given up (a node lost); never started again

    @property
    def final(self) -> bool:
        return self in (WorkState.EXITED, WorkState.STOPPED, WorkState.ABANDONED)


class NodeWork(Model):
    """One node's part of the run, as the control plane last recorded it."""

    rank: int
    vm: str | None = None
    worker_id: str
    state: WorkState
    exit_code: int | None = None
    tail: str | None = Field(default=None, max_length=4096)  # the last lines of its output
    lease_lapsed: bool = False  # the node stopped it: cut off from the API past its lease


class Restart(Model):
    """A new attempt because a node was lost or reclaimed while the work ran."""

    number: int  # 1 for the first restart
    at: datetime
    cause: str


class JobStatus(Model):
    """Everything the status query answers: where the job is, what it tried, what it holds."""

    name: str
    team: str | None = None  # the spec's team, once accepted
    # The run of the name (gpuprov/store/runs.py): every row this run wrote carries it, and
    # `gpuprov status|logs|cost NAME --run RUN` shows an earlier run by it.
    run: str | None = None
    state: JobState = JobState.QUEUED
    waiting_for: str | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    nodes: list[NodeInstance] = Field(default_factory=list)
    existing_workers: list[ExistingWorker] = Field(default_factory=list)
    blocks: list[Block] = Field(default_factory=list)
    rejected_offers: list[str] = Field(default_factory=list)  # "offer: reason"
    hourly_cost: PriceQuote | None = None  # whole job, from the winning offer's quote
    error: str | None = None
    leaks: list[str] = Field(default_factory=list)  # teardown steps that did not confirm
    health: list[HealthReport] = Field(default_factory=list)  # latest check per node, when ready
    kubeconfig: str | None = None  # k3s profile: "user@host:/path" of the kubeconfig on node 0
    workers: list[WorkerLiveness] = Field(default_factory=list)  # liveness, as last read
    work: list[NodeWork] = Field(default_factory=list)  # the run's state on each node, now
    restarts: list[Restart] = Field(default_factory=list)  # each new attempt after a lost node
    ready_at: datetime | None = None  # first ready: max_runtime_seconds counts from here
    # After a restart: the new attempt's work starts no earlier, so that an old node that may
    # still hold a lease (cut off, its teardown not confirmed) has stopped its work by then.
    work_waits_until: datetime | None = None
    # Why a job that ended without failing ended: its work ended everywhere, `release`,
    # `max_runtime_seconds` (with when it was reached), a cancel.
    ended_because: str | None = None
    # What the job was allowed on despite: its team past its monthly budget (on_exceed: warn).
    warnings: list[str] = Field(default_factory=list)

    @property
    def workflow_id(self) -> str:
        return workflow_id_for(self.name)

    def live_nodes(self) -> list[NodeInstance]:
        return [node for node in self.nodes if node.status in ("requested", "running", "kept")]


class TeamSpend(Model):
    """A team's month so far, against its budget."""

    team: str
    month_start: datetime
    spent_usd: float  # actuals of machines gone this month, plus what held ones accrued
    accruing_usd_per_hour: float  # the held machines' quotes together
    other_currencies: dict[str, float]  # spent in quotes gpuprov does not convert
    gpus_held: int
    monthly_budget_usd: float | None
    max_gpus: int | None
    on_exceed: str

    @property
    def left_usd(self) -> float | None:
        if self.monthly_budget_usd is None:
            return None
        return self.monthly_budget_usd - self.spent_usd

    @property
    def gpus_free(self) -> int | None:
        return None if self.max_gpus is None else self.max_gpus - self.gpus_held
