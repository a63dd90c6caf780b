"""The `[providers.fake]` section: the fake cloud's catalogue, timings and fault rules."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from providers.base import Billing, Model
from providers.errors import ErrorKind
from providers.settings import ProviderSettings


class FakeRegion(Model):
    name: str
    zones: list[str] = Field(default_factory=list)


class FakeInstanceType(Model):
    name: str
    gpu: str | None = None
    gpu_count: int = Field(default=0, ge=0)
    gpu_memory_gb: float | None = None
    vcpus: int | None = None
    memory_gb: float | None = None
    disk_gb: float | None = None
    price: float | None = Field(default=None, ge=0)  # USD/hour; None = the cloud shows none
    spot_price: float | None = Field(default=None, ge=0)  # also offered as spot when set
    regions: list[str] | None = None  # None = every region


FakePrimitive = Literal[
    "plan", "prepare", "create", "observe", "list", "list_side", "delete", "cleanup"
]
FaultEffect = Literal[
    "error",
    "lost_response",
    "boot_failed",
    "boot_hang",
    "bad_runtime",
    "no_agent",
    "gpu_lost",
    "ecc_error",
    "gpu_missing",
    "delay",
    "lands_late",
    "partitioned",
]
# Effects on the node's GPUs, noticed by its agent's heartbeats `delay_seconds` after boot.
GPU_FAULTS = ("gpu_lost", "ecc_error", "gpu_missing")
AgentMode = Literal["none", "simulated", "real"]


class FaultRule(Model):
    """Inject a failure into the fake cloud.

    A rule matches calls of `primitive` (optionally narrowed to a region, an offer id or a VM
    name prefix); it skips the first `after` matching calls and fires on the next `times` (None:
    on every one). Effects:
    - error: raise ProviderError(kind, message); nothing is created.
    - lost_response (create): the instance is created, then the call raises `kind`
      (Transient by default) as if the response were lost.
    - boot_failed (create): the instance is created and boots into Failed.
    - boot_hang (create): the instance is created and never leaves Pending.
    - bad_runtime (create): the instance boots, but its agent reports a broken GPU runtime.
    - no_agent (create): the instance boots, but its agent never registers (a bad image).
    - gpu_lost / ecc_error / gpu_missing (create): the instance boots healthy; `delay_seconds`
      after boot one GPU falls off the bus (Xid 79), has an uncorrectable ECC error (Xid 48), or
      vanishes from nvidia-smi's list, and the agent's heartbeats say so.
    - partitioned (create): the instance boots and its agent registers and heartbeats as
      usual; `delay_seconds` after it registered (or sooner, at the moment a test or the chaos
      harness chooses: `FakeCloudState.cut_off`), it is cut off from the API for good (nothing
      it sends arrives any more) while the machine runs on. It keeps the lease rule of the real
      agent: the work it holds stops once the lease of the last heartbeat answered (counted
      from when it was sent) and the stop grace period are over, and the ledger says when
      (`FakeCloudState.agent_leases`). Pair it with a `delete` rule on the same VM prefix to
      keep the machine running after its job gave it up.
    - delay: the call sleeps `delay_seconds`, then proceeds normally (a slow API).
    - lands_late (prepare, create): the call takes `delay_seconds` and is then carried out even
      if its caller stopped waiting meanwhile (a request that reached the cloud, its answer
      lost to the caller's timeout or cancel).
    """

    primitive: FakePrimitive
    kind: ErrorKind = ErrorKind.TRANSIENT
    message: str = "injected fault"
    effect: FaultEffect = "error"
    region: str | None = None
    offer: str | None = None
    vm: str | None = None  # prefix of the VM name
    after: int = Field(default=0, ge=0)
    times: int | None = Field(default=None, ge=1)
    delay_seconds: float = Field(default=0.0, ge=0)


class FakeProviderConfig(ProviderSettings):
    """The deterministic fake cloud: catalogue, timings, fault rules, optional state file."""

    regions: list[FakeRegion] = Field(
        default_factory=lambda: [FakeRegion(name="us-east-1", zones=["us-east-1a"])]
    )
    instance_types: list[FakeInstanceType] = Field(
        default_factory=lambda: [
            FakeInstanceType(
                name="h100x8",
                gpu="H100",
                gpu_count=8,
                gpu_memory_gb=80,
                vcpus=208,
                memory_gb=1800,
                disk_gb=2000,
                price=23.92,
            )
        ]
    )
    boot_delay_seconds: float = Field(default=2.0, ge=0)
    delete_delay_seconds: float = Field(default=0.5, ge=0)
    call_latency_seconds: float = Field(default=0.0, ge=0)
    poll_interval: float = Field(default=0.5, gt=0)
    boot_timeout: float = Field(default=60.0, gt=0)
    delete_timeout: float = Field(default=30.0, gt=0)
    state_path: str | None = None  # SQLite file; None keeps the cloud in memory
    ssh_host: str = "127.0.0.1"
    ssh_port: int = 22
    # Booted instances run a simulated node agent that registers through the control-plane
    # API with the join token they were given, then heartbeats; jobs wait for the registration.
    simulate_agent: bool = False
    # What runs on a booted instance: nothing, the simulated agent, or the real node agent
    # (agent.pyz `run`) as a local process (providers/fake/node.py). None: "simulated"
    # with simulate_agent, else "none".
    agent: AgentMode | None = None
    # The simulated agent runs the work a job gives its node (/bin/sh, locally); false leaves
    # the work rows to a test that plays the nodes itself.
    run_work: bool = True
    # The real agent's per-instance roots (None: a temporary directory per cloud object), and
    # the captured nvidia-smi outputs its stub replays (None: providers/fake/nvidia_smi/).
    agent_root: str | None = None
    nvidia_smi_fixtures: str | None = None
    # The real agent watches a metadata server as EC2's or GCE's machines do (`--notices`),
    # at `notices_url` (a test's server on loopback): a reclaim notice is seen on the node.
    notices: Literal["none", "ec2", "gce"] = "none"
    notices_url: str | None = None
    faults: list[FaultRule] = Field(default_factory=list)
    # What this fake declares it cannot do (Capabilities.unsupported, e.g. ["image", "ports"]):
    # the core then refuses its offers to a job asking for it, as it would a real cloud's.
    unsupported: list[str] = Field(default_factory=list)
    # How its simulated machines are billed: exact seconds unless set (`[providers.fake.billing]
    # granularity_seconds = 60`, `minimum_seconds = 60`), so tests can exercise any cloud's terms.
    billing: Billing = Field(default_factory=Billing)

    @model_validator(mode="after")
    def _one_agent_mode(self) -> FakeProviderConfig:
        if self.simulate_agent and self.agent not in (None, "simulated"):
            raise ValueError(f"simulate_agent = true contradicts agent = {self.agent!r}")
        return self

    @property
    def agent_mode(self) -> AgentMode:
        if self.agent is not None:
            return self.agent
        return "simulated" if self.simulate_agent else "none"
