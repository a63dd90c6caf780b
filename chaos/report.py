"""What a chaos run found: the checks (any failure makes the exit status non-zero), the findings
worth reading (never fatal on their own), and the summary as text and as markdown."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Check:
    name: str
    ok: bool
    value: str
    detail: list[str] = field(default_factory=list)  # what went wrong, precisely


@dataclass(frozen=True)
class ResolvedOrphan:
    """An orphan record the reconcile pass closed, and what the cloud's ledger showed of its VM
    around the pass."""

    vm: str
    machines_before: tuple[str, ...]  # instance ids live before the pass
    side_before: bool  # side resources live before the pass
    gone_after: bool  # neither left after it

    @property
    def machine_removed(self) -> bool:
        return bool(self.machines_before) and self.gone_after

    def describe(self) -> str:
        if self.machines_before:
            seen = f"machine {', '.join(self.machines_before)} live before the pass"
        elif self.side_before:
            seen = "side resources only live before the pass"
        else:
            seen = "nothing live before the pass"
        return f"{self.vm}: {seen}; {'gone' if self.gone_after else 'STILL LIVE'} after"


@dataclass
class JobOutcome:
    name: str
    nodes: int
    state: str  # completed / failed / cancelled / open (still running at the deadline) / ...
    faults: list[str]  # the rules that target it
    error: str | None = None
    leaks: list[str] = field(default_factory=list)
    attempts: list[str] = field(default_factory=list)
    released: bool = False
    cancel: str | None = None  # what happened to the cancel sent to it, if any
    waiting_for: str | None = None
    role: str = "lease"  # what the job is (chaos/mix.py)
    notes: list[str] = field(default_factory=list)  # what the harness saw of it


@dataclass
class Summary:
    command: str
    seed: int
    jobs_requested: int
    kills_requested: int
    restarts_requested: int
    elapsed: float = 0.0
    jobs: list[JobOutcome] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    kills_done: int = 0
    restarts_done: int = 0
    unplanned_worker_exits: int = 0
    rpc_retries: int = 0
    fault_rules: int = 0
    fault_rules_fired: int = 0
    fault_hits: int = 0  # calls that a rule fired on
    faults_by_effect: dict[str, int] = field(default_factory=dict)  # planned rules
    # rules that fired (the cloud's ledger), by effect, primitive and ErrorKind
    fired_by_effect: dict[str, int] = field(default_factory=dict)
    fired_by_primitive: dict[str, int] = field(default_factory=dict)
    fired_kinds: dict[str, int] = field(default_factory=dict)
    deck_size: int = 0  # rules of the every-kind deck
    deck_not_fired: list[str] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)  # cloud calls by primitive
    vms: int = 0
    creates_max: int = 0
    live_before_reconcile: list[str] = field(default_factory=list)
    side_before_reconcile: list[str] = field(default_factory=list)
    orphans_before_reconcile: list[str] = field(default_factory=list)
    # per orphan record the pass closed: what the ledger showed of its VM before and after
    orphans_resolved: list[ResolvedOrphan] = field(default_factory=list)
    reconcile: str = "not run"
    reconcile_detail: list[str] = field(default_factory=list)
    live_after: list[str] = field(default_factory=list)
    open_work: list[str] = field(default_factory=list)  # work rows open when every job ended
    # workers the liveness sweep found lost: (how many were partitioned, the VMs of the others)
    lost_workers: tuple[int, list[str]] = (0, [])
    side_after: list[str] = field(default_factory=list)
    orphans_after: list[str] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)
    stall_count: int = 0
    waits: str = ""  # workflow task waits (chaos/stalls.py)
    stalls: list[str] = field(default_factory=list)  # chaos/stalls.py
    data_dir: str | None = None  # kept for inspection (on failure or --keep)

    @property
    def passed(self) -> bool:
        return all(check.ok for check in self.checks)

    def states(self) -> Counter[str]:
        return Counter(job.state for job in self.jobs)

    # ------------------------------------------------------------------ rendering

    def headline(self) -> list[str]:
        states = self.states()
        order = ["completed", "failed", "cancelled", "open"]
        parts = [f"{s} {states[s]}" for s in order if states[s]]
        parts += [f"{s} {n}" for s, n in sorted(states.items()) if s not in order]
        fired = f"{self.fault_rules_fired}/{self.fault_rules} rules fired"
        fired += f" on {self.fault_hits} call(s)"
        kinds = Counter(job.role.split(";")[0] for job in self.jobs)
        return [
            f"jobs: {len(self.jobs)} submitted; by terminal state: {', '.join(parts) or 'none'}",
            f"  by role: {_counts(kinds)}",
            f"faults: {fired}; planned by effect: {_counts(self.faults_by_effect)}",
            f"  fired by effect: {_counts(self.fired_by_effect)}",
            f"  fired by primitive: {_counts(self.fired_by_primitive)}",
            f"  fired error/lost_response kinds: {_counts(self.fired_kinds)}",
            f"  every-kind deck: {self.deck_size - len(self.deck_not_fired)}/{self.deck_size}"
            " fired"
            + (f" (never fired: {'; '.join(self.deck_not_fired)})" if self.deck_not_fired else ""),
            f"cloud calls: {_counts(self.calls)}",
            f"disruptions: worker SIGKILLs {self.kills_done}/{self.kills_requested}, "
            f"dev server restarts {self.restarts_done}/{self.restarts_requested}, "
            f"unplanned worker exits {self.unplanned_worker_exits}, "
            f"client RPC retries {self.rpc_retries}",
            f"workers lost by the liveness sweep: {self.lost_workers[0]} partitioned, "
            f"{len(self.lost_workers[1])} other(s)",
            f"before the reconcile pass: live instances {len(self.live_before_reconcile)}, "
            f"live side resources {len(self.side_before_reconcile)}, "
            f"open orphans {len(self.orphans_before_reconcile)}",
            f"reconcile pass: {self.reconcile}",
            f"orphans the pass resolved: {len(self.orphans_resolved)} of "
            f"{len(self.orphans_before_reconcile)}; their machines live before it and gone "
            f"after: {sum(1 for orphan in self.orphans_resolved if orphan.machine_removed)}",
            *(f"  {orphan.describe()}" for orphan in self.orphans_resolved[:40]),
            f"workflow task waits: {self.waits or 'not measured'}",
            f"elapsed: {self.elapsed:.1f}s",
        ]

    def text(self) -> str:
        lines = [
            f"== chaos summary: seed {self.seed}, {self.jobs_requested} jobs, "
            f"{self.kills_requested} worker kill(s), "
            f"{self.restarts_requested} server restart(s) ==",
            f"command: {self.command}",
            *self.headline(),
            "checks:",
        ]
        for check in self.checks:
            lines.append(f"  [{'PASS' if check.ok else 'FAIL'}] {check.name}: {check.value}")
            lines += [f"      {line}" for line in check.detail[:40]]
            if len(check.detail) > 40:
                lines.append(f"      ... {len(check.detail) - 40} more")
        if self.reconcile_detail:
            lines.append("reconcile report:")
            lines += [f"  {line}" for line in self.reconcile_detail]
        if self.stalls:
            lines.append(f"stalls ({self.stall_count} activity steps that waited for a retry):")
            lines += [f"  {line}" for line in self.stalls]
        reasons = self.failure_reasons()
        if reasons:
            lines.append("why jobs failed (first line of each job's error, counted):")
            lines += [f"  {n} x {reason}" for reason, n in reasons]
        roles = [job for job in self.jobs if job.role != "lease" or job.notes or job.cancel]
        if roles:
            lines.append("jobs other than plain leases (role: what happened):")
            for job in roles[:60]:
                said = "; ".join(filter(None, [job.cancel and f"cancel {job.cancel}", *job.notes]))
                lines.append(f"  {job.name} {job.state} ({job.role}): {said[:400] or '-'}")
            if len(roles) > 60:
                lines.append(f"  ... {len(roles) - 60} more (see --out)")
        if self.findings:
            lines.append("findings (not fatal on their own):")
            lines += [f"  - {finding}" for finding in self.findings]
        if self.data_dir:
            lines.append(f"run directory kept: {self.data_dir}")
        lines.append(f"RESULT: {'PASS' if self.passed else 'FAIL'}")
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = [
            f"### Chaos run: seed {self.seed}, {self.jobs_requested} jobs — "
            f"{'PASS' if self.passed else 'FAIL'}",
            "",
            "```",
            self.command,
            "```",
            "",
            "| check | result | value |",
            "|---|---|---|",
        ]
        for check in self.checks:
            lines.append(f"| {check.name} | {'PASS' if check.ok else '**FAIL**'} | {check.value} |")
        lines += ["", "```", *self.headline(), "```"]
        failing = [check for check in self.checks if not check.ok and check.detail]
        if failing:
            lines += ["", "Failures:", ""]
            for check in failing:
                lines.append(f"- {check.name}:")
                lines += [f"  - `{line}`" for line in check.detail[:40]]
        if self.findings:
            lines += ["", "Findings (not fatal on their own):", ""]
            lines += [f"- {finding}" for finding in self.findings]
        if self.reconcile_detail:
            lines += ["", "Reconcile report:", "", "```", *self.reconcile_detail, "```"]
        if self.stalls:
            lines += ["", f"Stalls: {self.stall_count} activity step(s) waited for a retry:", ""]
            lines += ["```", *self.stalls, "```"]
        reasons = self.failure_reasons()
        if reasons:
            lines += ["", "Why jobs failed (first line of the job's error, counted):", ""]
            lines += [f"- {n} x `{reason}`" for reason, n in reasons]
        if self.jobs:
            lines += ["", "<details><summary>Every job</summary>", ""]
            lines += ["| job | role | nodes | state | faults aimed at it | attempts | notes |"]
            lines += ["|---|---|---|---|---|---|---|"]
            for job in self.jobs:
                notes = [f"cancel: {job.cancel}"] if job.cancel else []
                if job.state == "failed":
                    notes.append(f"error: {_reason(job.error)}")
                notes += [f"leak: {leak}" for leak in job.leaks]
                notes += job.notes
                lines.append(
                    f"| {job.name} | {_cell(job.role)} | {job.nodes} | {job.state} | "
                    f"{_cell('; '.join(job.faults) or '-')} | "
                    f"{_cell('; '.join(job.attempts) or '-')} | {_cell('; '.join(notes) or '-')} |"
                )
            lines += ["", "</details>"]
        if self.timeline:
            lines += ["", "<details><summary>Timeline</summary>", "", "```"]
            lines += self.timeline
            lines += ["```", "", "</details>"]
        return "\n".join(lines) + "\n"

    def failure_reasons(self) -> list[tuple[str, int]]:
        reasons = Counter(_reason(job.error) for job in self.jobs if job.state == "failed")
        return reasons.most_common(15)


def _cell(text: str, limit: int = 400) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {n}" for key, n in sorted(counts.items())) or "none"


def _reason(error: str | None) -> str:
    first = (error or "no error recorded").strip().splitlines()[0]
    return first[:140]
