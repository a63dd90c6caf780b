"""The seeded fault plan and the worker's gpuprov.toml.

Every fault is a `FaultRule` of the fake cloud (gpuprov/config.py), so it is injected by the
cloud the worker talks to, counted in the cloud's state file, and survives worker restarts (the
rule's `after`/`times` counters live in that file too).

Coverage: whatever N, the plan holds an `error` rule for every ErrorKind, each on a different
primitive (a random pairing of the seven kinds with the seven primitives), plus one rule of each
other effect (lost_response, boot_failed, boot_hang, bad_runtime, delay). Further rules are
drawn at random until there are about `density` rules per job. A planned rule is not an
injected fault: one aimed at a job that never reaches its step never fires, so the summary
reports coverage from the cloud's ledger of the rules that fired.

Targeting: job-scoped rules name a VM prefix. prepare/create and the create effects hit the
job's first attempt only (`<job>-a1-`), so failing over to another offer can still succeed;
observe/delete/cleanup hit any attempt (`<job>-a`) but only once or twice (`times`), so a
teardown can still finish. plan and list calls carry no VM: their rules are global and fire on
the `after`-th call (one plan call per job; list calls run at about 1/poll_interval per region
while anything waits), whichever job makes it.

lost_response uses only the kinds a lost answer really has (Transient: a timeout; Failed: a 5xx
after the instance landed). An `error` rule creates nothing, so every kind is fair there.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprov.config import FaultRule, JobsSettings, WorkersSettings
from providers.errors import ErrorKind

PRIMITIVES = ("plan", "prepare", "create", "observe", "list", "delete", "cleanup")
GLOBAL_PRIMITIVES = ("plan", "list")  # calls that name no VM
CREATE_EFFECTS = ("lost_response", "boot_failed", "boot_hang", "bad_runtime")
# Abort kinds end a job outright; keep them rarer than the kinds that fail over.
KIND_WEIGHTS = {
    ErrorKind.TRANSIENT: 3.0,
    ErrorKind.CAPACITY: 2.0,
    ErrorKind.QUOTA: 1.0,
    ErrorKind.UNAVAILABLE: 2.0,
    ErrorKind.FAILED: 2.0,
    ErrorKind.INVALID_REQUEST: 0.5,
    ErrorKind.CREDENTIALS: 0.5,
}
EFFECT_WEIGHTS = {
    "error": 55.0,
    "lost_response": 10.0,
    "boot_failed": 8.0,
    "boot_hang": 6.0,
    "bad_runtime": 8.0,
    "delay": 13.0,
}
ERROR_PRIMITIVE_WEIGHTS = {
    "plan": 0.5,
    "prepare": 2.0,
    "create": 3.0,
    "observe": 1.0,
    "list": 0.7,
    "delete": 2.0,
    "cleanup": 1.5,
}
LOST_RESPONSE_KINDS = (ErrorKind.TRANSIENT, ErrorKind.FAILED)

# The fake cloud the worker runs: two regions, three offers, cheapest first:
# fake/r1-a/gpu8 (10), fake/r1-b/gpu8 (10), fake/r2-a/gpu8 (12).
REGIONS = (("r1", ("r1-a", "r1-b")), ("r2", ("r2-a",)))


@dataclass(frozen=True)
class Timings:
    boot_delay: float = 1.0
    delete_delay: float = 0.3
    poll_interval: float = 0.25
    boot_timeout: float = 8.0  # short: boot_hang and lost registrations fail over quickly
    delete_timeout: float = 20.0
    block_ttl: int = 2  # shared blocks expire fast, so one stockout does not fail every job
    # A stockout's block backs off per offering: as fast here, doubling to a few seconds.
    capacity_backoff: int = 2
    capacity_backoff_max: int = 8
    launch_probe_window: int = 2
    # Liveness, for the API the harness serves and the worker's sweep: a node silent for
    # `lost_after` is lost by the next sweep. Its lease (how long a cut-off node's work may run
    # on) outlasts that, the failed teardown (three delete rounds) and the next placement
    # together, which take 20-35 s on a loaded machine: so the fence (lease + stop grace +
    # FENCE_MARGIN 10 s after its last heartbeat reached the API) is what keeps a restarted
    # job's epochs apart, not the time a restart takes anyway.
    heartbeat_interval: float = 2.0
    lost_after: float = 10.0
    lease: float = 60.0
    stop_grace: float = 2.0
    sweep_every: int = 2

    def workers(self) -> WorkersSettings:
        return WorkersSettings(
            heartbeat_interval_seconds=self.heartbeat_interval,
            lost_after_seconds=self.lost_after,
            lease_seconds=self.lease,
            sweep_every_seconds=self.sweep_every,
        )

    def jobs(self) -> JobsSettings:
        return JobsSettings(
            block_ttl_seconds=self.block_ttl,
            stop_grace_seconds=self.stop_grace,
            capacity_backoff_seconds=self.capacity_backoff,
            capacity_backoff_max_seconds=self.capacity_backoff_max,
            launch_probe_window_seconds=self.launch_probe_window,
        )


@dataclass(frozen=True)
class PlannedFault:
    rule: FaultRule
    job: str | None  # the job it targets; None for a global (plan/list) rule
    coverage: bool = False  # part of the every-kind deck
    aid: bool = False  # makes a cancel point long enough to be seen (chaos/cancels.py)
    role: bool = False  # what a job's role is made of (a partitioned node: chaos/mix.py)

    def describe(self) -> str:
        rule = self.rule
        what = rule.effect if rule.effect != "error" else f"error {rule.kind.value}"
        if rule.effect == "lost_response":
            what = f"lost_response {rule.kind.value}"
        if rule.effect in ("delay", "partitioned"):
            what = f"{rule.effect} {rule.delay_seconds:g}s"
        where = rule.vm or f"call #{rule.after + 1}"
        if rule.region:
            where += f" in {rule.region}"
        times = f" x{rule.times}" if rule.times else ""
        aid = " (to see a cancel point)" if self.aid else ""
        aid += " (its role)" if self.role else ""
        return f"{what} at {rule.primitive} ({where}){times}{aid}"


@dataclass
class FaultPlan:
    faults: list[PlannedFault]

    def rules(self) -> list[FaultRule]:
        return [fault.rule for fault in self.faults]

    def for_job(self, job: str) -> list[PlannedFault]:
        return [fault for fault in self.faults if fault.job == job]

    def by_effect(self) -> Counter[str]:
        return Counter(fault.rule.effect for fault in self.faults)

    def by_primitive(self) -> Counter[str]:
        return Counter(fault.rule.primitive for fault in self.faults)

    def error_kinds(self) -> Counter[str]:
        return Counter(
            fault.rule.kind.value
            for fault in self.faults
            if fault.rule.effect in ("error", "lost_response")
        )


def _weighted(rng: random.Random, weights: dict[Any, float]) -> Any:
    keys = list(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys])[0]


class _Planner:
    def __init__(self, rng: random.Random, jobs: list[str], window: float, timings: Timings):
        self.rng = rng
        self.jobs = jobs
        self.window = window
        self.timings = timings
        self._deal: list[str] = []

    def next_job(self) -> str:
        """Jobs for targeted rules, dealt from a shuffled deck so they spread evenly."""
        if not self._deal:
            self._deal = list(self.jobs)
            self.rng.shuffle(self._deal)
        return self._deal.pop()

    def rule(self, primitive: str, effect: str, kind: ErrorKind, *, coverage: bool = False):
        rng = self.rng
        fields: dict[str, Any] = {"primitive": primitive, "effect": effect, "kind": kind}
        fields["message"] = f"chaos: injected {effect} {kind.value} at {primitive}"
        if effect == "delay":
            fields["delay_seconds"] = round(rng.uniform(0.5, 3.0), 2)
        job = None
        if primitive == "plan":
            fields["after"] = rng.randrange(len(self.jobs))  # one plan call per job
            fields["times"] = 1
        elif primitive == "list":
            fields["region"] = rng.choice(REGIONS)[0]
            calls = max(10, int(self.window / self.timings.poll_interval))
            fields["after"] = rng.randrange(calls)
            fields["times"] = rng.randint(1, 2)
        else:
            job = self.next_job()
            first_attempt = primitive in ("prepare", "create")
            fields["vm"] = f"{job}-a1-" if first_attempt else f"{job}-a"
            fields["times"] = 1 if first_attempt else rng.randint(1, 2)
        return PlannedFault(FaultRule(**fields), job, coverage)

    def coverage_deck(self) -> list[PlannedFault]:
        kinds = list(ErrorKind)
        primitives = list(PRIMITIVES)
        self.rng.shuffle(primitives)
        deck = [
            self.rule(primitive, "error", kind, coverage=True)
            for kind, primitive in zip(kinds, primitives, strict=True)
        ]
        for effect in CREATE_EFFECTS:
            kind = self.rng.choice(LOST_RESPONSE_KINDS) if effect == "lost_response" else None
            deck.append(self.rule("create", effect, kind or ErrorKind.TRANSIENT, coverage=True))
        anywhere = self.rng.choice(PRIMITIVES)
        deck.append(self.rule(anywhere, "delay", ErrorKind.TRANSIENT, coverage=True))
        return deck

    def random_fault(self) -> PlannedFault:
        effect = _weighted(self.rng, EFFECT_WEIGHTS)
        if effect == "error":
            primitive = _weighted(self.rng, ERROR_PRIMITIVE_WEIGHTS)
            return self.rule(primitive, "error", _weighted(self.rng, KIND_WEIGHTS))
        if effect == "delay":
            return self.rule(self.rng.choice(PRIMITIVES), "delay", ErrorKind.TRANSIENT)
        kind = self.rng.choice(LOST_RESPONSE_KINDS) if effect == "lost_response" else None
        return self.rule("create", effect, kind or ErrorKind.TRANSIENT)


def plan_faults(
    rng: random.Random, jobs: list[str], window: float, timings: Timings, density: float = 1.0
) -> FaultPlan:
    """The coverage deck, then random rules up to about `density` per job."""
    planner = _Planner(rng, jobs, window, timings)
    faults = planner.coverage_deck()
    while len(faults) < round(density * len(jobs)):
        faults.append(planner.random_fault())
    return FaultPlan(faults)


# ---------------------------------------------------------------- the worker's gpuprov.toml


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def worker_config(
    path: Path,
    *,
    temporal_address: str,
    task_queue: str,
    database_url: str,
    api_port: int,
    state_path: Path,
    timings: Timings,
    faults: list[FaultRule],
) -> None:
    regions = ", ".join(
        f"{{ name = {_toml_value(name)}, zones = [{', '.join(_toml_value(z) for z in zones)}] }}"
        for name, zones in REGIONS
    )
    gpu8 = 'gpu = "H100", gpu_count = 8, vcpus = 64, memory_gb = 512, disk_gb = 1000'
    lines = [
        "# written by the chaos harness (chaos/faults.py)",
        "[temporal]",
        f"address = {_toml_value(temporal_address)}",
        f"task_queue = {_toml_value(task_queue)}",
        "",
        "[database]",
        f"url = {_toml_value(database_url)}",
        "",
        "[api]",
        'host = "127.0.0.1"',
        f"port = {api_port}",
        "",
        "[jobs]",
        f"block_ttl_seconds = {timings.block_ttl}",
        f"stop_grace_seconds = {timings.stop_grace!r}",
        f"capacity_backoff_seconds = {timings.capacity_backoff}",
        f"capacity_backoff_max_seconds = {timings.capacity_backoff_max}",
        f"launch_probe_window_seconds = {timings.launch_probe_window}",
        "",
        "[workers]",
        f"heartbeat_interval_seconds = {timings.heartbeat_interval!r}",
        f"lost_after_seconds = {timings.lost_after!r}",
        f"lease_seconds = {timings.lease!r}",
        f"sweep_every_seconds = {timings.sweep_every}",
        "",
        "[providers.fake]",
        f"boot_delay_seconds = {timings.boot_delay!r}",
        f"delete_delay_seconds = {timings.delete_delay!r}",
        f"poll_interval = {timings.poll_interval!r}",
        f"boot_timeout = {timings.boot_timeout!r}",
        f"delete_timeout = {timings.delete_timeout!r}",
        "simulate_agent = true",
        # The harness plays the nodes' work itself (chaos/nodes.py): exits, kills and stops
        # at planned moments. The simulated agent running the command too would race it.
        "run_work = false",
        f"state_path = {_toml_value(state_path)}",
        f"regions = [{regions}]",
        "instance_types = [",
        f'  {{ name = "gpu8", price = 10.0, regions = ["r1"], {gpu8} }},',
        f'  {{ name = "gpu8", price = 12.0, regions = ["r2"], {gpu8} }},',
        "]",
    ]
    for rule in faults:
        lines += ["", "[[providers.fake.faults]]"]
        for key, value in rule.model_dump(mode="json", exclude_defaults=True).items():
            lines.append(f"{key} = {_toml_value(value)}")
    # `primitive` has no default, so it is always written; `kind` Transient is the default.
    path.write_text("\n".join(lines) + "\n")
