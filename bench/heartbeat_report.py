"""The heartbeat scenario's section of the report and its target (bench/heartbeats.py)."""

from __future__ import annotations

from bench.heartbeats import HeartbeatRun, Phase

DEFAULT_NODES = 1000
DEFAULT_INTERVAL = 30.0  # [workers] heartbeat_interval_seconds
MAX_CORE_SHARE = 0.10


def milliseconds(seconds: float | None) -> str:
    """Seconds shown as milliseconds, one decimal; "-" for none."""
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _row(label: str, phase: Phase | None) -> list[str]:
    if phase is None:
        return [label, "-", "-", "-", "-", "-", "-", "-"]
    offered = f"{phase.offered:.1f}" if phase.offered is not None else "as fast as answered"
    errors = ", ".join(f"{kind}: {n}" for kind, n in sorted(phase.errors.items())) or "none"
    return [
        label,
        str(phase.agents),
        f"{offered} / {phase.rate:.1f}",
        f"{milliseconds(phase.p50)} / {milliseconds(phase.p99)}",
        f"{phase.api_cpu:.2f}",
        milliseconds(phase.cpu_per_request),
        f"{phase.core_share:.1%}",
        errors,
    ]


def default_share(run: HeartbeatRun) -> tuple[float | None, bool]:
    """(share of one core for 1000 nodes at the default interval, whether it was measured
    there rather than computed from the CPU per heartbeat at another rate)."""
    paced = run.paced
    if paced is None or paced.cpu_per_request is None:
        return None, False
    if (run.agents, run.interval) == (DEFAULT_NODES, DEFAULT_INTERVAL):
        return paced.core_share, True
    return paced.cpu_per_request * DEFAULT_NODES / DEFAULT_INTERVAL, False


def section(run: HeartbeatRun | None) -> list[str]:
    lines = ["## Heartbeats: one API process", ""]
    if run is None:
        return lines + ["Not measured.", ""]
    lines += [
        f"{run.agents} agents against `gpuprov api` in its own process (SQLite, loopback), the "
        "load from another process: on connections kept open between requests, as the agent "
        "keeps them, or on a new connection per request, as it made them before. Paced phases: "
        f"every agent once per {run.interval:g} s for {run.seconds:g} s; unpaced: "
        f"{run.unpaced.agents if run.unpaced else '-'} agents sending back to back for "
        f"{run.burst_seconds:g} s. CPU is the API process's (/proc/<pid>/stat) over each phase.",
        "",
    ]
    if run.error:
        lines += [f"**Failed:** {run.error}", ""]
    header = [
        "phase",
        "agents",
        "per second offered / answered",
        "p50 / p99 ms",
        "API CPU s",
        "API CPU ms per request",
        "share of one core",
        "errors",
    ]
    every = f"paced every {run.interval:g} s"
    rows = [
        _row(f"GET /v1/health, new connections (the floor), {every}", run.floor),
        _row(f"GET /v1/health, kept connections, {every}", run.floor_kept),
        _row(f"heartbeats, new connections (before), {every}", run.paced_new_connections),
        _row(f"heartbeats, kept connections, {every}", run.paced),
        _row("heartbeats, kept connections, unpaced", run.unpaced),
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows] + [""]
    paced, floor = run.paced, run.floor
    if paced and floor and paced.cpu_per_request and floor.cpu_per_request:
        ratio = paced.cpu_per_request / floor.cpu_per_request
        cost = milliseconds(paced.cpu_per_request)
        lines.append(
            f"A heartbeat costs the API {cost} ms of CPU: {ratio:.2f} x "
            "the floor's request (a health check on a new connection), its credential checked "
            "and its row written in a batch's transaction."
        )
    before = run.paced_new_connections
    if paced and before and paced.cpu_per_request and before.cpu_per_request:
        lines.append(
            f"On a new connection per heartbeat it cost {milliseconds(before.cpu_per_request)} ms "
            f"({before.cpu_per_request / paced.cpu_per_request:.1f} x a kept connection's)."
        )
    if run.lost_workers is not None:
        lines.append(
            f"Workers the liveness sweep took for lost after the paced phase: {run.lost_workers}."
        )
    if run.api_peak_rss_mib is not None:
        lines.append(
            f"The API process's peak resident memory, every agent's connection open: "
            f"{run.api_peak_rss_mib:.0f} MiB."
        )
    share, measured = default_share(run)
    if share is not None:
        how = "measured" if measured else "from the CPU per heartbeat above"
        lines.append(
            f"At the default interval ({DEFAULT_INTERVAL:g} s), {DEFAULT_NODES} nodes send "
            f"{DEFAULT_NODES / DEFAULT_INTERVAL:.1f} heartbeats/s: {share:.1%} of one core "
            f"({how})."
        )
    if run.unpaced and run.unpaced.ok:
        lines.append(
            f"Unpaced, the one process answered {run.unpaced.rate:.0f} heartbeats/s: "
            f"{run.unpaced.rate * DEFAULT_INTERVAL:.0f} nodes at the default interval."
        )
    return lines + [""]


def target(run: HeartbeatRun | None) -> tuple[str, str, bool | None]:
    name = f"one API process holds {DEFAULT_NODES} nodes at {DEFAULT_INTERVAL:g} s, < 10% of a core"
    if run is None or run.paced is None:
        return name, "-", None
    share, measured = default_share(run)
    if share is None:
        return name, "-", None
    held = run.paced.held
    how = "" if measured else f" (from {run.agents} agents every {run.interval:g} s)"
    text = f"{share:.1%} of one core{how}, paced load {'held' if held else 'NOT held'}"
    return name, text, held and share < MAX_CORE_SHARE
