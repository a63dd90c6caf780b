"""The work hand-over scenario's section of the report (bench/handover.py)."""

from __future__ import annotations

from bench.handover import HandoverRun


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def _row(run: HandoverRun) -> list[str]:
    node = sorted(run.node_started_after)
    node_p50 = node[len(node) // 2] if node else None
    rate = f"{run.read_rate:.1f}" if run.read_rate is not None else "-"
    per_node = f"{run.work_reads / run.nodes:.1f}" if run.nodes else "-"
    return [
        "long poll" if run.long_poll else "polls, as before (baseline)",
        str(run.nodes),
        f"{_s(run.p50)} / {_s(run.p99)} / {_s(run.slowest)}",
        _s(run.job_wrote_after),
        f"{_s(node_p50)} / {_s(max(node, default=None))}",
        f"{_s(run.waiting_seconds)}",
        f"{rate} ({per_node} per node)",
        run.error or run.state or "-",
    ]


def section(runs: list[HandoverRun]) -> list[str]:
    lines = ["## Work hand-over", ""]
    if not runs:
        return lines + ["Not measured.", ""]
    lines += [
        f"One {runs[0].nodes}-node job on the fake cloud whose machines run the simulated agent "
        "(it registers through the real API and waits for its work as the node agent does), the "
        "worker and the API in this process on SQLite. Per node, from the last node's "
        "registration to its work's start: the job writing the work (the same for every node), "
        "then the node hearing of it and starting it. GET /v1/work requests are counted from "
        "the first registration until the work was written. The baseline is the agent without "
        "long polls (a read answered at once, asked again after 0.5 s doubling to 5 s), back "
        "to back in the same process.",
        "",
        "| poll | nodes | last registered to started, p50 / p99 / max s | job wrote the work "
        "after, s | node started after the write, p50 / max s | nodes waited, s | "
        "GET /v1/work per s while waiting | outcome |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(_row(run)) + " |" for run in runs]
    return lines + [""]
