"""The billed-idle section of the report (bench/billed_idle.py): GPU-seconds a job pays for
while gpuprov, not the cloud or the work, is the one being waited on."""

from __future__ import annotations

from collections.abc import Callable

from bench.baseline import REQUEST
from bench.billed_idle import NodeIdle
from bench.handover import HandoverRun
from bench.scenarios import OverheadRun
from bench.stats import percentile

LEASE_GPUS = REQUEST.gpus_per_node  # the overhead scenario's nodes


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _spread(nodes: list[NodeIdle], phase: Callable[[NodeIdle], float | None]) -> str:
    values = [value for value in map(phase, nodes) if value is not None]
    return f"{_s(percentile(values, 50))} / {_s(percentile(values, 99))}"


def _gpu_seconds(nodes: list[NodeIdle], gpus: int) -> float | None:
    """The p50 job's GPU-seconds (single-node jobs: a node's total times its GPUs)."""
    totals = [node.total * gpus for node in nodes]
    return percentile(totals, 50)


def _lease_rows(runs: list[OverheadRun]) -> list[str]:
    rows = []
    for run in runs:
        mine = _gpu_seconds(run.idle, LEASE_GPUS)
        theirs = _gpu_seconds(run.baseline_idle, LEASE_GPUS)
        ratio = f"{mine / theirs:.2f}" if mine is not None and theirs else "-"
        cells = [
            str(run.jobs),
            _spread(run.idle, lambda node: node.up),
            _spread(run.idle, lambda node: node.down),
            f"{_s(mine)}",
            _spread(run.baseline_idle, lambda node: node.up),
            _spread(run.baseline_idle, lambda node: node.down),
            f"{_s(theirs)}",
            ratio,
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _worked_rows(runs: list[HandoverRun]) -> list[str]:
    rows = []
    for run in runs:
        nodes = run.idle
        job = sum(node.total for node in nodes) * run.gpus_per_node if nodes else None
        cells = [
            "long poll" if run.long_poll else "polls, as before",
            str(len(nodes)),
            _spread(nodes, lambda node: node.registration),
            _spread(nodes, lambda node: node.placement),
            _spread(nodes, lambda node: node.handover),
            _spread(nodes, lambda node: node.down),
            _s(job),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def section(overhead: list[OverheadRun], handover: list[HandoverRun]) -> list[str]:
    lines = ["## Billed idle: GPU-seconds waiting on gpuprov", ""]
    if not overhead and not handover:
        return lines + ["Not measured.", ""]
    lines += [
        "Per node, from the cloud's answer to its create to the work's start (a leased machine: "
        "the job's ready), less the cloud's own boot; and from the work's end (or the release) "
        "to gpuprov confirming it gone, less the cloud's own delete (its delete call and "
        "delete delay). The calls come from the fake cloud's trace, the rest from the job's "
        "history and rows.",
        "",
    ]
    if overhead:
        lines += [
            f"Single-node jobs that lease an {LEASE_GPUS}-GPU machine (the overhead scenario's, "
            "released at ready), gpuprov and the plain asyncio loop on the same fake cloud; "
            "seconds per node, GPU-seconds per job:",
            "",
            "| jobs at once | gpuprov up p50 / p99 s | down p50 / p99 s | GPU-s per job, p50 | "
            "loop up p50 / p99 s | loop down p50 / p99 s | loop GPU-s per job, p50 | "
            "gpuprov / loop |",
            "|---|---|---|---|---|---|---|---|",
            *_lease_rows(overhead),
            "",
        ]
    if handover:
        lines += [
            f"The hand-over scenario's {handover[0].nodes}-node job, whose nodes run the "
            "simulated agent and the work: up split into registration (boot done to "
            "registered), placement (registered to the work written: waiting for the last "
            "node and the job's steps) and hand-over (written to started); seconds per node, "
            "GPU-seconds for the whole job. The plain loop has no agents: nothing to set "
            "beside these.",
            "",
            "| agent | nodes | registration p50 / p99 s | placement p50 / p99 s | hand-over "
            "p50 / p99 s | down p50 / p99 s | GPU-s for the job |",
            "|---|---|---|---|---|---|---|",
            *_worked_rows(handover),
            "",
        ]
    return lines
