"""The two-API-processes scenario's section of the report (bench/api_failover.py)."""

from __future__ import annotations

from bench.api_failover import ApiFailoverRun
from bench.heartbeat_report import milliseconds as _ms


def section(run: ApiFailoverRun | None) -> list[str]:
    lines = ["## Heartbeats: two API processes, one killed", ""]
    if run is None:
        return lines + ["Not measured.", ""]
    lines += [
        f"{run.agents} agents heartbeating every {run.interval:g} s for {run.seconds:g} s "
        "through nginx to two `gpuprov api` processes on one PostgreSQL, on connections they "
        f"keep; the first process got SIGKILL {run.kill_at:g} s in.",
        "",
    ]
    if run.error:
        return lines + [f"**Failed:** {run.error}", ""]
    load = run.load
    after, before = run.after_kill, run.before_kill
    errors = ", ".join(f"{kind}: {n}" for kind, n in sorted((load.errors if load else {}).items()))
    rows = [
        ("heartbeats sent / answered 200", f"{load.sent} / {load.ok}" if load else "-"),
        ("errors the agents saw", errors or "none"),
        ("p50 / p99 ms", f"{_ms(load.p50)} / {_ms(load.p99)}" if load else "-"),
        ("answered by each process before the kill", ", ".join(
            f"{address}: {n}" for address, n in sorted(before.items())) or "-"),
        ("started after the kill", str(after.get("started after the kill", 0))),
        ("… answered by the killed process", str(after.get("answered by the killed process", 0))),
        ("… not answered 200", str(after.get("not answered 200", 0))),
        ("workers not heard from since the kill", str(run.unheard_since_kill)),
        ("workers taken for lost", str(run.lost_workers)),
        ("worker rows (one each)", f"{run.worker_rows} for {run.agents} agents"),
        ("survivor's CPU over the run, s", f"{load.api_cpu:.2f}" if load else "-"),
    ]  # fmt: skip
    lines += ["| measure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    verdict = "every promise kept" if run.held else "**a promise broken**"
    return lines + ["", f"Verdict: {verdict}.", ""]


def target(run: ApiFailoverRun | None) -> tuple[str, str, bool | None]:
    name = "two API processes, one killed: no worker lost, every later heartbeat served"
    if run is None or run.load is None:
        return name, "-" if run is None else f"failed: {run.error}", None
    text = (
        f"{run.agents} agents, {run.lost_workers} lost, "
        f"{run.after_kill.get('started after the kill', 0)} heartbeats after the kill, "
        f"{run.load.sent - run.load.ok} unanswered"
    )
    return name, text, run.held
